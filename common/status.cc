// Status: errno-coded errors with messages that name the failing step.
#include "common/status.h"

#include <cerrno>
#include <cstring>

namespace strata {

Status::Status(int code, std::string message)
    : state_(new State{code == 0 ? EIO : code, std::move(message)}) {}

Status::Status(const Status& other)
    : state_(other.state_ ? new State(*other.state_) : nullptr) {}

Status& Status::operator=(const Status& other) {
  if (this != &other) state_.reset(other.state_ ? new State(*other.state_) : nullptr);
  return *this;
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const { return state_ ? state_->message : "OK"; }

Status Status::Annotate(std::string_view context) const& {
  Status copy(*this);
  return std::move(copy).Annotate(context);
}

Status Status::Annotate(std::string_view context) && {
  if (state_) {
    std::string message(context);
    message += ": ";
    message += state_->message;
    state_->message = std::move(message);
  }
  return std::move(*this);
}

Status ErrnoError(int err, std::string_view what) {
  std::string message(what);
  message += ": ";
  message += std::strerror(err);
  return Status(err, std::move(message));
}

}  // namespace strata
