// The agent: requests in, processes out. This file holds its connections,
// its threads and the reaper; commands are started and pumped in call.cc,
// detached commands live in detached.cc, files and trees move in files.cc.
#include "launcher/agent/agent.h"

#include <fcntl.h>
#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <system_error>
#include <thread>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "launcher/agent/request.h"
#include "launcher/protocol/protocol.h"

namespace strata::launcher {

using nlohmann::json;
using agent::ParseJson;
using agent::SendError;

namespace agent {

Status SendError(int conn, const Status& s) {
  return WriteFrame(conn, Frame::kError, json{{"error", s.ToString()}, {"errno", s.code()}}.dump());
}

Result<json> ParseJson(const std::string& payload) {
  json j = json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error(EINVAL, "agent: request is not a JSON object");
  return j;
}

}  // namespace agent

void Agent::ReapLoop() {
  while (true) {
    uint64_t seen;
    {
      std::lock_guard lock(mu_);
      seen = spawned_;
    }
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      // ECHILD: no children at all (orphans of our children are ours
      // before they are reaped, so none can come). Unless a command is
      // started meanwhile, or within kLinger, this thread ends; the next
      // command starts another.
      std::unique_lock lock(mu_);
      if (spawned_cv_.wait_for(lock, kLinger, [&] { return spawned_ != seen; })) continue;
      reaping_ = false;
      return;
    }
    std::lock_guard lock(mu_);  // taken only after Exec registered its child
    auto it = children_.find(pid);
    if (it != children_.end()) {
      it->second = status;
      cv_.notify_all();
    }
    // Anything else was an orphan reparented to us: reaped, forgotten.
  }
}

int Agent::WaitChild(pid_t pid) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return children_[pid] != -1; });
  int status = children_[pid];
  children_.erase(pid);
  return status;
}


void Agent::HandleConnection(UniqueFd conn) {
  // The agent is the sandbox's init: nothing a request brings (a name that
  // is not UTF-8, memory running out) may end it.
  active_connections_.fetch_add(1);
  try {
    HandleRequest(conn.get());
  } catch (const std::exception& e) {
    SendError(conn.get(), Error(EIO, StrCat("agent: ", e.what()))).IgnoreError();
  }
  // The last call is over: what its buffers took goes back to the kernel
  // (free pages in the middle of the heap too), so an idle sandbox's agent
  // keeps only what it holds.
  if (active_connections_.fetch_sub(1) == 1) ::malloc_trim(0);
}

void Agent::HandleRequest(int fd) {
  UniqueFd conn(::fcntl(fd, F_DUPFD_CLOEXEC, 0));  // (closed here; the caller's copy closes after)
  Frame type;
  std::string payload;
  if (!ReadFrame(conn.get(), &type, &payload).ok()) return;
  auto req = ParseJson(payload.empty() ? "{}" : payload);
  if (!req.ok()) {
    SendError(conn.get(), req.status()).IgnoreError();
    return;
  }
  Status s;
  switch (type) {
    case Frame::kExec: s = Exec(conn.get(), *req); break;
    case Frame::kPut: s = Put(conn.get(), *req); break;
    case Frame::kGet: s = Get(conn.get(), *req); break;
    case Frame::kPing: s = WriteFrame(conn.get(), Frame::kOk, json{{"pid", ::getpid()}, {"version", kAgentProtocolVersion}}.dump()); break;
    case Frame::kAttach: s = Attach(conn.get(), *req); break;
    case Frame::kExecStatus: s = ExecStatus(conn.get(), *req); break;
    case Frame::kListExecs: s = ListExecs(conn.get()); break;
    case Frame::kSignalExec: s = SignalExec(conn.get(), *req); break;
    case Frame::kPutTree: s = PutTree(conn.get(), *req); break;
    case Frame::kGetTree: s = GetTree(conn.get(), *req); break;
    case Frame::kFs: s = Fs(conn.get(), *req); break;
    case Frame::kExecInput: s = ExecInput(conn.get(), *req); break;
    case Frame::kWatch: s = Watch(conn.get(), *req); break;
    case Frame::kShutdown: {
      {
        std::lock_guard lock(mu_);
        shutting_down_ = true;
      }
      ::kill(-1, SIGKILL);  // as PID 1: every other process of the sandbox
      WriteFrame(conn.get(), Frame::kOk, "{}").IgnoreError();
      if (power_off_) power_off_();
      ::_exit(0);
    }
    case Frame::kFreeze:
      if (!freeze_) {
        s = SendError(conn.get(), Error(ENOTSUP, "freeze: only a microVM's agent freezes its upper disk"));
        break;
      }
      s = freeze_(req->value("freeze", true));
      s = s.ok() ? WriteFrame(conn.get(), Frame::kOk, "{}") : SendError(conn.get(), s);
      break;
    case Frame::kIdentity:
      if (!identify_) {
        s = SendError(conn.get(), Error(ENOTSUP, "identity: only a microVM's agent takes one"));
        break;
      }
      s = identify_(*req);
      s = s.ok() ? WriteFrame(conn.get(), Frame::kOk, "{}") : SendError(conn.get(), s);
      break;
    default: s = SendError(conn.get(), Error(EPROTO, "agent: unknown request type"));
  }
  (void)s;  // a failed send means the launcher went away; nothing to tell it
}

Agent::~Agent() {
  std::lock_guard lock(threads_mu_);
  for (auto& t : threads_) t.detach();
}

void Agent::Spawn(std::function<void()> fn) {
  JoinEnded();
  std::lock_guard lock(threads_mu_);
  auto it = threads_.emplace(threads_.end());
  try {
    *it = std::thread([this, it, fn = std::move(fn)] {
      fn();
      std::lock_guard ended_lock(threads_mu_);  // (held by Spawn until *it is set)
      ended_.push_back(it);
      if (ended_fd_) ::eventfd_write(ended_fd_.get(), 1);
    });
  } catch (...) {
    threads_.erase(it);
    throw;
  }
}

void Agent::JoinEnded() {
  std::list<std::thread> ended;
  {
    std::lock_guard lock(threads_mu_);
    for (auto it : ended_) ended.splice(ended.end(), threads_, it);
    ended_.clear();
  }
  for (auto& t : ended) t.join();  // (each has only its exit left)
}

void Agent::ServeConnection(UniqueFd conn) {
  {
    std::lock_guard lock(connections_mu_);
    if (waiting_connections_.size() < idle_connection_threads_) {
      waiting_connections_.push_back(conn.release());
      connections_cv_.notify_one();
      return;
    }
  }
  Spawn([this, fd = conn.release()] { ConnectionThread(UniqueFd(fd)); });
}

void Agent::ConnectionThread(UniqueFd conn) {
  while (true) {
    HandleConnection(std::move(conn));
    std::unique_lock lock(connections_mu_);
    ++idle_connection_threads_;
    connections_cv_.wait_for(lock, kLinger, [&] { return !waiting_connections_.empty(); });
    --idle_connection_threads_;
    if (waiting_connections_.empty()) return;
    conn = UniqueFd(waiting_connections_.back());
    waiting_connections_.pop_back();
  }
}

Status Agent::Serve(int listen_fd) {
  if (int flags = ::fcntl(listen_fd, F_GETFL); flags < 0 || ::fcntl(listen_fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return ErrnoError(errno, "agent: make the listening socket non-blocking");
  }
  if (!ended_fd_) return Error(EMFILE, "agent: no eventfd for ended threads");
  while (true) {
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {ended_fd_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "agent: poll");
    }
    if (fds[1].revents & POLLIN) {
      eventfd_t n;
      ::eventfd_read(ended_fd_.get(), &n);
      JoinEnded();
    }
    if (fds[0].revents & (POLLNVAL | POLLERR | POLLHUP)) return Error(EIO, "agent: the listening socket failed");
    if (!(fds[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      return ErrnoError(errno, "agent: accept");
    }
    // Requests come from the node, outside the sandbox's PID namespace
    // (where the peer's pid reads as 0). A process of the sandbox could
    // otherwise reach the socket through /.strata/run and ask for what
    // only the API caller may: an exec without file rules, a shutdown.
    ucred peer{};
    socklen_t len = sizeof peer;
    if (::getpid() == 1 && (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.pid != 0)) {
      SendError(fd, Error(EACCES, "agent: requests come from the node, not from processes in the sandbox")).IgnoreError();
      ::close(fd);
      continue;
    }
    ServeConnection(UniqueFd(fd));
  }
}

}  // namespace strata::launcher
