// Status and Result<T>: strata's one error type.
//
// A Status is either OK (a null pointer, so success costs nothing) or an
// error: an errno value plus a message that names the step and the object,
// e.g. "mount overlay at /run/strata/sb-42: No space left on device".
// Result<T> holds a T or an error Status.
#pragma once

#include <cassert>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace strata {

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(int code, std::string message);
  Status(const Status& other);
  Status& operator=(const Status& other);
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  bool ok() const { return state_ == nullptr; }
  // The errno value of the error; 0 when OK.
  int code() const { return state_ ? state_->code : 0; }
  // The message without the errno text; empty when OK.
  const std::string& message() const;
  // "message" for OK statuses prints as "OK".
  std::string ToString() const;

  // Returns this error with `context` prepended ("context: message");
  // OK stays OK. Use it to add the outer step as an error travels up.
  Status Annotate(std::string_view context) const&;
  Status Annotate(std::string_view context) &&;

  // Marks the status as deliberately ignored.
  void IgnoreError() const {}

 private:
  struct State {
    int code;
    std::string message;
  };
  std::unique_ptr<State> state_;
};

inline Status OkStatus() { return Status(); }
// An error with errno value `code`; the message is used as given.
inline Status Error(int code, std::string message) { return Status(code, std::move(message)); }
// An error for a failed system call: "<what>: <strerror(err)>".
Status ErrnoError(int err, std::string_view what);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::in_place_index<0>, std::move(value)) {}  // NOLINT
  Result(Status status) : v_(std::in_place_index<1>, std::move(status)) {  // NOLINT
    assert(!std::get<1>(v_).ok() && "Result built from an OK Status");
  }

  bool ok() const { return v_.index() == 0; }
  // The error, or an OK status when a value is held.
  Status status() const& { return ok() ? Status() : std::get<1>(v_); }
  Status status() && { return ok() ? Status() : std::move(std::get<1>(v_)); }

  T& value() & { assert(ok()); return std::get<0>(v_); }
  const T& value() const& { assert(ok()); return std::get<0>(v_); }
  T&& value() && { assert(ok()); return std::get<0>(std::move(v_)); }
  T value_or(T fallback) const& { return ok() ? std::get<0>(v_) : std::move(fallback); }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

namespace internal {
inline Status ToStatus(const Status& s) { return s; }
inline Status ToStatus(Status&& s) { return std::move(s); }
template <typename T>
Status ToStatus(const Result<T>& r) { return r.status(); }
template <typename T>
Status ToStatus(Result<T>&& r) { return std::move(r).status(); }
}  // namespace internal

}  // namespace strata

#define STRATA_CONCAT_INNER_(a, b) a##b
#define STRATA_CONCAT_(a, b) STRATA_CONCAT_INNER_(a, b)

// Returns the error of `expr` (a Status or Result) from the current function.
#define STRATA_RETURN_IF_ERROR(expr)                                   \
  do {                                                                 \
    auto&& strata_status_ = (expr);                                    \
    if (!strata_status_.ok())                                          \
      return ::strata::internal::ToStatus(std::move(strata_status_));  \
  } while (0)

// `STRATA_ASSIGN_OR_RETURN(auto x, F());` declares x from F()'s value or
// returns F()'s error.
#define STRATA_ASSIGN_OR_RETURN(lhs, expr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_CONCAT_(strata_result_, __LINE__), lhs, expr)
#define STRATA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()
