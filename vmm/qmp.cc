// QMP is newline-delimited JSON: a greeting, then one answer per command,
// with events interleaved anywhere.
#include "vmm/qmp.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

#include "common/fs.h"
#include "common/strings.h"
#include "common/unix_socket.h"

namespace strata::vmm {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

Result<QmpClient> QmpClient::Connect(const std::string& socket_path, Duration deadline) {
  const auto until = Clock::now() + deadline;
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, ConnectUnix(socket_path));
  QmpClient client(std::move(fd));
  STRATA_ASSIGN_OR_RETURN(std::string greeting, client.ReadLine(until));
  json hello = json::parse(greeting, nullptr, false);
  if (!hello.is_object() || !hello.contains("QMP")) {
    return Error(EPROTO, StrCat("qmp ", socket_path, ": not a QMP greeting: ", greeting.substr(0, 200)));
  }
  auto left = std::chrono::duration_cast<Duration>(until - Clock::now());
  STRATA_RETURN_IF_ERROR(client.Execute("qmp_capabilities", nullptr, std::max(left, Duration(std::chrono::milliseconds(1))))
                             .status()
                             .Annotate("qmp " + socket_path));
  return client;
}

Result<json> QmpClient::Execute(const std::string& command, const json& arguments, Duration timeout) {
  return Run(command, arguments, -1, timeout);
}

Result<json> QmpClient::ExecuteWithFd(const std::string& command, const json& arguments, int fd, Duration timeout) {
  return Run(command, arguments, fd, timeout);
}

Result<json> QmpClient::Run(const std::string& command, const json& arguments, int fd, Duration timeout) {
  json request = {{"execute", command}};
  if (!arguments.is_null()) request["arguments"] = arguments;
  const std::string line = request.dump() + "\n";
  // (QEMU takes a descriptor with the bytes it came with: one sendmsg.)
  STRATA_RETURN_IF_ERROR((fd >= 0 ? SendWithFd(fd_.get(), line, fd) : WriteFull(fd_.get(), line)).Annotate("qmp: send " + command));
  STRATA_ASSIGN_OR_RETURN(json answer, ReadAnswer(Clock::now() + timeout));
  if (answer.contains("error")) {
    return Error(EIO, StrCat("qmp ", command, ": ", answer["error"].value("desc", answer["error"].dump())));
  }
  if (!answer.contains("return")) return Error(EPROTO, StrCat("qmp ", command, ": unexpected answer ", answer.dump()));
  return answer["return"];
}

Result<json> QmpClient::ReadAnswer(Clock::time_point deadline) {
  while (true) {
    STRATA_ASSIGN_OR_RETURN(std::string line, ReadLine(deadline));
    json message = json::parse(line, nullptr, false);
    if (!message.is_object()) return Error(EPROTO, "qmp: not JSON: " + line.substr(0, 200));
    if (message.contains("event")) {
      events_.push_back(std::move(message));
      continue;
    }
    return message;
  }
}

Result<std::string> QmpClient::ReadLine(Clock::time_point deadline) {
  while (true) {
    if (size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty()) continue;
      return line;
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Error(ETIMEDOUT, "qmp: no answer in time");
    pollfd p{fd_.get(), POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno != EINTR) return ErrnoError(errno, "qmp: poll");
    if (n <= 0) continue;
    char chunk[4096];
    ssize_t got = ::read(fd_.get(), chunk, sizeof chunk);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got < 0) return ErrnoError(errno, "qmp: read");
    if (got == 0) return Error(ECONNRESET, "qmp: QEMU closed the connection (it exited)");
    buffer_.append(chunk, static_cast<size_t>(got));
    if (buffer_.size() > (16u << 20)) return Error(EPROTO, "qmp: a message of over 16 MiB");
  }
}

}  // namespace strata::vmm
