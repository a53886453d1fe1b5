// Node-local control sockets: JSON requests and answers in frames.
#include "common/control_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <system_error>

#include "common/frame.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/unix_socket.h"

namespace strata {

using nlohmann::json;

namespace {

enum : uint8_t { kRequest = 1, kAnswer = 2, kError = 3, kHello = 4 };

}  // namespace

Result<std::unique_ptr<ControlServer>> ControlServer::ListenUnix(const std::string& socket_path, mode_t mode,
                                                                 ControlHandler handler, int protocol) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd listener, strata::ListenUnix(socket_path, mode));
  return Start(std::move(listener), socket_path, std::move(handler), protocol, /*owns_path=*/true);
}

Result<std::unique_ptr<ControlServer>> ControlServer::Serve(UniqueFd listener, std::string socket_path,
                                                            ControlHandler handler, int protocol) {
  return Start(std::move(listener), std::move(socket_path), std::move(handler), protocol, /*owns_path=*/false);
}

Result<std::unique_ptr<ControlServer>> ControlServer::Start(UniqueFd listener, std::string socket_path,
                                                            ControlHandler handler, int protocol, bool owns_path) {
  std::unique_ptr<ControlServer> server(new ControlServer());
  int wake[2];
  if (::pipe2(wake, O_CLOEXEC) != 0) return ErrnoError(errno, "control socket: pipe");
  server->wake_[0] = UniqueFd(wake[0]);
  server->wake_[1] = UniqueFd(wake[1]);
  server->socket_path_ = std::move(socket_path);
  server->handler_ = std::move(handler);
  server->protocol_ = protocol;
  server->owns_path_ = owns_path;
  server->listener_ = std::move(listener);
  // Polled, then accepted: a caller that gave up in between must not block
  // the acceptor (and so the server's end).
  ::fcntl(server->listener_.get(), F_SETFL, ::fcntl(server->listener_.get(), F_GETFL) | O_NONBLOCK);
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

void ControlServer::StopAccepting() {
  stopping_ = true;
  // Not shutdown(2): a listener handed over stays open for the next server.
  ssize_t w = ::write(wake_[1].get(), "x", 1);
  (void)w;
  if (acceptor_.joinable()) acceptor_.join();
}

void ControlServer::Drain() {
  StopAccepting();
  std::unique_lock lock(mu_);
  idle_.wait(lock, [&] { return running_ == 0; });
}

ControlServer::~ControlServer() {
  StopAccepting();
  std::unique_lock lock(mu_);
  // Callers still connected get their connection ended: a handler waiting
  // on one returns at once (a running mount still finishes).
  for (int fd : live_) ::shutdown(fd, SHUT_RDWR);
  idle_.wait(lock, [&] { return running_ == 0; });
  if (owns_path_) ::unlink(socket_path_.c_str());
}

void ControlServer::AcceptLoop() {
  while (!stopping_) {
    pollfd fds[2] = {{listener_.get(), POLLIN, 0}, {wake_[0].get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;
    if (stopping_ || (fds[1].revents & POLLIN)) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      if (stopping_) return;
      // Out of descriptors or memory: say so, and go on once there may be some.
      STRATA_LOG(kError) << "control socket " << socket_path_ << ": accept: " << std::strerror(errno);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    UniqueFd conn(fd);
    if (stopping_) return;
    // A caller that stalls cannot hold a handler (and so the server's
    // shutdown) for long: it has this long to send and to take the answer.
    timeval tv{30, 0};
    ::setsockopt(conn.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(conn.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    std::lock_guard lock(mu_);
    try {
      std::thread([this, c = std::make_shared<UniqueFd>(std::move(conn))] {
        Answer(c->get());
        std::lock_guard done(mu_);
        live_.erase(c->get());
        c->reset();  // closed while no shutdown can aim at its number
        if (--running_ == 0) idle_.notify_all();
      }).detach();
      live_.insert(fd);
      ++running_;
    } catch (const std::system_error& e) {
      STRATA_LOG(kError) << "control socket " << socket_path_ << ": no thread for a connection: " << e.what();
    }
  }
}

void ControlServer::Answer(int conn) {
  ControlRequest request;
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    request.peer_uid = cred.uid;
    request.peer_gid = cred.gid;
    request.peer_pid = cred.pid;
  }
  uint8_t type = 0;
  std::string payload;
  Result<json> answer = Error(EPROTO, "control socket: malformed request");
  if (!ReadFrame(conn, &type, &payload).ok()) return;
  int theirs = 0;  // none: an older client, whose first frame is its request
  if (type == kHello) {
    // The caller's version first, and ours back, before it sends anything
    // that could act: releases that differ stop here.
    json hello = json::parse(payload, nullptr, false);
    theirs = hello.is_object() ? hello.value("protocol", 0) : 0;
    if (!WriteFrame(conn, kHello, json{{"protocol", protocol_}, {"pid", ::getpid()}}.dump()).ok()) return;
    if (theirs != protocol_ || !ReadFrame(conn, &type, &payload).ok()) return;
  }
  if (type == kRequest) {
    json j = json::parse(payload, nullptr, false);
    if (theirs != protocol_) {
      answer = Error(EPROTO, StrCat("control socket ", socket_path_, " speaks protocol ", protocol_, "; the caller speaks ",
                                    theirs ? std::to_string(theirs) : std::string("none (an older release)"),
                                    ": run client and daemon of one release"));
    } else if (j.is_object() && j.contains("op") && j["op"].is_string()) {
      request.op = j["op"].get<std::string>();
      request.args = j.contains("args") && j["args"].is_object() ? j["args"] : json::object();
      try {
        answer = handler_(request);
      } catch (const std::exception& e) {
        answer = Error(EIO, StrCat(request.op, ": ", e.what()));
      }
    }
  }
  // Names need not be UTF-8: such bytes become U+FFFD rather than an exception.
  auto text = [](const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); };
  if (answer.ok()) {
    WriteFrame(conn, kAnswer, text(*answer)).IgnoreError();
  } else {
    WriteFrame(conn, kError, text({{"error", answer.status().ToString()}, {"errno", answer.status().code()}})).IgnoreError();
  }
}

Result<json> ControlCall(const std::string& socket_path, std::string_view op, const json& args, Duration timeout,
                         int protocol) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, ConnectUnix(socket_path, timeout));
  uint8_t type = 0;
  std::string payload;
  auto read = [&]() -> Status {
    Status s = ReadFrame(fd.get(), &type, &payload);
    if (s.ok()) return s;
    if (s.code() == EAGAIN) return Error(ETIMEDOUT, StrCat(op, " on ", socket_path, ": no answer in time"));
    if (s.code() == ENODATA || s.code() == ECONNRESET || s.code() == EPIPE) {
      return Error(ECONNRESET, StrCat(op, " on ", socket_path, ": the server closed the connection before answering"));
    }
    return s.Annotate(StrCat(op, " on ", socket_path));
  };
  auto write = [&](uint8_t t, const std::string& body) -> Status {
    Status s = WriteFrame(fd.get(), t, body);
    if (s.ok()) return s;
    if (s.code() == EPIPE || s.code() == ECONNRESET) {
      return Error(ECONNRESET, StrCat(op, " on ", socket_path, ": the server closed the connection before answering"));
    }
    return s.Annotate(StrCat(op, " on ", socket_path));
  };
  // Versions first: nothing that acts goes to a server of another release.
  STRATA_RETURN_IF_ERROR(write(kHello, json{{"protocol", protocol}}.dump()));
  STRATA_RETURN_IF_ERROR(read());
  if (type != kHello) {
    // An older server takes the greeting for a malformed request.
    return Error(EPROTO, StrCat(op, " on ", socket_path, ": the server speaks no protocol version (an older release; "
                                "this client speaks ", protocol, "): run client and daemon of one release"));
  }
  json hello = json::parse(payload, nullptr, false);
  const int theirs = hello.is_object() ? hello.value("protocol", 0) : 0;
  if (theirs != protocol) {
    return Error(EPROTO, StrCat(op, " on ", socket_path, ": the server speaks protocol ", theirs, ", this client ", protocol,
                                ": run client and daemon of one release"));
  }
  json request = {{"op", op}, {"args", args.is_object() ? args : json::object()}};
  STRATA_RETURN_IF_ERROR(write(kRequest, request.dump()));
  STRATA_RETURN_IF_ERROR(read());
  json j = json::parse(payload, nullptr, false);
  if (!j.is_object()) return Error(EPROTO, StrCat(op, " on ", socket_path, ": the answer is not a JSON object"));
  if (type == kError) {
    return Error(j.value("errno", EIO), j.value("error", std::string("unknown error")));
  }
  if (type != kAnswer) return Error(EPROTO, StrCat(op, " on ", socket_path, ": unexpected frame type ", int{type}));
  return j;
}

}  // namespace strata
