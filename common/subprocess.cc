// Child processes through posix_spawn, with pipes drained by poll(2).
#include "common/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <map>
#include <thread>

#include "common/strings.h"

extern char** environ;

namespace strata {

std::string SubprocessResult::Describe() const {
  if (timed_out) return "timed out";
  if (term_signal) return StrCat("killed by signal ", term_signal, " (", strsignal(term_signal), ")");
  return StrCat("exited with status ", exit_code);
}

namespace {

struct Pipe {
  UniqueFd read, write;
};

Result<Pipe> MakePipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoError(errno, "pipe2");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

std::vector<std::string> BuildEnv(const SubprocessOptions& options) {
  std::map<std::string, std::string> vars;
  if (!options.clear_env) {
    for (char** e = environ; *e; ++e) {
      std::string_view kv(*e);
      size_t eq = kv.find('=');
      if (eq != std::string_view::npos) vars[std::string(kv.substr(0, eq))] = std::string(kv);
    }
  }
  for (const auto& kv : options.env) {
    size_t eq = kv.find('=');
    vars[kv.substr(0, eq)] = kv;
  }
  std::vector<std::string> out;
  for (auto& [k, v] : vars) out.push_back(std::move(v));
  return out;
}

// Keeps the last `max` bytes of stderr for error messages.
std::string Tail(const std::string& s, size_t max = 2000) {
  std::string t = s.size() > max ? "..." + s.substr(s.size() - max) : s;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  return t;
}

// write() to a child's stdin without SIGPIPE: a child that closes its
// stdin before reading it all is EPIPE here, whatever the calling
// program's disposition of SIGPIPE (left as it is). The signal is blocked
// for this thread while it writes, and one it raised is taken back.
ssize_t WriteWithoutSigpipe(int fd, const void* data, size_t size) {
  sigset_t pipe_only, old, pending;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  sigpending(&pending);
  const bool already_pending = sigismember(&pending, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  ssize_t w = ::write(fd, data, size);
  const int saved = errno;
  if (w < 0 && saved == EPIPE && !already_pending) {
    timespec now{0, 0};
    while (::sigtimedwait(&pipe_only, nullptr, &now) < 0 && errno == EINTR) {
    }
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved;
  return w;
}

}  // namespace

Result<Subprocess> Subprocess::Start(SubprocessOptions options) {
  if (options.argv.empty()) return Error(EINVAL, "start subprocess: empty argv");
  Subprocess p;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Own process group, so a timeout or destructor kills everything the child started.
  posix_spawnattr_setpgroup(&attr, 0);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<UniqueFd> child_ends;  // closed in the parent after spawn
  Status status;
  auto route = [&](int target, StdStream mode, UniqueFd* parent_end) {
    if (!status.ok()) return;
    if (mode == StdStream::kInherit) return;
    if (mode == StdStream::kFile) {
      const std::string& file = target == STDOUT_FILENO ? options.stdout_file : options.stderr_file;
      posix_spawn_file_actions_addopen(&actions, target, file.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      return;
    }
    if (mode == StdStream::kNull) {
      posix_spawn_file_actions_addopen(&actions, target, "/dev/null", O_RDWR, 0);
      return;
    }
    auto pipe = MakePipe();
    if (!pipe.ok()) {
      status = pipe.status();
      return;
    }
    int child_fd = target == STDIN_FILENO ? pipe->read.get() : pipe->write.get();
    posix_spawn_file_actions_adddup2(&actions, child_fd, target);
    if (target == STDIN_FILENO) {
      *parent_end = std::move(pipe->write);
      child_ends.push_back(std::move(pipe->read));
    } else {
      *parent_end = std::move(pipe->read);
      child_ends.push_back(std::move(pipe->write));
    }
  };
  route(STDIN_FILENO, options.stdin_data ? StdStream::kCapture : StdStream::kNull, &p.stdin_);
  route(STDOUT_FILENO, options.stdout_mode, &p.stdout_);
  route(STDERR_FILENO, options.stderr_mode, &p.stderr_);
  if (!options.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, options.cwd.c_str());
  // Passed descriptors are first copied above their targets, so no dup2
  // onto 3, 4, ... overwrites one still to be passed.
  const int first_free = 3 + static_cast<int>(options.pass_fds.size());
  std::vector<UniqueFd> passed;
  for (size_t i = 0; i < options.pass_fds.size() && status.ok(); ++i) {
    UniqueFd copy(::fcntl(options.pass_fds[i], F_DUPFD_CLOEXEC, first_free));
    if (!copy) status = ErrnoError(errno, StrCat("pass descriptor ", options.pass_fds[i], " to ", options.argv[0]));
    else posix_spawn_file_actions_adddup2(&actions, copy.get(), 3 + static_cast<int>(i));
    passed.push_back(std::move(copy));
  }

  // Nothing else reaches the child, also what was opened without
  // close-on-exec (libcurl's wakeup socket pairs, a library's files).
  if (status.ok()) posix_spawn_file_actions_addclosefrom_np(&actions, first_free);

  if (status.ok()) {
    std::vector<std::string> env = BuildEnv(options);
    std::vector<char*> envp, argv;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    for (auto& a : options.argv) argv.push_back(a.data());
    argv.push_back(nullptr);
    int rc = posix_spawnp(&p.pid_, argv[0], &actions, &attr, argv.data(), envp.data());
    if (rc != 0) {
      p.pid_ = -1;
      status = ErrnoError(rc, StrCat("start ", options.argv[0]));
    }
  }
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  STRATA_RETURN_IF_ERROR(status);
  p.options_ = std::move(options);
  return p;
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : options_(std::move(other.options_)),
      pid_(std::exchange(other.pid_, -1)),
      reaped_status_(other.reaped_status_),
      stdin_(std::move(other.stdin_)),
      stdout_(std::move(other.stdout_)),
      stderr_(std::move(other.stderr_)) {}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    KillAndReap();
    options_ = std::move(other.options_);
    pid_ = std::exchange(other.pid_, -1);
    reaped_status_ = other.reaped_status_;
    stdin_ = std::move(other.stdin_);
    stdout_ = std::move(other.stdout_);
    stderr_ = std::move(other.stderr_);
  }
  return *this;
}

Subprocess::~Subprocess() { KillAndReap(); }

void Subprocess::Kill(int sig) {
  if (pid_ > 0) ::kill(-pid_, sig);
}

bool Subprocess::Running() {
  if (pid_ <= 0 || reaped_status_ != -1) return false;
  int status;
  pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_status_ = status;
    ::kill(-pid_, SIGKILL);  // whatever it left in its group
    return false;
  }
  return true;
}

bool Subprocess::RunningAfter(Duration limit) {
  if (!Running()) return false;
  // A pidfd turns readable when the child exits: no polling interval.
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (Running()) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) return true;
    if (pidfd) {
      pollfd p{pidfd.get(), POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(left, 2)));
    }
  }
  return false;
}

void Subprocess::KillAndReap() {
  if (pid_ <= 0) return;
  ::kill(-pid_, SIGKILL);
  if (reaped_status_ != -1) {
    pid_ = -1;
    return;
  }
  int wstatus;
  while (::waitpid(pid_, &wstatus, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

Result<SubprocessResult> Subprocess::Wait() {
  if (pid_ <= 0) return Error(EINVAL, "wait for subprocess: not running");
  using Clock = std::chrono::steady_clock;
  const bool has_deadline = options_.timeout.count() > 0;
  const auto deadline = Clock::now() + options_.timeout;
  SubprocessResult result;
  const std::string& input = options_.stdin_data ? *options_.stdin_data : std::string();
  size_t input_done = 0;
  if (stdin_ && input.empty()) stdin_.reset();
  if (stdin_) ::fcntl(stdin_.get(), F_SETFL, O_NONBLOCK);

  while (stdin_ || stdout_ || stderr_) {
    pollfd fds[3];
    int n = 0;
    if (stdin_) fds[n++] = {stdin_.get(), POLLOUT, 0};
    if (stdout_) fds[n++] = {stdout_.get(), POLLIN, 0};
    if (stderr_) fds[n++] = {stderr_.get(), POLLIN, 0};
    int wait_ms = -1;
    if (has_deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        result.timed_out = true;
        break;
      }
      wait_ms = static_cast<int>(std::min<int64_t>(left, 1 << 30));
    }
    int rc = ::poll(fds, n, wait_ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, StrCat("poll output of ", options_.argv[0]));
    }
    for (int i = 0; i < n; ++i) {
      if (!fds[i].revents) continue;
      if (stdin_ && fds[i].fd == stdin_.get()) {
        ssize_t w = WriteWithoutSigpipe(stdin_.get(), input.data() + input_done, input.size() - input_done);
        if (w > 0) input_done += static_cast<size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || input_done == input.size()) stdin_.reset();
        continue;
      }
      UniqueFd& fd = stdout_ && fds[i].fd == stdout_.get() ? stdout_ : stderr_;
      std::string& sink = &fd == &stdout_ ? result.out : result.err;
      char buf[65536];
      ssize_t r = ::read(fd.get(), buf, sizeof buf);
      if (r > 0) sink.append(buf, static_cast<size_t>(r));
      else if (r == 0 || (errno != EINTR && errno != EAGAIN)) fd.reset();
    }
  }
  if (result.timed_out) Kill(SIGKILL);

  int wstatus = reaped_status_;
  while (wstatus == -1) {
    if (!has_deadline || result.timed_out) {
      int st;
      if (::waitpid(pid_, &st, 0) >= 0) {
        wstatus = st;
        break;
      }
      if (errno == EINTR) continue;
      return ErrnoError(errno, StrCat("wait for ", options_.argv[0]));
    }
    int st;
    pid_t r = ::waitpid(pid_, &st, WNOHANG);
    if (r == pid_) {
      wstatus = st;
      break;
    }
    if (r < 0 && errno != EINTR) return ErrnoError(errno, StrCat("wait for ", options_.argv[0]));
    if (Clock::now() >= deadline) {
      result.timed_out = true;
      Kill(SIGKILL);
      continue;
    }
    ::usleep(1000);
  }
  pid_ = -1;
  if (WIFEXITED(wstatus)) result.exit_code = WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) result.term_signal = WTERMSIG(wstatus);
  return result;
}

Result<SubprocessResult> RunCommand(SubprocessOptions options) {
  STRATA_ASSIGN_OR_RETURN(Subprocess p, Subprocess::Start(std::move(options)));
  return p.Wait();
}

std::string FindProgram(const std::string& name) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::string_view dirs = path && *path ? path : "/usr/bin:/bin";
  while (true) {
    const size_t colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    if (dir.empty()) dir = ".";
    std::string candidate = dir + "/" + name;
    struct stat st;
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return "";
    dirs.remove_prefix(colon + 1);
  }
}

Result<SubprocessResult> RunChecked(SubprocessOptions options, std::string_view step) {
  std::string name = options.argv.empty() ? "" : options.argv[0];
  auto result = RunCommand(std::move(options));
  if (!result.ok()) return std::move(result).status().Annotate(step);
  if (!result->success()) {
    std::string message = StrCat(step, ": ", name, " ", result->Describe());
    std::string tail = Tail(result->err);
    if (!tail.empty()) message += ": " + tail;
    return Error(result->timed_out ? ETIMEDOUT : EIO, message);
  }
  return result;
}

}  // namespace strata
