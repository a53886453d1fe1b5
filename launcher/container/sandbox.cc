// Sandbox: compose, start, run, tear down.
#include "launcher/container/sandbox.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/unix_socket.h"
#include "launcher/container/seccomp.h"
#include "launcher/net/netns.h"
#include "lazyfs/client.h"
#include "vmm/guest_files.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

// The spec as state.json keeps it (Adopt reads it back).
json SpecState(const SandboxSpec& spec) {
  return {{"layers", spec.layers},
          {"backend", spec.backend},
          {"cpus", spec.limits.cpus},
          {"memory", spec.limits.memory},
          {"pids", spec.limits.pids},
          {"disk", spec.disk},
          {"network", spec.network.ToJson()},
          {"env", spec.env},
          {"workdir", spec.workdir},
          {"files", spec.files.ToJson()},
          {"kill_leftovers", spec.kill_leftovers}};
}

}  // namespace

std::string NewSandboxId(std::string_view node) {
  static std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
                             static_cast<uint64_t>(::getpid())};
  static std::mutex mu;
  std::lock_guard lock(mu);
  char buf[16];
  std::snprintf(buf, sizeof buf, "%012llx", static_cast<unsigned long long>(rng() & 0xffffffffffffULL));
  return node.empty() ? StrCat("sb-", buf) : StrCat("sb-", node, "-", buf);
}

std::string SandboxIdNode(std::string_view id) {
  if (!id.starts_with("sb-")) return "";
  id.remove_prefix(3);
  const size_t dash = id.rfind('-');
  if (dash == std::string_view::npos || dash == 0 || id.size() - dash - 1 != 12) return "";
  return std::string(id.substr(0, dash));
}

Status CheckNodeName(std::string_view name) {
  auto fine = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; };
  if (name.empty() || name.size() > 20 || name.front() == '-' || name.back() == '-' ||
      !std::all_of(name.begin(), name.end(), fine)) {
    return Error(EINVAL, "node name " + Quote(name) + ": 1 to 20 of a-z, 0-9 and '-' (not first or last)");
  }
  return OkStatus();
}

namespace {

std::string SelfDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  return Dirname(buf);
}

bool ProcessAlive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

// The runtime works on the rootfs as the sandbox's mapped root, which must
// be able to reach it: every directory above needs search permission.
Status CheckTraversable(const std::string& dir, uid_t uid) {
  for (std::string p = dir; p != "/" && p != "."; p = Dirname(p)) {
    struct stat st;
    if (::stat(p.c_str(), &st) != 0) return ErrnoError(errno, "stat " + p);
    bool ok = (st.st_uid == uid && (st.st_mode & S_IXUSR)) || (st.st_mode & S_IXOTH);
    if (!ok) {
      return Error(EACCES, StrCat("sandbox directory ", dir, ": the sandbox's root (host uid ", uid, ") cannot enter ", p,
                                  "; allow it with `chmod o+x ", p, "`"));
    }
  }
  return OkStatus();
}

// The hierarchies (cgroup v1) in which the commands get a cgroup of their
// own below the sandbox's when the caller set a limit there, with that
// limit; the sandbox's has it plus the agent's reserve (docs/security.md).
const char* const kCommandControllers[] = {"pids", "memory"};
constexpr const char* kCommandCgroup = "commands";

const char* const kControllers[] = {"memory", "cpu", "cpuacct", "cpuset", "pids", "devices", "freezer", "blkio",
                                    "hugetlb", "systemd", "unified", "net_cls", "net_prio", "perf_event", "rdma", "misc"};

// Removes the sandbox's cgroups in every hierarchy (the runtime normally
// has): whatever still runs inside is a leftover of this sandbox and is
// killed first; a cgroup stays busy until its last process is reaped. The
// commands' cgroup goes before the sandbox's.
void RemoveCgroups(const std::string& relative) {
  std::vector<std::string> dirs;
  for (const char* c : kCommandControllers) dirs.push_back(StrCat("/sys/fs/cgroup/", c, "/", relative, "/", kCommandCgroup));
  for (const char* c : kControllers) dirs.push_back(StrCat("/sys/fs/cgroup/", c, "/", relative));
  if (::access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0) dirs.push_back("/sys/fs/cgroup/" + relative);  // pure v2
  for (const auto& dir : dirs) {
    if (::access(dir.c_str(), F_OK) != 0) continue;
    std::ifstream procs(dir + "/cgroup.procs");
    pid_t pid;
    while (procs >> pid) ::kill(pid, SIGKILL);
    for (int i = 0; i < 100 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

}  // namespace

void KillRuntimeStragglers(const std::string& bundle) {
  DIR* proc = ::opendir("/proc");
  if (!proc) return;
  while (dirent* e = ::readdir(proc)) {
    pid_t pid = static_cast<pid_t>(std::strtol(e->d_name, nullptr, 10));
    if (pid <= 0 || pid == ::getpid()) continue;
    auto cmdline = ReadFileToString(StrCat("/proc/", pid, "/cmdline"));
    if (!cmdline.ok()) continue;
    std::vector<std::string> argv = Split(*cmdline, '\0');
    for (size_t i = 0; i + 1 < argv.size(); ++i) {
      if (argv[i] == "--bundle" && argv[i + 1] == bundle) {
        STRATA_LOG(kWarn) << "killing runtime process " << pid << " still creating " << bundle;
        ::kill(pid, SIGKILL);
        break;
      }
    }
  }
  ::closedir(proc);
}

namespace {

Status ReleaseLayers(lazyfs::Client& client, const std::string& holder, const std::vector<Digest128>& digests) {
  json list = json::array();
  for (const auto& d : digests) list.push_back(d.Hex());
  auto r = client.Call("release", {{"digests", list}, {"holder", holder}});
  if (!r.ok() && r.status().code() != ENOENT) return r.status().Annotate("release layers");
  return OkStatus();
}

}  // namespace

NodeConfig NodeConfig::FromEnvironment() {
  NodeConfig n;
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v && *v ? v : "";
  };
  if (auto v = env("STRATA_RUN_DIR"); !v.empty()) n.run_dir = v;
  if (auto v = env("STRATA_UPPERS"); !v.empty()) n.uppers = v;
  if (auto v = env("STRATA_LAZYFS_SOCKET"); !v.empty()) n.lazyfs_socket = v;
  if (auto v = env("STRATA_CACHE"); !v.empty()) n.cache_dir = v;
  if (auto v = env("STRATA_RUNTIME"); !v.empty()) n.runtime = v;
  if (auto v = env("STRATA_CGROUP_PARENT"); !v.empty()) n.cgroup_parent = v;
  if (auto v = env("STRATA_AGENT"); !v.empty()) n.agent_binary = v;
  if (auto v = env("STRATA_IDMAP"); !v.empty()) {
    auto m = IdMapping::Parse(v);
    if (m.ok()) n.idmap = *m;
  }
  if (n.agent_binary.empty()) {
    for (const std::string& candidate : {SelfDir() + "/strata-agent", std::string("/usr/local/lib/strata/strata-agent")}) {
      if (::access(candidate.c_str(), X_OK) == 0) {
        n.agent_binary = candidate;
        break;
      }
    }
  }
  if (auto v = env("STRATA_VM_KERNEL"); !v.empty()) n.vm_kernel = v;
  if (auto v = env("STRATA_VM_ACCEL"); !v.empty()) n.vm_accel = v;
  if (auto v = env("STRATA_JAIL"); !v.empty()) n.jail_binary = v;
  if (auto v = env("STRATA_VM_BOOT_TIMEOUT"); !v.empty() && std::atoi(v.c_str()) > 0) {
    n.vm_boot_timeout = std::chrono::seconds(std::atoi(v.c_str()));
  }
  if (n.vm_accel.empty()) {
    // What `launcher doctor` found by booting a probe guest.
    auto found = ReadFileToString(JoinPath(n.vm_cache, "accelerator"));
    n.vm_accel = found.ok() && found->rfind("kvm", 0) == 0 ? "kvm" : "tcg";
  }
  if (n.jail_binary.empty()) {
    for (const std::string& candidate : {SelfDir() + "/strata-jail", SelfDir() + "/../vmm/strata-jail",
                                         std::string("/usr/local/lib/strata/strata-jail")}) {
      if (::access(candidate.c_str(), X_OK) == 0) {
        n.jail_binary = candidate;
        break;
      }
    }
  }
  return n;
}

Result<std::unique_ptr<Sandbox>> Sandbox::Create(const SandboxSpec& spec, const NodeConfig& node) {
  std::unique_ptr<Sandbox> sb(new Sandbox());
  sb->node_ = node;
  sb->spec_ = spec;
  sb->id_ = spec.id.empty() ? NewSandboxId(node.name) : spec.id;
  Status s = sb->Start(spec);
  if (!s.ok()) {
    Status cleanup = sb->Destroy();
    if (!cleanup.ok()) STRATA_LOG(kWarn) << "clean up after a failed start: " << cleanup.ToString();
    return s.Annotate("create sandbox " + sb->id_);
  }
  return sb;
}

namespace {
// Logs how long each step of a sandbox's life took (STRATA_LOG=debug).
class StepTimer {
 public:
  explicit StepTimer(std::string id) : id_(std::move(id)), last_(std::chrono::steady_clock::now()) {}
  void Step(const char* name) {
    auto now = std::chrono::steady_clock::now();
    STRATA_LOG(kDebug) << id_ << ": " << name << " "
                       << std::chrono::duration<double, std::milli>(now - last_).count() << " ms";
    last_ = now;
  }

 private:
  std::string id_;
  std::chrono::steady_clock::time_point last_;
};
}  // namespace

namespace {
// The default seccomp profile as the BPF each command loads (compiled once
// per node and profile, and cached beside the run directory).
Result<std::string> CommandSeccompProgram(const NodeConfig& node) {
  STRATA_ASSIGN_OR_RETURN(std::string bpf64, CompiledSeccompBase64(DefaultSeccompProfile(), JoinPath(Dirname(node.run_dir), "seccomp")));
  auto bpf = Base64Decode(bpf64);
  if (!bpf) return Error(EINVAL, "seccomp cache: not base64");
  return std::move(*bpf);
}
}  // namespace

Status Sandbox::Start(const SandboxSpec& spec) {
  StepTimer timer(id_);
  if (node_.agent_binary.empty()) {
    return Error(ENOENT, "find strata-agent: not beside the launcher nor in /usr/local/lib/strata (set STRATA_AGENT)");
  }
  dir_ = JoinPath(node_.run_dir, id_);
  rootfs_ = dir_ + "/rootfs";
  STRATA_RETURN_IF_ERROR(MakeDirs(dir_ + "/agent", 0711));
  STRATA_RETURN_IF_ERROR(CheckTraversable(dir_, static_cast<uid_t>(node_.idmap.ToHost(0))));
  // Who owns the sandbox: a sweep removes it once this process is gone
  // (unless a daemon manages it), and a restarted daemon re-adopts it.
  created_ = static_cast<int64_t>(::time(nullptr));
  store_url_ = cache::DefaultStoreUrl(spec.store);
  json state = {{"id", id_},
                {"pid", ::getpid()},
                {"managed", node_.managed},
                {"uppers", node_.uppers},
                {"lazyfs_socket", node_.lazyfs_socket},
                {"runtime", node_.runtime},
                {"cgroup", node_.cgroup_parent + "/" + id_},
                {"store", store_url_},
                {"created", created_},
                {"spec", SpecState(spec)}};
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(dir_ + "/state.json", state.dump(), false));

  // 1. The layer stack, resolved once.
  STRATA_ASSIGN_OR_RETURN(auto store, cache::OpenStore(store_url_));
  cache::Catalog catalog(store);
  STRATA_ASSIGN_OR_RETURN(stack_, catalog.ResolveStack(spec.layers));
  timer.Step("resolve layers");

  // 2. Each layer mounted once per node by lazyfs, idmapped for the node's
  //    range; the whole stack in one request (the daemon starts on first use).
  json refs = json::array();
  for (const auto& layer : stack_) refs.push_back(layer.digest.Hex());
  const bool microvm = spec.backend == "microvm";
  // A guest reads the layer files as they are (its root is root): no idmapped view.
  json acquire = {{"refs", refs}, {"store", store->url()}, {"holder", id_}};
  if (!microvm) acquire["idmap"] = node_.idmap.ToString();
  lazyfs::Client lazyfs(node_.lazyfs_socket);
  // Recorded first: a launcher killed now leaves a sweep something to release.
  state["layers"] = refs;
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(dir_ + "/state.json", state.dump(), false));
  // Held from here on: the daemon may have taken them even when its answer
  // is lost, and releasing what it does not hold is fine.
  for (const auto& layer : stack_) held_.push_back(layer.digest);
  auto acquired = lazyfs.Call("acquire", acquire);
  // No daemon: start one, or share the one another caller is starting
  // (EnsureDaemon returns at once when it answers by now: one that came up
  // between the call and here must not fail this create).
  if (!acquired.ok() && (acquired.status().code() == ECONNREFUSED || acquired.status().code() == ENOENT)) {
    STRATA_RETURN_IF_ERROR(lazyfs::EnsureDaemon({node_.lazyfs_socket, node_.cache_dir, ""}));
    acquired = lazyfs.Call("acquire", acquire);
  }
  if (!acquired.ok()) return acquired.status().Annotate("mount layers");
  if (microvm) {
    timer.Step("acquire layers from lazyfs");
    return StartMicroVm(spec, (*acquired)["layers"]);
  }
  std::vector<std::string> lowers;  // top first, as overlayfs wants them
  for (const auto& layer : (*acquired)["layers"]) {
    lowers.insert(lowers.begin(), layer["path"].get<std::string>());
  }
  timer.Step("acquire layers from lazyfs");

  const uid_t root_uid = static_cast<uid_t>(node_.idmap.ToHost(0));
  const bool fncall = spec.backend == "fncall";
  if (fncall) {
    // 3-4. A function-call pool has no writable layer: the stack alone,
    //      read-only (calls get a private /tmp from the agent).
    STRATA_RETURN_IF_ERROR(MakeDirs(rootfs_, 0755));
    // On top, the mount points the runtime would otherwise create (it
    // cannot on a read-only root); this also gives overlay the two lowers
    // it wants without an upper.
    const std::string shim = dir_ + "/shim";
    STRATA_RETURN_IF_ERROR(MakeDirs(shim + "/.strata/run", 0755));
    STRATA_RETURN_IF_ERROR(WriteFileAtomic(shim + kAgentPath, "", false));
    std::vector<std::string> made = {shim, shim + "/.strata", shim + "/.strata/run", shim + kAgentPath};
    if (spec.network.routed()) {  // (the node's resolv.conf is bound there)
      STRATA_RETURN_IF_ERROR(MakeDirs(shim + "/etc", 0755));
      STRATA_RETURN_IF_ERROR(WriteFileAtomic(shim + "/etc/resolv.conf", "", false));
      made.push_back(shim + "/etc");
      made.push_back(shim + "/etc/resolv.conf");
    }
    for (const std::string& p : made) {
      if (::lchown(p.c_str(), root_uid, root_uid) != 0) return ErrnoError(errno, "chown " + p);
    }
    lowers.insert(lowers.begin(), shim);
    STRATA_ASSIGN_OR_RETURN(overlay_, MountPoint::Mount("overlay", rootfs_, "overlay", MS_RDONLY,
                                                        StrCat("lowerdir=", Join(lowers, ":"), ",redirect_dir=off,metacopy=off,index=off")));
    timer.Step("mount overlay");
  } else {
  // 3. Writable space: a btrfs subvolume capped at --disk.
  STRATA_ASSIGN_OR_RETURN(UpperStore uppers, UpperStore::Open(node_.uppers));
  STRATA_ASSIGN_OR_RETURN(UpperVolume volume, uppers.Create(id_, spec.disk, root_uid, root_uid));
  upper_.emplace(std::move(volume));
  timer.Step("create upper volume");

  // 4. The overlay, on the host, so the layers' overlay whiteouts and opaque
  //    markers work; directories are copied up whole (no redirects, no
  //    metacopy), which keeps every upper self-contained for packdiff.
  //    volatile: the upper dies with the sandbox, so no sync (and no btrfs
  //    commit at unmount) is worth waiting for.
  STRATA_RETURN_IF_ERROR(MakeDirs(rootfs_, 0755));
  std::string options = StrCat("lowerdir=", Join(lowers, ":"), ",upperdir=", upper_->upper(), ",workdir=", upper_->work(),
                               ",redirect_dir=off,metacopy=off,index=off,volatile");
  STRATA_ASSIGN_OR_RETURN(overlay_, MountPoint::Mount("overlay", rootfs_, "overlay", 0, options));
  timer.Step("mount overlay");
  }

  // 4b. A network of its own (modes allow and open): a namespace the node
  //     owns, a veth and its rules; recorded at once, so a crash after this
  //     leaves the daemon's recovery something to remove.
  if (spec.network.routed()) {
    STRATA_RETURN_IF_ERROR(AttachNetwork(spec.network));
    STRATA_RETURN_IF_ERROR(WriteFileAtomic(dir_ + "/resolv.conf", node_.network->ResolvConf(), false));
    if (::chmod((dir_ + "/resolv.conf").c_str(), 0644) != 0) return ErrnoError(errno, "chmod resolv.conf");
    timer.Step("network");
  }

  // 5. The bundle: the agent is init; its socket lives in dir/agent.
  if (::chown((dir_ + "/agent").c_str(), root_uid, root_uid) != 0) return ErrnoError(errno, "chown " + dir_ + "/agent");
  ContainerConfig config;
  config.id = id_;
  config.rootfs = rootfs_;
  config.hostname = id_;
  config.idmap = node_.idmap;
  // The sandbox's cgroup holds the agent and the grader's execs too: its
  // limits are the caller's plus their reserve; the commands' own cgroup
  // below it (made here, before the runtime) gets the caller's.
  config.limits = spec.limits;
  if (config.limits.pids > 0) config.limits.pids += kAgentReservePids;
  if (config.limits.memory > 0) config.limits.memory += kAgentReserveMemory;
  std::vector<UniqueFd> command_cgroups;
  if (::access("/sys/fs/cgroup/pids/cgroup.procs", F_OK) == 0) {  // (v1 hierarchies; on pure v2 commands share the sandbox's)
    for (const char* c : kCommandControllers) {
      // Only where the caller set a limit: a cgroup costs kernel memory
      // (a memory cgroup most), and without a limit there is none to exhaust.
      if (std::string(c) == "pids" ? spec.limits.pids <= 0 : spec.limits.memory == 0) continue;
      const std::string dir = StrCat("/sys/fs/cgroup/", c, "/", node_.cgroup_parent, "/", id_, "/", kCommandCgroup);
      STRATA_RETURN_IF_ERROR(MakeDirs(dir, 0755).Annotate("commands' cgroup"));
      std::vector<std::pair<std::string, std::string>> limits;
      if (std::string(c) == "pids" && spec.limits.pids > 0) limits.push_back({"pids.max", StrCat(spec.limits.pids)});
      if (std::string(c) == "memory" && spec.limits.memory > 0) {
        limits.push_back({"memory.limit_in_bytes", StrCat(spec.limits.memory)});
        if (::access((dir + "/memory.memsw.limit_in_bytes").c_str(), F_OK) == 0) {
          limits.push_back({"memory.memsw.limit_in_bytes", StrCat(spec.limits.memory)});
        }
      }
      for (const auto& [file, value] : limits) {
        UniqueFd f(::open((dir + "/" + file).c_str(), O_WRONLY | O_CLOEXEC));
        if (!f) return ErrnoError(errno, "commands' cgroup: open " + dir + "/" + file);
        STRATA_RETURN_IF_ERROR(WriteFull(f.get(), value).Annotate("commands' cgroup: write " + dir + "/" + file));
      }
      UniqueFd procs(::open((dir + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC));
      if (!procs) return ErrnoError(errno, "open " + dir + "/cgroup.procs");
      command_cgroups.push_back(std::move(procs));
    }
  }
  config.host_network = spec.network.mode == NetMode::kHost;
  config.cgroup_path = "/" + node_.cgroup_parent + "/" + id_;
  config.agent_binary = node_.agent_binary;
  config.agent_socket_dir = dir_ + "/agent";
  if (net_) {
    config.netns_path = net_->netns;
    config.resolv_conf = dir_ + "/resolv.conf";
  }
  config.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"};
  config.fncall = fncall;
  const std::string seccomp_cache = JoinPath(Dirname(node_.run_dir), "seccomp");
  if (Basename(node_.runtime) == "crun") {
    auto bpf = CompiledSeccompBase64(AgentSeccompProfile(), seccomp_cache);
    if (bpf.ok()) config.seccomp_bpf_base64 = std::move(*bpf);
    else STRATA_LOG(kWarn) << "precompile seccomp profile: " << bpf.status().ToString() << "; crun compiles it";
  }
  {
    // Each command and call loads the default profile on top of the
    // agent's (the agent reads it from its socket directory).
    STRATA_ASSIGN_OR_RETURN(std::string bpf, CommandSeccompProgram(node_));
    const std::string path = dir_ + "/agent/" + kCommandSeccompName;
    STRATA_RETURN_IF_ERROR(WriteFileAtomic(path, bpf, false));
    if (::chmod(path.c_str(), 0644) != 0) return ErrnoError(errno, "chmod " + path);
  }
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(dir_ + "/config.json", OciConfig(config).dump(), false));
  timer.Step("write bundle");

  // 6. The runtime, in the foreground of its own process: when the agent
  //    exits, `run` deletes the container and its cgroups itself. The agent's
  //    socket is bound here and handed over (descriptor 3), so the launcher
  //    can connect at once: no watching for the socket to appear.
  const std::string socket_path = dir_ + "/agent/" + kAgentSocketName;
  STRATA_ASSIGN_OR_RETURN(UniqueFd listener, ListenUnix(socket_path, 0600));
  // Descriptor 3 is the socket; 4 and on, the commands' cgroup.procs files
  // (the agent moves each command there before it runs).
  std::vector<int> pass = {listener.get()};
  for (const auto& fd : command_cgroups) pass.push_back(fd.get());
  std::vector<std::string> run = {node_.runtime, "run", "--preserve-fds", StrCat(pass.size()), "--bundle", dir_, id_};
  if (node_.managed) run.insert(run.begin() + 2, "--detach");  // returns once the agent runs
  STRATA_ASSIGN_OR_RETURN(Subprocess runtime, Subprocess::Start({.argv = run,
                                                                 .stdout_mode = StdStream::kNull,
                                                                 .stderr_mode = StdStream::kFile,
                                                                 .stderr_file = dir_ + "/runtime.log",
                                                                 .pass_fds = pass}));
  runtime_.emplace(std::move(runtime));
  listener.reset();
  command_cgroups.clear();  // the runtime and then the agent hold it; if they die, a connection fails
  agent_ = std::make_unique<AgentClient>(socket_path);
  agent_->SetRulePaths(spec.files);
  Status ready = agent_->WaitReady(std::chrono::seconds(30));
  if (!ready.ok()) {
    // The runtime's own words say why it failed; give it a moment to exit.
    for (int i = 0; i < 200 && runtime_->Running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto log = ReadFileToString(dir_ + "/runtime.log");
    std::string text = log.ok() ? *log : "";
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (!runtime_->Running() && !text.empty()) return Error(EIO, StrCat(node_.runtime, " failed to start the agent: ", text));
    return ready.Annotate("start the sandbox's agent");
  }
  if (node_.managed) {
    // `run --detach` returns right after the container started; reap it.
    auto exit = runtime_->Wait();
    if (!exit.ok() || !exit->success()) return Error(EIO, StrCat(node_.runtime, " run --detach failed after the agent started"));
    runtime_.reset();
  }
  timer.Step("start runtime and agent");
  return OkStatus();
}

void Sandbox::FillDefaults(ExecRequest& request) const {
  request.isolate = spec_.backend == "fncall";
  // A call of a pool with a network of its own keeps it (the policy is
  // the pool's); otherwise each call gets loopback only.
  request.isolate_network = spec_.network.mode == NetMode::kNone;
  if (request.env.empty()) request.env = spec_.env;
  if (request.cwd.empty()) request.cwd = spec_.workdir.empty() ? "/" : spec_.workdir;
  if (!request.grader) request.files = MergeFileRules(spec_.files, request.files);
  if (!request.kill_leftovers) request.kill_leftovers = spec_.kill_leftovers;
}

Status Sandbox::CheckAgentFor(const ExecRequest& request) {
  if (request.files.empty()) return OkStatus();
  int version = agent_version_.load();
  if (version == 0) {
    STRATA_ASSIGN_OR_RETURN(nlohmann::json ping, agent_->Ping());
    version = ping.value("version", 1);
    agent_version_ = version;
  }
  if (version < 3) {
    return Error(ENOTSUP, StrCat("sandbox ", id_, ": its agent speaks protocol ", version,
                                 " and would ignore file rules; they need 3 (a sandbox created by this strata)"));
  }
  return OkStatus();
}

Result<ExecResult> Sandbox::Exec(ExecRequest request, const OutputSink& sink) {
  FillDefaults(request);
  STRATA_RETURN_IF_ERROR(VmGone());
  STRATA_RETURN_IF_ERROR(CheckAgentFor(request));
  auto result = agent_->Exec(request, sink);
  if (!result.ok()) {
    Status gone = VmGone();
    if (!gone.ok()) return gone;
  }
  return result;
}

Status Sandbox::VmGone() const {
  if (!vm_ || vm_->Running()) return OkStatus();
  const std::string why = vm_->Why();
  return Error(EHOSTDOWN, StrCat("sandbox ", id_, ": its microVM is gone (QEMU exited)", why.empty() ? "" : "; its console ended: " + why));
}

Status Sandbox::AttachNetwork(const NetPolicy& policy) {
  if (!node_.network && node_.managed) {
    return Error(ENOTSUP, StrCat("network mode ", NetModeName(policy.mode), ": sandbox networks are off on this node (",
                                 node_.network_off_reason, ")"));
  }
  if (!node_.network) {
    return Error(ENOTSUP, StrCat("network mode ", NetModeName(policy.mode),
                                 " needs the launcher daemon (its DNS proxy and address pool): start `launcher serve`"));
  }
  STRATA_ASSIGN_OR_RETURN(SandboxNet net, node_.network->Attach(id_, policy));
  net_ = net;
  return SaveState({{"net", net.ToJson()}});
}

Status Sandbox::StartMicroVm(const SandboxSpec& spec, const json& layers) {
  StepTimer timer(id_);
  if (spec.network.mode == NetMode::kHost) return Error(ENOTSUP, "network mode host: a microVM cannot share the node's network");
  if (layers.size() > kMaxVmLayers) {
    return Error(E2BIG, StrCat("microVM: ", layers.size(), " layers; a microVM takes at most ", kMaxVmLayers,
                               " (two disks each, in microvm's 24 virtio-mmio slots): squash some with packdiff"));
  }
  if (node_.jail_binary.empty()) return Error(ENOENT, "find strata-jail: not beside the launcher nor in /usr/local/lib/strata (set STRATA_JAIL)");
  MicroVmSpec vm;
  vm.id = id_;
  vm.dir = dir_;
  vm.agent_socket = dir_ + "/agent/" + kAgentSocketName;
  for (const auto& layer : layers) {
    if (!layer.contains("meta") || !layer.contains("blob")) {
      return Error(EPROTO, "microVM: the lazyfs daemon did not name the layer's files (an older lazyfs: upgrade it)");
    }
    vm.layers.push_back({layer["meta"].get<std::string>(), layer["blob"].get<std::string>()});
  }
  // The upper disk: a ready-made ext4 image of --disk bytes, reflinked into
  // a volume of its own (whose quota allows the image and some metadata).
  STRATA_ASSIGN_OR_RETURN(UpperStore uppers, UpperStore::Open(node_.uppers));
  STRATA_ASSIGN_OR_RETURN(std::string image, vmm::EnsureExt4Template(node_.uppers + "/.vm-templates", spec.disk));
  STRATA_ASSIGN_OR_RETURN(UpperVolume volume, uppers.Create(id_, spec.disk + (uint64_t{64} << 20), 0, 0));
  upper_.emplace(std::move(volume));
  vm.upper_disk = upper_->path() + "/disk.img";
  // The console too: the guest writes it at will, and the volume's quota
  // bounds it.
  vm.console_log = upper_->path() + "/console.log";
  STRATA_RETURN_IF_ERROR(vmm::CloneFile(image, vm.upper_disk).Annotate("microVM upper disk"));
  timer.Step("upper disk");
  // The initramfs carries the commands' seccomp program (a container's
  // agent finds it in its socket directory).
  STRATA_ASSIGN_OR_RETURN(std::string command_bpf, CommandSeccompProgram(node_));
  STRATA_ASSIGN_OR_RETURN(vm.initramfs, vmm::EnsureInitramfs(node_.agent_binary, {{kCommandSeccompName, std::move(command_bpf)}},
                                                             node_.vm_cache));
  vm.kernel = node_.vm_kernel;
  vm.jail_binary = node_.jail_binary;
  vm.accel = node_.vm_accel;
  vm.cpus = spec.limits.cpus > 0 ? static_cast<int>(std::ceil(spec.limits.cpus)) : 1;
  vm.cpu_quota = spec.limits.cpus;
  vm.memory = spec.limits.memory;
  vm.cgroup = node_.cgroup_parent + "/" + id_;
  // A network: the sandbox's namespace as a container's, with its veth
  // bridged to the guest's tap; the guest takes the address.
  UniqueFd tap;
  if (spec.network.routed()) {
    STRATA_RETURN_IF_ERROR(AttachNetwork(spec.network));
    STRATA_ASSIGN_OR_RETURN(tap, OpenGuestTap(net_->netns, net_->address));
    vm.tap_fd = tap.get();
    vm.address = net_->address;
    vm.gateway = node_.network->config().gateway();
    timer.Step("network");
  }
  STRATA_RETURN_IF_ERROR(SaveState({{"vm", {{"accel", vm.accel}, {"kernel", vm.kernel}}}}));
  STRATA_ASSIGN_OR_RETURN(vm_, MicroVm::Start(vm));
  tap.reset();  // (QEMU holds it: the tap goes with QEMU)
  timer.Step("start the guest");
  agent_ = std::make_unique<AgentClient>(vm.agent_socket);
  agent_->SetRulePaths(spec.files);
  // Booting under TCG on a busy node takes seconds; a guest that died
  // fails at once, with its console's last words.
  const auto until = std::chrono::steady_clock::now() + node_.vm_boot_timeout;
  Status ready;
  while (true) {
    STRATA_RETURN_IF_ERROR(VmGone().Annotate("boot"));
    ready = agent_->WaitReady(std::chrono::seconds(2));
    if (ready.ok() || std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!ready.ok()) {
    std::string why = vm_->Why();
    return Error(ETIMEDOUT, StrCat("microVM: the guest's agent did not answer within ", node_.vm_boot_timeout.count(),
                                   " s (boot)", why.empty() ? "" : "; its console: " + why));
  }
  timer.Step("boot the guest");
  return OkStatus();
}

std::string Sandbox::CgroupDir(const std::string& controller) const {
  return StrCat("/sys/fs/cgroup/", controller, "/", node_.cgroup_parent, "/", id_);
}

bool Sandbox::OomKilled() const {
  if (vm_) {
    // The guest's own OOM killer (its RAM is the limit): its counter.
    auto vmstat = agent_->Get("/proc/vmstat");
    if (!vmstat.ok()) return false;
    for (const auto& line : Split(*vmstat, '\n')) {
      if (line.rfind("oom_kill ", 0) == 0) return std::strtoull(line.c_str() + 9, nullptr, 10) > 0;
    }
    return false;
  }
  for (const auto& [file, key] : {std::pair{CgroupDir("memory") + "/" + kCommandCgroup + "/memory.oom_control", "oom_kill"},
                                  std::pair{CgroupDir("memory") + "/memory.oom_control", "oom_kill"},
                                  std::pair{StrCat("/sys/fs/cgroup/", node_.cgroup_parent, "/", id_, "/memory.events"), "oom_kill"}}) {
    std::ifstream in(file);
    std::string name;
    uint64_t value;
    while (in >> name >> value) {
      if (name == key && value > 0) return true;
    }
  }
  return false;
}

void Sandbox::Interrupt() {
  if (agent_) agent_->Shutdown().IgnoreError();
}

Status Sandbox::Destroy() {
  if (destroyed_) return OkStatus();
  destroyed_ = true;
  StepTimer timer(id_);
  Status first;
  auto note = [&](Status s) {
    if (!s.ok()) {
      STRATA_LOG(kWarn) << "sandbox " << id_ << ": " << s.ToString();
      if (first.ok()) first = std::move(s);
    }
  };
  // The guest: QEMU quits at once (nothing in the guest outlives it: its
  // disk goes with the upper volume), and is killed if it does not.
  if (vm_) {
    note(vm_->Stop());
    vm_.reset();
    timer.Step("stop the microVM");
  } else if (spec_.backend == "microvm") {
    // (Adopted without its guest, or failed before it started: QEMU is
    // killed with its cgroups below.)
  } else if (node_.managed && !dir_.empty()) {
    if (agent_) agent_->Shutdown().IgnoreError();
    runtime_.reset();
    RunCommand({.argv = {node_.runtime, "delete", "--force", id_}, .timeout = std::chrono::seconds(10)}).status().IgnoreError();
    timer.Step("stop runtime");
  } else if (runtime_) {
    if (runtime_->Running() && agent_) agent_->Shutdown().IgnoreError();
    if (runtime_->RunningAfter(std::chrono::seconds(1))) {
      RunCommand({.argv = {node_.runtime, "kill", id_, "KILL"}, .timeout = std::chrono::seconds(10)}).status().IgnoreError();
      runtime_->RunningAfter(std::chrono::seconds(5));
    }
    runtime_.reset();  // kills and reaps whatever is left of the runtime's group
    timer.Step("stop runtime");
  }
  if (!id_.empty() && !dir_.empty()) {
    // `run` deletes the container when its init exits; if the runtime died
    // first its state is still there.
    if (spec_.backend != "microvm" && ::access(StrCat("/run/", Basename(node_.runtime), "/", id_).c_str(), F_OK) == 0) {
      RunCommand({.argv = {node_.runtime, "delete", "--force", id_}, .timeout = std::chrono::seconds(10)}).status().IgnoreError();
    }
    RemoveCgroups(node_.cgroup_parent + "/" + id_);
  }
  timer.Step("clean up runtime state");
  note(overlay_.Unmount());
  timer.Step("unmount overlay");
  if (net_) {
    if (node_.network) note(node_.network->Detach(id_, *net_));
    else note(Error(ENOTSUP, "remove the network of sandbox " + id_ + ": no node network here (the daemon's recovery will)"));
    net_.reset();
    timer.Step("remove network");
  }
  if (upper_) {
    note(upper_->Destroy());
    upper_.reset();
  }
  timer.Step("delete upper volume");
  if (!held_.empty()) {
    lazyfs::Client lazyfs(node_.lazyfs_socket);
    note(ReleaseLayers(lazyfs, id_, held_));
    held_.clear();
  }
  timer.Step("release layers");
  if (!dir_.empty()) note(RemoveTree(dir_));
  timer.Step("remove directory");
  return first;
}

Sandbox::~Sandbox() { Destroy().IgnoreError(); }

Result<std::unique_ptr<Sandbox>> Sandbox::Adopt(const std::string& id, const NodeConfig& node) {
  std::unique_ptr<Sandbox> sb(new Sandbox());
  sb->node_ = node;
  sb->id_ = id;
  sb->dir_ = JoinPath(node.run_dir, id);
  sb->rootfs_ = sb->dir_ + "/rootfs";
  auto text = ReadFileToString(sb->dir_ + "/state.json");
  if (!text.ok()) return text.status().Annotate("adopt sandbox " + id);
  json state = json::parse(*text, nullptr, false);
  if (!state.is_object()) return Error(EINVAL, "adopt sandbox " + id + ": state.json is not valid JSON");
  sb->store_url_ = state.value("store", "");
  sb->created_ = state.value("created", int64_t{0});
  sb->paused_ = state.value("paused", false);
  const json spec = state.value("spec", json::object());
  sb->spec_.layers = spec.value("layers", std::vector<std::string>{});
  sb->spec_.backend = spec.value("backend", std::string("container"));
  sb->spec_.limits.cpus = spec.value("cpus", 0.0);
  sb->spec_.limits.memory = spec.value("memory", uint64_t{0});
  sb->spec_.limits.pids = spec.value("pids", int64_t{0});
  sb->spec_.disk = spec.value("disk", uint64_t{0});
  if (auto policy = NetPolicy::FromJson(spec.value("network", json())); policy.ok()) sb->spec_.network = *policy;
  if (spec.value("host_network", false)) sb->spec_.network.mode = NetMode::kHost;  // (state of an older daemon)
  if (state.contains("net")) {
    auto net = SandboxNet::FromJson(state["net"]);
    if (!net.ok()) return net.status().Annotate("adopt sandbox " + id);
    sb->net_ = *net;
    sb->spec_.network = net->policy;
    if (node.network) {
      Status s = node.network->Adopt(id, *net);
      if (!s.ok()) STRATA_LOG(kWarn) << "adopt sandbox " << id << ": " << s.ToString();
    }
  }
  sb->spec_.env = spec.value("env", std::vector<std::string>{});
  sb->spec_.workdir = spec.value("workdir", std::string("/"));
  if (auto files = ParseFileRules(spec.value("files", json()), "state files"); files.ok()) sb->spec_.files = std::move(*files);
  else return files.status().Annotate("adopt sandbox " + id);
  sb->spec_.kill_leftovers = spec.value("kill_leftovers", false);
  for (const auto& d : state.value("layers", json::array())) {
    if (auto digest = Digest128::FromHex(d.get<std::string>())) sb->held_.push_back(*digest);
  }
  if (auto store = cache::OpenStore(sb->store_url_); store.ok()) {
    cache::Catalog catalog(*store);
    for (const auto& d : sb->held_) {
      auto m = catalog.GetManifest(d);
      if (m.ok()) sb->stack_.push_back({d, std::move(*m)});
    }
  }
  if (IsMountPoint(sb->rootfs_)) sb->overlay_ = MountPoint::Adopt(sb->rootfs_);
  if (auto uppers = UpperStore::Open(node.uppers); uppers.ok()) {
    auto volume = uppers->Adopt(id);
    if (volume.ok()) sb->upper_.emplace(std::move(*volume));
  }
  sb->agent_ = std::make_unique<AgentClient>(sb->dir_ + "/agent/" + kAgentSocketName);
  sb->agent_->SetRulePaths(sb->spec_.files);
  if (sb->spec_.backend == "microvm") {
    // Its guest, and a relay for its channel in this process. A guest that
    // is gone leaves a sandbox whose calls fail and whose destroy cleans up.
    auto vm = MicroVm::Adopt(sb->dir_, sb->dir_ + "/agent/" + kAgentSocketName);
    if (vm.ok()) sb->vm_ = std::move(*vm);
    else STRATA_LOG(kWarn) << "adopt sandbox " << id << ": " << vm.status().ToString();
  }
  return sb;
}

void Sandbox::Release() {
  destroyed_ = true;
  if (vm_) vm_->Release();
  vm_.reset();
  overlay_.Release();
  if (upper_) upper_->Release();
  upper_.reset();
  if (runtime_) runtime_->Detach();
  runtime_.reset();
  held_.clear();
}

bool Sandbox::Alive() {
  if (spec_.backend == "microvm") {
    if (!vm_ || !vm_->Running()) return false;
    return paused_ || (agent_ && agent_->Ping().ok());
  }
  if (paused_) {
    // A frozen agent cannot answer: ask the runtime instead.
    auto state = RunCommand({.argv = {node_.runtime, "state", id_}, .timeout = std::chrono::seconds(10)});
    if (!state.ok() || !state->success()) return false;
    json j = json::parse(state->out, nullptr, false);
    return j.is_object() && j.value("status", "") == "paused";
  }
  return agent_ && agent_->Ping().ok();
}

Status Sandbox::Pause() {
  if (vm_) {
    STRATA_RETURN_IF_ERROR(VmGone());
    STRATA_RETURN_IF_ERROR(vm_->Pause().Annotate("pause sandbox " + id_));
    paused_ = true;
    return SaveState({{"paused", true}});
  }
  STRATA_RETURN_IF_ERROR(RunChecked({.argv = {node_.runtime, "pause", id_}, .timeout = std::chrono::seconds(30)},
                                    "pause sandbox " + id_).status());
  paused_ = true;
  return SaveState({{"paused", true}});
}

Status Sandbox::Resume() {
  if (vm_) {
    STRATA_RETURN_IF_ERROR(VmGone());
    STRATA_RETURN_IF_ERROR(vm_->Resume().Annotate("resume sandbox " + id_));
    paused_ = false;
    return SaveState({{"paused", false}});
  }
  STRATA_RETURN_IF_ERROR(RunChecked({.argv = {node_.runtime, "resume", id_}, .timeout = std::chrono::seconds(30)},
                                    "resume sandbox " + id_).status());
  paused_ = false;
  return SaveState({{"paused", false}});
}

Result<UpperVolume> Sandbox::CaptureUpper() {
  if (!upper_) return Error(ENOTSUP, StrCat("snapshot: sandbox ", id_, " has no upper volume"));
  STRATA_ASSIGN_OR_RETURN(UpperStore store, UpperStore::Open(node_.uppers));
  const std::string name = StrCat(id_, "-", std::chrono::duration_cast<std::chrono::milliseconds>(
                                                std::chrono::system_clock::now().time_since_epoch()).count());
  if (vm_) {
    // The guest's filesystem frozen (its dirty pages written), the disk
    // image reflinked by a btrfs snapshot, thawed. A paused guest cannot
    // freeze: it runs for as long as that takes.
    STRATA_RETURN_IF_ERROR(VmGone());
    const bool was_paused = paused_;
    if (was_paused) STRATA_RETURN_IF_ERROR(vm_->Resume().Annotate("snapshot: resume for the freeze"));
    Status frozen = agent_->Freeze(true);
    auto snapshot = frozen.ok() ? store.Snapshot(*upper_, name) : Result<UpperVolume>(frozen.Annotate("snapshot: freeze the guest's upper disk"));
    // A thaw after every freeze asked for, also one that failed or timed
    // out: the agent may have frozen after we stopped waiting, and a
    // frozen filesystem hangs every writer in the guest.
    Status thawed = agent_->Freeze(false);
    if (!thawed.ok()) thawed = agent_->Freeze(false);
    if (was_paused) {
      Status paused = vm_->Pause();
      if (!paused.ok() && snapshot.ok()) return paused.Annotate("snapshot: pause again");
    }
    if (!thawed.ok() && snapshot.ok() && frozen.ok()) return thawed.Annotate("snapshot: thaw the guest's upper disk");
    return snapshot;
  }
  const bool was_paused = paused_;
  if (!was_paused) STRATA_RETURN_IF_ERROR(Pause());
  auto snapshot = store.Snapshot(*upper_, name);
  if (!was_paused) {
    Status resumed = Resume();
    if (!resumed.ok()) return resumed.Annotate("thaw after the snapshot");
  }
  return snapshot;
}

Status Sandbox::Assign(const SandboxSpec& spec) {
  SandboxSpec next = spec_;
  next.env = spec.env;
  next.workdir = spec.workdir;
  next.files = spec.files;
  next.kill_leftovers = spec.kill_leftovers;
  created_ = ::time(nullptr);
  STRATA_RETURN_IF_ERROR(SaveState({{"spec", SpecState(next)}, {"created", created_}}).Annotate("assign sandbox " + id_));
  spec_ = std::move(next);
  agent_->SetRulePaths(spec_.files);
  return OkStatus();
}

Status Sandbox::SaveState(const json& changes) {
  auto text = ReadFileToString(dir_ + "/state.json");
  json state = text.ok() ? json::parse(*text, nullptr, false) : json::object();
  if (!state.is_object()) state = json::object();
  state.update(changes);
  return WriteFileAtomic(dir_ + "/state.json", state.dump(), false);
}

json Sandbox::Info() const {
  json layers = json::array();
  for (const auto& l : stack_) {
    layers.push_back({{"digest", l.digest.Hex()}, {"kind", cache::LayerKindName(l.manifest.kind)}, {"name", l.manifest.name}});
  }
  return {{"id", id_},
          {"backend", spec_.backend},
          {"state", destroyed_ ? "destroyed" : (paused_ ? "paused" : "running")},
          {"created", created_},
          {"layers", layers},
          {"limits", {{"cpus", spec_.limits.cpus}, {"memory", spec_.limits.memory}, {"pids", spec_.limits.pids}, {"disk", spec_.disk}}},
          {"network", NetworkSummary()},
          {"files", spec_.files.ToJson()},
          {"kill_leftovers", spec_.kill_leftovers}};
}

json Sandbox::NetworkSummary() const {
  json j = net_ ? net_->policy.ToJson() : spec_.network.ToJson();
  if (net_) j["address"] = Ipv4ToString(net_->address);
  return j;
}

json Sandbox::NetworkInfo() const {
  if (net_ && node_.network) {
    json j = node_.network->Describe(id_);
    if (!j.is_null()) return j;
  }
  return net_ ? net_->policy.ToJson() : spec_.network.ToJson();
}

Status Sandbox::SetNetwork(const NetPolicy& policy) {
  if (policy.mode == NetMode::kHost) return Error(EINVAL, "network: a live sandbox cannot change to the host's network");
  if (spec_.backend == "fncall") {
    return Error(EBADSLT, "network of " + id_ + ": a function-call sandbox's policy is its pool's, fixed at create");
  }
  if (!net_ || !node_.network) {
    return Error(EBADSLT, StrCat("network of ", id_, ": it was created without an interface (mode ", NetModeName(spec_.network.mode),
                                 "); create it with mode allow or open (an empty allow list reaches nothing) to change it later"));
  }
  STRATA_ASSIGN_OR_RETURN(SandboxNet next, node_.network->SetPolicy(id_, policy, [this](const SandboxNet& n) {
    return SaveState({{"net", n.ToJson()}});
  }));
  net_ = next;
  spec_.network = policy;
  return OkStatus();
}

Status SweepStaleSandboxes(const NodeConfig& node) {
  DIR* dir = ::opendir(node.run_dir.c_str());
  if (!dir) return OkStatus();
  std::vector<std::string> ids;
  while (dirent* e = ::readdir(dir)) {
    if (std::string_view(e->d_name).starts_with("sb-")) ids.push_back(e->d_name);
  }
  ::closedir(dir);
  Status first;
  for (const auto& id : ids) {
    std::string path = JoinPath(node.run_dir, id);
    auto text = ReadFileToString(path + "/state.json");
    json state = text.ok() ? json::parse(*text, nullptr, false) : json();
    pid_t owner = state.is_object() ? state.value("pid", 0) : 0;
    if (ProcessAlive(owner)) continue;
    // The daemon's sandboxes outlive a daemon restart; it re-adopts them.
    if (state.is_object() && state.value("managed", false) && !node.managed) continue;
    STRATA_LOG(kWarn) << "cleaning up sandbox " << id << " whose launcher (pid " << owner << ") is gone";
    std::string runtime = state.is_object() ? state.value("runtime", node.runtime) : node.runtime;
    RunCommand({.argv = {runtime, "delete", "--force", id}, .timeout = std::chrono::seconds(10)}).status().IgnoreError();
    RemoveCgroups(state.is_object() ? state.value("cgroup", node.cgroup_parent + "/" + id) : node.cgroup_parent + "/" + id);
    if (IsMountPoint(path + "/rootfs")) MountPoint::Adopt(path + "/rootfs").Unmount().IgnoreError();
    auto uppers = UpperStore::Open(state.is_object() ? state.value("uppers", node.uppers) : node.uppers);
    if (uppers.ok()) {
      auto volume = uppers->Adopt(id);
      if (volume.ok()) volume->Destroy().IgnoreError();
    }
    if (state.is_object() && state.contains("layers")) {
      std::vector<Digest128> digests;
      for (const auto& d : state["layers"]) {
        if (auto digest = Digest128::FromHex(d.get<std::string>())) digests.push_back(*digest);
      }
      lazyfs::Client lazyfs(state.value("lazyfs_socket", node.lazyfs_socket));
      if (lazyfs.Alive()) ReleaseLayers(lazyfs, id, digests).IgnoreError();
    }
    Status s = RemoveTree(path);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

}  // namespace strata::launcher
