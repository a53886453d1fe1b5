// TestHttpServer: a small HTTP/1.1 server inside the test process, on a
// loopback port, that serves objects from memory, misbehaves on purpose
// (5xx bursts, 429, connections closed mid-body, stalls, wrong lengths,
// wrong bytes), and records every request it was sent. One thread accepts,
// one thread serves each connection; keep-alive as HTTP/1.1 wants.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "common/units.h"

namespace strata::testing {

class TestHttpServer {
 public:
  struct Request {
    std::string method;
    std::string target;  // path and query as sent
    std::vector<std::pair<std::string, std::string>> headers;  // names lowercased, in order
    std::string body;
    std::optional<std::string> Header(std::string_view name) const;
  };

  struct Reply {
    int status = 200;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;
  };

  enum class FaultKind {
    kStatus,        // answer `status` with a short body (and Retry-After when set)
    kCloseMidBody,  // the headers and half the body, then close
    kStall,         // read the request, then send nothing for `stall`, then close
    kLongLength,    // declare more bytes than follow, then close
    kShortLength,   // declare (and send) half the bytes of the object
    kWrongBytes,    // the right length with one byte flipped
  };
  struct Fault {
    FaultKind kind = FaultKind::kStatus;
    int status = 503;
    Duration stall{0};
    std::string retry_after;
  };

  // Listens on 127.0.0.1 on a free port.
  static Result<std::unique_ptr<TestHttpServer>> Start();
  // Closes every connection (ending stalls) and joins every thread.
  ~TestHttpServer();
  TestHttpServer(const TestHttpServer&) = delete;
  TestHttpServer& operator=(const TestHttpServer&) = delete;

  std::string url() const;  // "http://127.0.0.1:<port>"
  int port() const { return port_; }

  // GET and HEAD of `path` (with Range) serve `data`; other paths are 404.
  void SetObject(const std::string& path, std::string data);
  // The next `count` requests get `fault`, after the faults queued before.
  void AddFault(const Fault& fault, int count = 1);
  // Every request gets `fault` while set.
  void SetFaultAlways(std::optional<Fault> fault);
  // Answers every request with the handler instead of the objects.
  void SetHandler(std::function<Reply(const Request&)> handler);

  int requests() const;
  int connections() const;
  std::vector<Request> TakeRequests();

 private:
  TestHttpServer() = default;
  void AcceptLoop();
  void Serve(int fd);
  // Writes the answer to `request`; false when the connection must close.
  bool Answer(int fd, const Request& request);
  Reply ServeObject(const Request& request);
  std::optional<Fault> NextFault();

  UniqueFd listen_fd_;
  UniqueFd wake_read_, wake_write_;
  int port_ = 0;
  std::thread acceptor_;

  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
  std::vector<int> open_fds_;
  std::map<std::string, std::string> objects_;
  std::deque<std::pair<Fault, int>> faults_;
  std::optional<Fault> fault_always_;
  std::function<Reply(const Request&)> handler_;
  std::vector<Request> requests_;
  int request_count_ = 0;
  int connection_count_ = 0;
};

}  // namespace strata::testing
