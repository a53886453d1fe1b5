// The lazyfs supervisor: one process, one thread, a poll loop.
#include "lazyfs/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/unix_socket.h"

namespace strata::lazyfs {

using nlohmann::json;

namespace {
constexpr size_t kMaxMessage = 64 * 1024;
constexpr int kChildFd = 3;  // where the serving process finds its end
}  // namespace

Status SendMessage(int sock, const json& message, int fd) {
  const std::string text = message.dump();
  if (text.size() > kMaxMessage) return Error(EMSGSIZE, "supervisor message too long");
  return SendWithFd(sock, text, fd).Annotate(StrCat("send ", message.value("op", std::string("message")), " to the supervisor link"));
}

Result<json> ReceiveMessage(int sock, UniqueFd* fd) {
  std::string buf(kMaxMessage, '\0');
  iovec iov{buf.data(), buf.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  while ((n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0) {
    if (errno != EINTR) return ErrnoError(errno, "read the supervisor link");
  }
  for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
    if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got;
      std::memcpy(&got, CMSG_DATA(cm) + i * sizeof(int), sizeof got);
      if (fd && !*fd) *fd = UniqueFd(got);
      else ::close(got);
    }
  }
  if (n == 0) return Error(ENODATA, "the supervisor link was closed");
  json j = json::parse(buf.substr(0, static_cast<size_t>(n)), nullptr, false);
  if (!j.is_object() || !j.contains("op") || !j["op"].is_string()) return Error(EPROTO, "malformed supervisor message");
  return j;
}

namespace {

struct Child {
  pid_t pid = -1;
  UniqueFd pidfd;
  UniqueFd sock;
};

Result<Child> Spawn(const SupervisorOptions& o, const std::string& binary) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return ErrnoError(errno, "socketpair");
  UniqueFd mine(pair[0]), theirs(pair[1]);
  std::vector<std::string> args = {binary, "serve", "--supervisor-fd", std::to_string(kChildFd)};
  args.insert(args.end(), o.serve_args.begin(), o.serve_args.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return ErrnoError(errno, "fork the serving process");
  if (pid == 0) {
    // The serving process dies with the supervisor: nobody would keep its
    // connections otherwise.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    if (theirs.get() == kChildFd) {
      ::fcntl(kChildFd, F_SETFD, 0);
    } else {
      ::dup2(theirs.get(), kChildFd);  // dup2 clears close-on-exec
    }
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv(binary.c_str(), argv.data());
    std::fprintf(stderr, "lazyfs: exec %s: %s\n", binary.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  Child c;
  c.pid = pid;
  c.sock = std::move(mine);
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return ErrnoError(errno, "pidfd_open");
  }
  c.pidfd = UniqueFd(pidfd);
  return c;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return StrCat("exited with ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return StrCat("was killed by signal ", WTERMSIG(status), " (", ::strsignal(WTERMSIG(status)), ")");
  return "ended";
}

}  // namespace

int RunSupervisor(const SupervisorOptions& o) {
  bool reported = false;
  auto report = [&](const Status& s) {
    if (reported) return;
    reported = true;
    if (o.ready) o.ready(s);
  };
  auto fail = [&](const Status& s) {
    STRATA_LOG(kError) << "lazyfs: " << s.ToString();
    report(s);
    return 1;
  };
  if (Status s = MakeDirs(o.state_dir, 0700); !s.ok()) return fail(s);
  auto lock = OpenFile(o.state_dir + "/daemon.lock", O_RDWR | O_CREAT, 0600);
  if (!lock.ok()) return fail(lock.status());
  if (::flock(lock->get(), LOCK_EX | LOCK_NB) != 0) {
    return fail(Error(EEXIST, StrCat("another lazyfs daemon holds ", o.state_dir, "/daemon.lock")));
  }
  if (Status s = MakeDirs(Dirname(o.socket_path)); !s.ok()) return fail(s);
  auto listener = ListenUnix(o.socket_path, 0600);
  if (!listener.ok()) return fail(listener.status().Annotate("listen on " + o.socket_path));

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  ::sigprocmask(SIG_BLOCK, &stop_signals, nullptr);
  UniqueFd sigfd(::signalfd(-1, &stop_signals, SFD_CLOEXEC));
  if (!sigfd) return fail(ErrnoError(errno, "signalfd"));

  ::signal(SIGCHLD, SIG_DFL);  // (an inherited SIG_IGN would reap our child for us)
  std::map<std::string, SupervisorLink::Kept> kept;
  std::string binary = o.binary, good_binary, next_binary, last_error;
  int generation = 0, restarts = 0, quick_deaths = 0;
  bool stopping = false;
  // Waits `delay` unless a stop signal comes first (then true).
  auto stop_during = [&](std::chrono::milliseconds delay) {
    pollfd pf{sigfd.get(), POLLIN, 0};
    return ::poll(&pf, 1, static_cast<int>(delay.count())) > 0;
  };

  while (true) {
    auto child = Spawn(o, binary);
    if (!child.ok()) {
      if (generation == 0) return fail(child.status());
      // Out of processes or memory for a moment: the mounts wait, we retry.
      STRATA_LOG(kError) << "lazyfs: " << child.status().ToString() << "; retrying in 1 s";
      if (stop_during(std::chrono::seconds(1))) return 1;
      continue;
    }
    const auto started = std::chrono::steady_clock::now();
    bool ready = false, crashed = false;
    int status = 0;
    STRATA_LOG(kInfo) << "lazyfs: supervisor " << ::getpid() << ": serving process " << child->pid << " (" << binary
                      << ", generation " << generation << ")";
    auto handle = [&](const json& msg, UniqueFd fd) {
      const std::string op = msg["op"].get<std::string>();
      if (op == "hello") {
        if (msg.value("protocol", 0) != kSupervisorProtocol) {
          last_error = StrCat(binary, " speaks supervisor protocol ", msg.value("protocol", 0), ", this supervisor ",
                              kSupervisorProtocol);
          STRATA_LOG(kError) << "lazyfs: " << last_error << ": refused";
          ::kill(child->pid, SIGKILL);
          return;
        }
        json welcome = {{"op", "welcome"},      {"protocol", kSupervisorProtocol}, {"generation", generation},
                        {"restarts", restarts}, {"binary", binary},                {"supervisor", ::getpid()},
                        {"last_error", last_error}};
        Status sent = SendMessage(child->sock.get(), welcome);
        if (sent.ok()) sent = SendMessage(child->sock.get(), {{"op", "fd"}, {"name", "control"}}, listener->get());
        for (auto& [name, k] : kept) {
          if (sent.ok()) sent = SendMessage(child->sock.get(), {{"op", "fd"}, {"name", name}, {"meta", k.meta}}, k.fd.get());
        }
        if (sent.ok()) sent = SendMessage(child->sock.get(), {{"op", "fds_done"}});
        if (!sent.ok()) STRATA_LOG(kWarn) << "lazyfs: " << sent.ToString();
      } else if (op == "keep" && fd) {
        kept[msg.value("name", std::string())] = {std::move(fd), msg.value("meta", json::object())};
      } else if (op == "drop") {
        kept.erase(msg.value("name", std::string()));
      } else if (op == "ready") {
        ready = true;
        good_binary = binary;
        report(OkStatus());
      } else if (op == "upgrade") {
        next_binary = msg.value("binary", std::string());
        last_error.clear();
      }
    };
    auto receive = [&] {
      UniqueFd fd;
      auto msg = ReceiveMessage(child->sock.get(), &fd);
      if (!msg.ok()) {
        child->sock.reset();  // closed: the process is going; its exit follows
        return;
      }
      handle(*msg, std::move(fd));
    };
    while (true) {
      // A new binary that does not serve in time is given up for the last
      // good one.
      int timeout_ms = -1;
      const bool trial = !ready && !good_binary.empty() && binary != good_binary;
      if (trial) {
        auto left = std::chrono::seconds(30) - (std::chrono::steady_clock::now() - started);
        timeout_ms = static_cast<int>(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(left).count()));
      }
      pollfd fds[3] = {{sigfd.get(), POLLIN, 0}, {child->pidfd.get(), POLLIN, 0}, {child->sock.get(), POLLIN, 0}};
      const nfds_t n = child->sock ? 3 : 2;
      int polled = ::poll(fds, n, timeout_ms);
      if (polled < 0) {
        if (errno == EINTR) continue;
        return fail(ErrnoError(errno, "poll"));
      }
      if (polled == 0 && trial) {
        last_error = StrCat(binary, " did not serve within 30 s");
        STRATA_LOG(kError) << "lazyfs: " << last_error;
        ::kill(child->pid, SIGKILL);
        continue;
      }
      if (fds[0].revents & POLLIN) {
        signalfd_siginfo info;
        if (::read(sigfd.get(), &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
          STRATA_LOG(kInfo) << "lazyfs: signal " << info.ssi_signo << ": stopping the serving process";
          stopping = true;
          ::kill(child->pid, SIGTERM);
        }
      }
      if (n == 3 && (fds[2].revents & (POLLIN | POLLHUP | POLLERR))) receive();
      if (fds[1].revents & POLLIN) {
        // What it sent before it went counts (an upgrade, a last keep).
        while (child->sock) {
          pollfd pf{child->sock.get(), POLLIN, 0};
          if (::poll(&pf, 1, 0) <= 0) break;
          receive();
        }
        while (::waitpid(child->pid, &status, 0) < 0) {
          if (errno == EINTR) continue;
          crashed = true;  // not ours to know: take it for a crash
          break;
        }
        break;
      }
    }
    const std::string how = crashed ? std::string("ended (waitpid failed)") : DescribeExit(status);
    const bool clean = !crashed && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (stopping || (clean && ready)) {
      STRATA_LOG(kInfo) << "lazyfs: serving process " << child->pid << " " << how << "; supervisor exits";
      return clean ? 0 : 1;
    }
    ++generation;
    if (!crashed && WIFEXITED(status) && WEXITSTATUS(status) == kExitHandover && !next_binary.empty()) {
      STRATA_LOG(kInfo) << "lazyfs: serving process " << child->pid << " handed over; next: " << next_binary;
      binary = std::exchange(next_binary, std::string());
      continue;
    }
    ++restarts;
    if (!ready && !reported) {
      return fail(Error(EIO, StrCat("the serving process ", how, " before it served (", o.state_dir, "/lazyfs.log)")));
    }
    if (!ready && !good_binary.empty() && binary != good_binary) {
      if (last_error.empty() || last_error.find(binary) == std::string::npos) {
        last_error = StrCat(binary, " ", how, " before it served");
      }
      last_error += "; back to " + good_binary;
      STRATA_LOG(kError) << "lazyfs: " << last_error;
      binary = good_binary;
    } else {
      STRATA_LOG(kError) << "lazyfs: serving process " << child->pid << " " << how << "; starting another";
    }
    // One that keeps dying at once is not restarted in a tight loop: the
    // first such death restarts at once, the next after 0.1 s, doubling to 5 s.
    if (std::chrono::steady_clock::now() - started >= std::chrono::seconds(1)) {
      quick_deaths = 0;
    } else if (++quick_deaths > 1) {
      const auto delay = std::min<std::chrono::milliseconds>(
          std::chrono::milliseconds(100 << std::min(quick_deaths - 2, 6)), std::chrono::seconds(5));
      if (stop_during(delay)) {
        STRATA_LOG(kWarn) << "lazyfs: stopped with no serving process; its mounts answer errors now";
        return 1;
      }
    }
  }
}

Result<std::unique_ptr<SupervisorLink>> SupervisorLink::Join(int fd) {
  std::unique_ptr<SupervisorLink> link(new SupervisorLink());
  link->sock_ = UniqueFd(fd);
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  STRATA_RETURN_IF_ERROR(link->Send({{"op", "hello"}, {"protocol", kSupervisorProtocol}, {"pid", ::getpid()}}));
  while (true) {
    UniqueFd got;
    STRATA_ASSIGN_OR_RETURN(json msg, ReceiveMessage(fd, &got));
    const std::string op = msg["op"].get<std::string>();
    if (op == "welcome") {
      link->welcome_ = msg;
    } else if (op == "fd" && got) {
      link->kept_[msg.value("name", std::string())] = {std::move(got), msg.value("meta", json::object())};
    } else if (op == "fds_done") {
      break;
    }
  }
  if (link->welcome_.is_null()) return Error(EPROTO, "the supervisor sent no welcome");
  return link;
}

Status SupervisorLink::Send(const json& message, int fd) {
  std::lock_guard lock(mu_);
  return SendMessage(sock_.get(), message, fd);
}

Status SupervisorLink::Keep(const std::string& name, int fd, const json& meta) {
  return Send({{"op", "keep"}, {"name", name}, {"meta", meta}}, fd);
}
Status SupervisorLink::Drop(const std::string& name) { return Send({{"op", "drop"}, {"name", name}}); }
Status SupervisorLink::Ready() { return Send({{"op", "ready"}}); }
Status SupervisorLink::Upgrade(const std::string& binary) { return Send({{"op", "upgrade"}, {"binary", binary}}); }

}  // namespace strata::lazyfs
