// lazyfs: the node daemon that serves layers lazily, and its clients.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <thread>

#include "cache/object_store.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/mount.h"
#include "common/strings.h"
#include "common/units.h"
#include "lazyfs/client.h"
#include "lazyfs/daemon.h"
#include "lazyfs/supervisor.h"

namespace {

using namespace strata;
using nlohmann::json;

// MOUNTPOINT made absolute: resolved when it exists, else against the
// working directory (the daemon creates it and wants an absolute path).
std::string Absolute(const std::string& path) {
  char abs[PATH_MAX];
  if (::realpath(path.c_str(), abs)) return abs;
  if (!path.empty() && path[0] == '/') return path;
  char cwd[PATH_MAX];
  return ::getcwd(cwd, sizeof cwd) ? JoinPath(cwd, path) : path;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "lazyfs: %s\n", s.ToString().c_str());
  return 1;
}

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// Runs the supervisor (which runs the serving process) until SIGTERM/SIGINT.
// With `background`, forks first and lets the parent return once the first
// serving process serves (or failed).
int RunDaemon(lazyfs::SupervisorOptions supervisor, bool background) {
  int ready[2] = {-1, -1};
  if (background) {
    if (::pipe2(ready, O_CLOEXEC) != 0) return Fail(ErrnoError(errno, "pipe"));
    pid_t pid = ::fork();
    if (pid < 0) return Fail(ErrnoError(errno, "fork"));
    if (pid > 0) {
      ::close(ready[1]);
      std::string message;
      char buf[4096];
      ssize_t n;
      while ((n = ::read(ready[0], buf, sizeof buf)) > 0) message.append(buf, static_cast<size_t>(n));
      if (message == "ok") return 0;
      std::fprintf(stderr, "%s", message.empty() ? "lazyfs: daemon exited before serving\n" : message.c_str());
      return 1;
    }
    ::close(ready[0]);
    ::setsid();
    MakeDirs(supervisor.state_dir, 0700).IgnoreError();
    int null = ::open("/dev/null", O_RDWR);
    int log = ::open((supervisor.state_dir + "/lazyfs.log").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    ::dup2(null, STDIN_FILENO);
    ::dup2(null, STDOUT_FILENO);
    if (log >= 0) ::dup2(log, STDERR_FILENO);
  }
  ::signal(SIGPIPE, SIG_IGN);
  supervisor.ready = [&](const Status& s) {
    std::string message = s.ok() ? std::string("ok") : "lazyfs: " + s.ToString() + "\n";
    if (background) {
      ssize_t w = ::write(ready[1], message.data(), message.size());
      (void)w;
      ::close(ready[1]);
    } else if (!s.ok()) {
      std::fputs(message.c_str(), stderr);
    } else {
      STRATA_LOG(kInfo) << "lazyfs: serving on " << supervisor.socket_path;
    }
  };
  return lazyfs::RunSupervisor(supervisor);
}

// The serving process (`lazyfs serve`): under a supervisor, or alone in the
// foreground (nothing then outlives it). Runs until SIGTERM/SIGINT, or
// until it hands over to a successor.
int RunServe(const lazyfs::DaemonOptions& options) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);  // every thread inherits it; sigwait below takes them
  ::signal(SIGPIPE, SIG_IGN);

  auto daemon = lazyfs::Daemon::Start(options);
  if (!daemon.ok()) {
    std::fprintf(stderr, "lazyfs: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  STRATA_LOG(kInfo) << "lazyfs: serving process " << ::getpid() << " on " << options.socket_path << ", cache "
                    << options.cache_dir;
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    STRATA_LOG(kInfo) << "lazyfs: signal " << sig << ": unmounting and exiting";
    (*daemon)->Stop();
  });
  if ((*daemon)->Wait()) {
    // Replaced: the mounts, the journal and the records stay for the
    // successor, as after a crash, but no request is left half answered.
    (*daemon)->DrainForHandover();
    STRATA_LOG(kInfo) << "lazyfs: serving process " << ::getpid() << " handed over";
    std::fflush(nullptr);
    ::_exit(lazyfs::kExitHandover);
  }
  daemon->reset();
  // The waiter is still in sigwait if Stop came another way; it dies with us.
  waiter.detach();
  return 0;
}

void PrintStats(const json& stats) {
  std::printf("cache %s: %s of %s in %llu chunks; %llu hits, %llu fetches, %llu errors\n",
              stats["cache"]["dir"].get<std::string>().c_str(),
              FormatBytes(stats["cache"]["bytes"].get<uint64_t>()).c_str(),
              FormatBytes(stats["cache"]["capacity"].get<uint64_t>()).c_str(),
              static_cast<unsigned long long>(stats["cache"]["chunks"].get<uint64_t>()),
              static_cast<unsigned long long>(stats["cache"]["hits"].get<uint64_t>()),
              static_cast<unsigned long long>(stats["cache"]["fetches"].get<uint64_t>()),
              static_cast<unsigned long long>(stats["cache"]["fetch_errors"].get<uint64_t>()));
  for (const auto& l : stats["layers"]) {
    std::printf("layer %s (%s %s, %s mode)\n", l["digest"].get<std::string>().c_str(),
                l["kind"].get<std::string>().c_str(), l["name"].get<std::string>().c_str(),
                l.value("mode", "kernel").c_str());
    for (const auto& mp : l["mountpoints"]) std::printf("  mounted at      %s\n", mp.get<std::string>().c_str());
    std::printf("  image           %s (metadata %s)\n", FormatBytes(l["image_bytes"].get<uint64_t>()).c_str(),
                FormatBytes(l["meta_bytes"].get<uint64_t>()).c_str());
    std::printf("  fetched         %s in %llu chunks\n", FormatBytes(l["bytes_fetched"].get<uint64_t>()).c_str(),
                static_cast<unsigned long long>(l["chunks_fetched"].get<uint64_t>()));
    std::printf("  from cache      %s\n", FormatBytes(l["bytes_from_cache"].get<uint64_t>()).c_str());
    std::printf("  blob read       %.2f %%\n", l["blob_fetched_percent"].get<double>());
    std::printf("  fetch latency   p50 %.2f ms, p99 %.2f ms\n", l["fetch_p50_ms"].get<double>(),
                l["fetch_p99_ms"].get<double>());
  }
}

}  // namespace

int main(int argc, char** argv) {
  SetLogTag("lazyfs");
  CLI::App app{"lazyfs: serves layers lazily, through the kernel's EROFS or its own FUSE tree"};
  app.require_subcommand(1);
  app.fallthrough();
  std::string socket = EnvOr("STRATA_LAZYFS_SOCKET", lazyfs::kDefaultSocket);
  app.add_option("--socket", socket, "daemon socket")->capture_default_str();

  lazyfs::DaemonOptions options;
  options.cache_dir = EnvOr("STRATA_CACHE", lazyfs::kDefaultCacheDir);
  std::string cache_size = EnvOr("STRATA_CACHE_SIZE", "10G"), fetch_timeout = "60s", grace = "30s";
  bool foreground = false;
  auto* daemon = app.add_subcommand("daemon", "run the node daemon: a supervisor and its serving process (in the background unless -f)");
  auto* serve = app.add_subcommand("serve", "run the serving process alone, in the foreground (the daemon runs it)");
  for (CLI::App* cmd : {daemon, serve}) {
    cmd->add_option("--cache", options.cache_dir, "chunk cache directory")->capture_default_str();
    cmd->add_option("--cache-size", cache_size, "chunk cache size cap")->capture_default_str();
    cmd->add_option("--fetch-timeout", fetch_timeout, "longest a read waits for a chunk")->capture_default_str();
    cmd->add_option("--grace", grace, "how long an unused layer stays mounted")->capture_default_str();
    cmd->add_option("--node", options.node, "node name for leases (default: host name)");
    cmd->add_flag("--erofs-directio", options.erofs_directio,
                  "kernel mode: EROFS reads blobs with direct I/O (instead of FUSE direct I/O on the blob files)");
  }
  daemon->add_flag("-f,--foreground", foreground, "stay in the foreground");
  serve->add_option("--supervisor-fd", options.supervisor_fd, "the supervisor's link (set by the daemon)");

  std::string binary;
  auto* upgrade = app.add_subcommand("upgrade", "replace the serving process, mounts and all, by a new one (of BINARY)");
  upgrade->add_option("--binary", binary, "the new lazyfs executable (default: the one running)");

  std::string ref, mountpoint, store, mode = "kernel";
  bool record = false, as_json = false;
  auto* mount = app.add_subcommand("mount", "mount a layer read-only (starts the daemon on first use)");
  mount->add_option("REF", ref, "NAME:VERSION or digest")->required();
  mount->add_option("MOUNTPOINT", mountpoint, "where the tree appears")->required();
  mount->add_option("--store", store, "store URL (default: $STRATA_STORE, else /var/lib/strata/store)");
  mount->add_flag("--record", record, "record the extents read, in order, as the layer's access list");
  mount->add_option("--mode", mode, "kernel: the kernel's EROFS; fuse: lazyfs's own EROFS reader over FUSE")
      ->check(CLI::IsMember({"kernel", "fuse"}))
      ->capture_default_str();
  mount->add_option("--cache", options.cache_dir, "cache directory, if this starts the daemon");
  mount->add_option("--cache-size", cache_size, "cache size cap, if this starts the daemon");

  auto* umount = app.add_subcommand("umount", "unmount a layer (also after the daemon died)");
  umount->add_option("MOUNTPOINT", mountpoint, "mount point")->required();

  auto* stats = app.add_subcommand("stats", "per layer: sizes, bytes fetched and from cache, latency");
  stats->add_option("MOUNTPOINT", mountpoint, "only the layer mounted here");
  stats->add_flag("--json", as_json, "print JSON");
  CLI11_PARSE(app, argc, argv);

  if (daemon->parsed() || serve->parsed()) {
    auto size = ParseSize(cache_size);
    if (!size.ok()) return Fail(size.status());
    auto deadline = ParseDuration(fetch_timeout);
    if (!deadline.ok()) return Fail(deadline.status());
    auto grace_d = ParseDuration(grace);
    if (!grace_d.ok()) return Fail(grace_d.status());
    options.socket_path = socket;
    options.cache_size = *size;
    options.fetch_deadline = *deadline;
    options.grace = *grace_d;
    if (GetLogLevel() < LogLevel::kInfo) SetLogLevel(LogLevel::kInfo);
    if (serve->parsed()) return RunServe(options);
    lazyfs::SupervisorOptions supervisor;
    supervisor.socket_path = socket;
    supervisor.state_dir = lazyfs::StateDirFor(socket);
    supervisor.binary = lazyfs::FindLazyfsExecutable();
    supervisor.serve_args = {"--socket", socket, "--cache", options.cache_dir, "--cache-size", cache_size,
                             "--fetch-timeout", fetch_timeout, "--grace", grace};
    if (!options.node.empty()) supervisor.serve_args.insert(supervisor.serve_args.end(), {"--node", options.node});
    if (options.erofs_directio) supervisor.serve_args.push_back("--erofs-directio");
    return RunDaemon(std::move(supervisor), !foreground);
  }

  lazyfs::Client client(socket);
  if (mount->parsed()) {
    std::string mp = Absolute(mountpoint);
    Status s = lazyfs::EnsureDaemon({socket, options.cache_dir, cache_size});
    if (!s.ok()) return Fail(s);
    auto r = client.Call("mount",
                         {{"ref", ref},
                          {"store", cache::DefaultStoreUrl(store)},
                          {"mountpoint", mp},
                          {"record", record},
                          {"mode", mode}});
    if (!r.ok()) return Fail(r.status());
    std::cout << (*r)["digest"].get<std::string>() << "\n";
    return 0;
  }
  if (umount->parsed()) {
    std::string mp = Absolute(mountpoint);
    if (client.Alive()) {
      auto r = client.Call("umount", {{"mountpoint", mp}});
      return r.ok() ? 0 : Fail(r.status());
    }
    // No daemon: whatever is mounted there only answers errors now.
    if (!IsMountPoint(mp)) return Fail(Error(ENOENT, mp + ": nothing is mounted there"));
    Status s = MountPoint::Adopt(mp).Unmount();
    return s.ok() ? 0 : Fail(s);
  }
  if (upgrade->parsed()) {
    const auto start = std::chrono::steady_clock::now();
    auto before = client.Call("health");
    if (!before.ok()) return Fail(before.status());
    auto r = client.Call("upgrade", {{"binary", binary.empty() ? "" : Absolute(binary)}});
    if (!r.ok()) return Fail(r.status());
    const int old_pid = (*r)["pid"].get<int>();
    const std::string wanted = (*r)["binary"].get<std::string>();
    // The successor serves when health answers from another pid.
    while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
      auto h = client.Call("health");
      if (h.ok() && (*h)["pid"].get<int>() != old_pid) {
        const json& sup = (*h)["supervisor"];
        const std::string running = sup.is_object() ? sup.value("binary", std::string()) : "";
        if (running != wanted) {
          return Fail(Error(EIO, StrCat("upgrade to ", wanted, " failed: ", sup.value("last_error", std::string()),
                                        " (serving process ", (*h)["pid"].get<int>(), " runs ", running, ")")));
        }
        std::printf("lazyfs: serving process %d replaced by %d (%s) in %.0f ms\n", old_pid, (*h)["pid"].get<int>(),
                    running.c_str(),
                    std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
        return 0;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return Fail(Error(ETIMEDOUT, "upgrade: no new serving process within 60 s (see the daemon's lazyfs.log)"));
  }
  if (stats->parsed()) {
    auto r = client.Call("stats", mountpoint.empty() ? json::object() : json{{"mountpoint", Absolute(mountpoint)}});
    if (!r.ok()) return Fail(r.status());
    if (as_json) std::cout << r->dump() << "\n";
    else PrintStats(*r);
    return 0;
  }
  return 0;
}
