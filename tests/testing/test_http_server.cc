// TestHttpServer: plain sockets and a thread per connection, so a fault
// (a stall, a half-sent body) on one connection never holds up another.
#include "tests/testing/test_http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>

#include "common/strings.h"

namespace strata::testing {
namespace {

bool SendAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 416: return "Range Not Satisfiable";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    default: return "Status";
  }
}

std::string Head(int status, const std::vector<std::pair<std::string, std::string>>& headers, size_t length) {
  std::string out = StrCat("HTTP/1.1 ", status, " ", Reason(status), "\r\n");
  for (const auto& [k, v] : headers) out += StrCat(k, ": ", v, "\r\n");
  out += StrCat("Content-Length: ", length, "\r\n\r\n");
  return out;
}

std::string Lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::optional<std::string> TestHttpServer::Request::Header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (k == name) return v;
  }
  return std::nullopt;
}

Result<std::unique_ptr<TestHttpServer>> TestHttpServer::Start() {
  std::unique_ptr<TestHttpServer> server(new TestHttpServer());
  server->listen_fd_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!server->listen_fd_) return ErrnoError(errno, "test http server: socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(server->listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    return ErrnoError(errno, "test http server: bind");
  }
  if (::listen(server->listen_fd_.get(), 128) != 0) return ErrnoError(errno, "test http server: listen");
  socklen_t len = sizeof addr;
  ::getsockname(server->listen_fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  server->port_ = ntohs(addr.sin_port);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return ErrnoError(errno, "test http server: pipe");
  server->wake_read_.reset(pipe_fds[0]);
  server->wake_write_.reset(pipe_fds[1]);
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TestHttpServer::~TestHttpServer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  stop_cv_.notify_all();
  if (wake_write_) (void)!::write(wake_write_.get(), "x", 1);
  if (acceptor_.joinable()) acceptor_.join();
  std::vector<std::thread> workers;
  {
    std::lock_guard lock(mu_);
    for (int fd : open_fds_) ::shutdown(fd, SHUT_RDWR);
    workers.swap(workers_);
  }
  for (auto& t : workers) t.join();
}

std::string TestHttpServer::url() const { return StrCat("http://127.0.0.1:", port_); }

void TestHttpServer::SetObject(const std::string& path, std::string data) {
  std::lock_guard lock(mu_);
  objects_[path] = std::move(data);
}

void TestHttpServer::AddFault(const Fault& fault, int count) {
  std::lock_guard lock(mu_);
  faults_.emplace_back(fault, count);
}

void TestHttpServer::SetFaultAlways(std::optional<Fault> fault) {
  std::lock_guard lock(mu_);
  fault_always_ = std::move(fault);
}

void TestHttpServer::SetHandler(std::function<Reply(const Request&)> handler) {
  std::lock_guard lock(mu_);
  handler_ = std::move(handler);
}

int TestHttpServer::requests() const {
  std::lock_guard lock(mu_);
  return request_count_;
}

int TestHttpServer::connections() const {
  std::lock_guard lock(mu_);
  return connection_count_;
}

std::vector<TestHttpServer::Request> TestHttpServer::TakeRequests() {
  std::lock_guard lock(mu_);
  return std::exchange(requests_, {});
}

std::optional<TestHttpServer::Fault> TestHttpServer::NextFault() {
  if (fault_always_) return fault_always_;
  if (faults_.empty()) return std::nullopt;
  Fault f = faults_.front().first;
  if (--faults_.front().second <= 0) faults_.pop_front();
  return f;
}

void TestHttpServer::AcceptLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_.get(), POLLIN, 0}, {wake_read_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents) return;
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    ++connection_count_;
    open_fds_.push_back(fd);
    workers_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TestHttpServer::Serve(int fd) {
  std::string buffer;
  char chunk[64 * 1024];
  while (true) {
    size_t end;
    while ((end = buffer.find("\r\n\r\n")) == std::string::npos) {
      ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) goto done;
      buffer.append(chunk, static_cast<size_t>(n));
    }
    Request request;
    {
      std::vector<std::string> lines = Split(std::string_view(buffer).substr(0, end), '\n');
      std::vector<std::string> first = Split(lines[0], ' ');
      if (first.size() < 2) goto done;
      request.method = first[0];
      request.target = first[1];
      for (size_t i = 1; i < lines.size(); ++i) {
        std::string line = lines[i];
        if (!line.empty() && line.back() == '\r') line.pop_back();
        size_t colon = line.find(':');
        if (colon == std::string::npos) continue;
        std::string value = line.substr(colon + 1);
        while (!value.empty() && value.front() == ' ') value.erase(0, 1);
        request.headers.emplace_back(Lower(line.substr(0, colon)), value);
      }
    }
    buffer.erase(0, end + 4);
    size_t body_len = std::stoul(request.Header("content-length").value_or("0"));
    if (body_len > buffer.size() && request.Header("expect") == "100-continue" &&
        !SendAll(fd, "HTTP/1.1 100 Continue\r\n\r\n")) {
      break;
    }
    while (buffer.size() < body_len) {
      ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) goto done;
      buffer.append(chunk, static_cast<size_t>(n));
    }
    request.body = buffer.substr(0, body_len);
    buffer.erase(0, body_len);
    if (!Answer(fd, request)) break;
  }
done:
  std::lock_guard lock(mu_);
  open_fds_.erase(std::find(open_fds_.begin(), open_fds_.end(), fd));
  ::close(fd);
}

TestHttpServer::Reply TestHttpServer::ServeObject(const Request& request) {
  std::string path = request.target.substr(0, request.target.find('?'));
  Reply reply;
  std::lock_guard lock(mu_);
  auto it = objects_.find(path);
  if (it == objects_.end()) return Reply{404, {}, "no such object\n"};
  const std::string& data = it->second;
  auto range = request.Header("range");
  if (range && range->starts_with("bytes=")) {
    size_t dash = range->find('-');
    uint64_t first = std::stoull(range->substr(6, dash - 6));
    uint64_t last = std::stoull(range->substr(dash + 1));
    if (first >= data.size()) return Reply{416, {{"Content-Range", StrCat("bytes */", data.size())}}, ""};
    last = std::min<uint64_t>(last, data.size() - 1);
    reply.status = 206;
    reply.headers.emplace_back("Content-Range", StrCat("bytes ", first, "-", last, "/", data.size()));
    reply.body = data.substr(first, last - first + 1);
  } else {
    reply.body = data;
  }
  return reply;
}

bool TestHttpServer::Answer(int fd, const Request& request) {
  std::optional<Fault> fault;
  std::function<Reply(const Request&)> handler;
  {
    std::lock_guard lock(mu_);
    ++request_count_;
    requests_.push_back(request);
    fault = NextFault();
    handler = handler_;
  }
  Reply reply = handler ? handler(request) : ServeObject(request);
  const bool head = request.method == "HEAD";
  if (fault) {
    switch (fault->kind) {
      case FaultKind::kStatus: {
        std::vector<std::pair<std::string, std::string>> headers;
        if (!fault->retry_after.empty()) headers.emplace_back("Retry-After", fault->retry_after);
        std::string body = StrCat("injected ", fault->status, "\n");
        return SendAll(fd, Head(fault->status, headers, body.size()) + (head ? "" : body));
      }
      case FaultKind::kCloseMidBody:
        SendAll(fd, Head(reply.status, reply.headers, reply.body.size()) + reply.body.substr(0, reply.body.size() / 2));
        return false;
      case FaultKind::kStall: {
        std::unique_lock lock(mu_);
        stop_cv_.wait_for(lock, fault->stall, [&] { return stopping_; });
        return false;
      }
      case FaultKind::kLongLength:
        SendAll(fd, Head(reply.status, reply.headers, reply.body.size() + 100) + reply.body);
        return false;
      case FaultKind::kShortLength: {
        size_t half = reply.body.size() / 2;
        SendAll(fd, Head(reply.status, reply.headers, half) + reply.body.substr(0, half));
        return true;
      }
      case FaultKind::kWrongBytes:
        if (!reply.body.empty()) reply.body[reply.body.size() / 3] ^= 0x20;
        break;
    }
  }
  return SendAll(fd, Head(reply.status, reply.headers, reply.body.size()) + (head ? "" : reply.body));
}

}  // namespace strata::testing
