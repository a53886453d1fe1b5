// QmpClient: QEMU's machine protocol (QMP) over its unix socket: JSON
// commands and answers, with the asynchronous events QEMU sends between
// them kept for the caller.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/unique_fd.h"
#include "common/units.h"

namespace strata::vmm {

class QmpClient {
 public:
  // Connects to `socket_path`, reads QEMU's greeting and enters command
  // mode, all within `deadline`. ECONNREFUSED when nothing listens (QEMU
  // is gone), ETIMEDOUT when it never greets.
  static Result<QmpClient> Connect(const std::string& socket_path, Duration deadline);

  // Runs `command` with `arguments` (null: none) and returns its "return"
  // value; a QEMU error comes back as EIO with QEMU's description, a
  // closed socket as ECONNRESET, no answer within `timeout` as ETIMEDOUT.
  // Not thread-safe: one caller at a time.
  Result<nlohmann::json> Execute(const std::string& command, const nlohmann::json& arguments = nullptr,
                                 Duration timeout = std::chrono::seconds(10));
  // The same with descriptor `fd` sent along (SCM_RIGHTS), as QMP's
  // getfd and add-fd take one.
  Result<nlohmann::json> ExecuteWithFd(const std::string& command, const nlohmann::json& arguments, int fd,
                                       Duration timeout = std::chrono::seconds(10));
  // The events (their "event" names and data) received so far.
  const std::vector<nlohmann::json>& events() const { return events_; }

 private:
  explicit QmpClient(UniqueFd fd) : fd_(std::move(fd)) {}
  Result<nlohmann::json> Run(const std::string& command, const nlohmann::json& arguments, int fd, Duration timeout);
  // The next message that is not an event (events are kept).
  Result<nlohmann::json> ReadAnswer(std::chrono::steady_clock::time_point deadline);
  // The next whole line, waiting until `deadline`.
  Result<std::string> ReadLine(std::chrono::steady_clock::time_point deadline);

  UniqueFd fd_;
  std::string buffer_;
  std::vector<nlohmann::json> events_;
};

}  // namespace strata::vmm
