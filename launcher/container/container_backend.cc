// ContainerBackend: overlay, bundle, runtime.
#include "launcher/container/container_backend.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <thread>

#include "common/fs.h"
#include "common/mount.h"
#include "common/subprocess.h"
#include "common/strings.h"
#include "common/unix_socket.h"
#include "launcher/container/oci_config.h"
#include "launcher/sandbox/seccomp.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

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

}  // namespace

Status AddContainerBackends(BackendTable& table) {
  // What a one-shot launcher that died left beside the generic parts: the
  // runtime's container, the sandbox's /dev and the overlay on the host.
  auto sweep = [](const NodeConfig& node, const std::string& id, const json& state) {
    const std::string runtime = state.value("runtime", node.runtime);
    RunCommand({.argv = {runtime, "delete", "--force", id}, .timeout = std::chrono::seconds(10)}).status().IgnoreError();
    RemoveSandboxDev(id).IgnoreError();
    const std::string rootfs = JoinPath(node.run_dir, id) + "/rootfs";
    if (IsMountPoint(rootfs)) MountPoint::Adopt(rootfs).Unmount().IgnoreError();
  };
  STRATA_RETURN_IF_ERROR(table.Add({
      .name = "container",
      .make = [](const NodeConfig& node, const std::string& id, const std::string& dir) -> std::unique_ptr<Backend> {
        return std::make_unique<ContainerBackend>(node, id, dir, false);
      },
      // Its cgroup's limit: the caller's and the agent's reserve beside it.
      .memory_commit = [](const SandboxSpec& spec) { return spec.limits.memory > 0 ? spec.limits.memory + kAgentReserveMemory : 0; },
      .sweep = sweep,
      .oci_runtime = true,
      .warm_pools = true,
  }));
  return table.Add({
      .name = "fncall",
      .make = [](const NodeConfig& node, const std::string& id, const std::string& dir) -> std::unique_ptr<Backend> {
        return std::make_unique<ContainerBackend>(node, id, dir, true);
      },
      .sweep = sweep,
      .calls = true,  // (its memory is its pool's: none of its own)
      .oci_runtime = true,
  });
}

ContainerBackend::ContainerBackend(NodeConfig node, std::string id, std::string dir, bool fncall)
    : node_(std::move(node)), id_(std::move(id)), dir_(std::move(dir)), rootfs_(dir_ + "/rootfs"), fncall_(fncall),
      runtime_path_(node_.runtime) {}

Status ContainerBackend::Start(const BackendStart& start) {
  const SandboxSpec& spec = start.spec;
  StepTimer timer(id_, fncall_ ? "fncall create" : "container create");
  if (!spec.runtime.empty()) runtime_path_ = spec.runtime;
  const uid_t root_uid = static_cast<uid_t>(node_.idmap.ToHost(0));
  STRATA_RETURN_IF_ERROR(CheckTraversable(dir_, root_uid));
  std::vector<std::string> lowers;  // top first, as overlayfs wants them
  std::string root_options;         // the overlay's
  if (node_.nsexec_binary.empty()) {
    return Error(ENOENT, "find strata-nsexec: not beside the launcher nor in /usr/local/lib/strata (set STRATA_NSEXEC)");
  }
  for (const auto& layer : start.layers) lowers.insert(lowers.begin(), layer["path"].get<std::string>());

  if (fncall_) {
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
    root_options = StrCat("lowerdir=", Join(lowers, ":"), ",redirect_dir=off,metacopy=off,index=off");
  } else {
    // 3. Writable space: a btrfs subvolume capped at --disk.
    STRATA_ASSIGN_OR_RETURN(UpperStore uppers, UpperStore::Open(node_.uppers));
    STRATA_ASSIGN_OR_RETURN(UpperVolume volume, uppers.Create(id_, spec.disk, root_uid, root_uid));
    upper_.emplace(std::move(volume));
    timer.Step("create upper volume");

    // 4. The overlay (mounted in step 6), so the layers' overlay whiteouts
    //    and opaque markers work; directories are copied up whole (no
    //    redirects, no metacopy), which keeps every upper self-contained for
    //    packdiff. volatile: the upper dies with the sandbox, so no sync (and
    //    no btrfs commit at unmount) is worth waiting for.
    STRATA_RETURN_IF_ERROR(MakeDirs(rootfs_, 0755));
    root_options = StrCat("lowerdir=", Join(lowers, ":"), ",upperdir=", upper_->upper(), ",workdir=", upper_->work(),
                          ",redirect_dir=off,metacopy=off,index=off,volatile");
  }

  // 4b. A network of its own (modes allow and open).
  std::optional<SandboxNet> net;
  if (spec.network.routed()) {
    STRATA_ASSIGN_OR_RETURN(net, start.attach_network());
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
      const std::string dir = StrCat(CgroupDir(c), "/", kCommandCgroup);
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
  if (net) {
    config.netns_path = net->NamespacePath();
    config.resolv_conf = dir_ + "/resolv.conf";
  }
  // The agent's own environment (commands get the caller's): glibc keeps
  // no stacks of ended threads, whose top pages (the thread's descriptor,
  // its TLS) and page tables an idle agent would hold otherwise.
  config.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root",
                "GLIBC_TUNABLES=glibc.pthread.stack_cache_size=0"};
  config.fncall = fncall_;
  const std::string seccomp_cache = JoinPath(Dirname(node_.run_dir), "seccomp");
  config.crun = Basename(runtime_path_) == "crun";
  if (config.crun) {
    auto bpf = CompiledSeccompBase64(AgentSeccompProfile(), seccomp_cache);
    if (bpf.ok()) config.seccomp_bpf_base64 = std::move(*bpf);
    else STRATA_LOG(kWarn) << "precompile seccomp profile: " << bpf.status().ToString() << "; crun compiles it";
  }
  {
    // Each command and call loads, on top of the agent's program, what
    // holds it to the default profile (the agent reads it from its socket
    // directory).
    STRATA_ASSIGN_OR_RETURN(std::string bpf, CommandSeccompProgram(node_, /*agent_filtered=*/true));
    const std::string path = dir_ + "/agent/" + kCommandSeccompName;
    STRATA_RETURN_IF_ERROR(WriteFileAtomic(path, bpf, false));
    if (::chmod(path.c_str(), 0644) != 0) return ErrnoError(errno, "chmod " + path);
  }
  STRATA_RETURN_IF_ERROR(EnsureSharedMounts());
  STRATA_ASSIGN_OR_RETURN(config.dev_dir, MakeSandboxDev(id_, root_uid));
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(dir_ + "/config.json", OciConfig(config).dump(), false));
  timer.Step("write bundle");

  // 6. The runtime, in the foreground of its own process: when the agent
  //    exits, `run` deletes the container and its cgroups itself. The agent's
  //    socket is bound here and handed over (descriptor 3), so the launcher
  //    can connect at once: no watching for the socket to appear. It starts
  //    through strata-nsexec, which mounts the root in a mount namespace of
  //    its own: the runtime's container namespace is a copy of that one, so
  //    the root is the container's alone, and no namespace of the node's —
  //    which every runtime's would start as a copy of, and walk — holds
  //    one per sandbox (with thousands idle that copy cost 30 ms a create).
  const std::string socket_path = dir_ + "/agent/" + kAgentSocketName;
  STRATA_ASSIGN_OR_RETURN(UniqueFd listener, ListenUnix(socket_path, 0600));
  // Descriptor 3 is the socket; 4 and on, the commands' cgroup.procs files
  // (the agent moves each command there before it runs).
  std::vector<int> pass = {listener.get()};
  for (const auto& fd : command_cgroups) pass.push_back(fd.get());
  std::vector<std::string> run = {node_.nsexec_binary, "--overlay", rootfs_, root_options};
  if (fncall_) run.push_back("--read-only");
  run.insert(run.end(), {"--", runtime_path_, "run"});
  if (node_.managed) run.push_back("--detach");  // returns once the agent runs
  run.insert(run.end(), {"--preserve-fds", StrCat(pass.size()), "--bundle", dir_, id_});
  STRATA_ASSIGN_OR_RETURN(Subprocess runtime, Subprocess::Start({.argv = run,
                                                                 .stdout_mode = StdStream::kNull,
                                                                 .stderr_mode = StdStream::kFile,
                                                                 .stderr_file = dir_ + "/runtime.log",
                                                                 .pass_fds = pass}));
  runtime_.emplace(std::move(runtime));
  listener.reset();
  command_cgroups.clear();  // the runtime and then the agent hold it; if they die, a connection fails
  Status ready = start.agent.WaitReady(std::chrono::seconds(30));
  if (!ready.ok()) {
    // The runtime's own words say why it failed; give it a moment to exit.
    for (int i = 0; i < 200 && runtime_->Running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto log = ReadFileToString(dir_ + "/runtime.log");
    std::string text = log.ok() ? *log : "";
    while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
    if (!runtime_->Running() && text.starts_with("strata-nsexec:")) return Error(EIO, text);  // (the root, before the runtime)
    if (!runtime_->Running() && !text.empty()) return Error(EIO, StrCat(runtime_path_, " failed to start the agent: ", text));
    return ready.Annotate("start the sandbox's agent");
  }
  if (node_.managed) {
    // `run --detach` returns right after the container started; reap it.
    auto exit = runtime_->Wait();
    if (!exit.ok() || !exit->success()) return Error(EIO, StrCat(runtime_path_, " run --detach failed after the agent started"));
    runtime_.reset();
  }
  timer.Step("mount root, start runtime and agent");
  return OkStatus();
}

void ContainerBackend::Adopt(const json& state) {
  runtime_path_ = state.value("runtime", node_.runtime);
  // A root still mounted here is an older daemon's habit (before
  // 2026-12-03 every root stayed, until 2026-12-07 the roots of creates in
  // flight): a container that runs has its own, so ours goes now.
  if (IsMountPoint(rootfs_)) {
    Status s = MountPoint::Adopt(rootfs_).Unmount();
    if (!s.ok()) STRATA_LOG(kWarn) << "sandbox " << id_ << ": " << s.ToString();
  }
  if (auto uppers = UpperStore::Open(node_.uppers); uppers.ok()) {
    if (auto volume = uppers->Adopt(id_); volume.ok()) upper_.emplace(std::move(*volume));
  }
}

bool ContainerBackend::Alive(AgentClient& agent, bool paused) {
  if (paused) {
    // A frozen agent cannot answer: ask the runtime instead.
    auto state = RunCommand({.argv = {runtime_path_, "state", id_}, .timeout = std::chrono::seconds(10)});
    if (!state.ok() || !state->success()) return false;
    json j = json::parse(state->out, nullptr, false);
    return j.is_object() && j.value("status", "") == "paused";
  }
  return agent.Ping().ok();
}

// Not a ping: a take does not wait for the thread an idle agent starts to
// answer one. An agent that holds its socket is there; one that is there
// and hangs is not told apart (its taker's first command times out).
bool ContainerBackend::Takeable(AgentClient& agent) { return agent.Accepts(); }

Status ContainerBackend::Pause() {
  return RunChecked({.argv = {runtime_path_, "pause", id_}, .timeout = std::chrono::seconds(30)}, "pause sandbox " + id_).status();
}

Status ContainerBackend::Resume() {
  return RunChecked({.argv = {runtime_path_, "resume", id_}, .timeout = std::chrono::seconds(30)}, "resume sandbox " + id_).status();
}

std::string ContainerBackend::CgroupDir(const std::string& controller) const {
  return StrCat("/sys/fs/cgroup/", controller, "/", node_.cgroup_parent, "/", id_);
}

bool ContainerBackend::OomKilled(AgentClient&) const {
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

Result<UpperVolume> ContainerBackend::CaptureUpper(AgentClient&, bool paused, const std::string& name) {
  if (!upper_) return Error(ENOTSUP, StrCat("snapshot: sandbox ", id_, " has no upper volume"));
  if (!paused) return Error(EINVAL, StrCat("snapshot: sandbox ", id_, " is not paused"));
  STRATA_ASSIGN_OR_RETURN(UpperStore store, UpperStore::Open(node_.uppers));
  return store.Snapshot(*upper_, name);
}

Status ContainerBackend::Destroy(AgentClient* agent) {
  if (destroyed_) return OkStatus();
  destroyed_ = true;
  StepTimer timer(id_, fncall_ ? "fncall destroy" : "container destroy");
  FirstError errors("sandbox " + id_);
  if (node_.managed) {
    if (agent) agent->Shutdown().IgnoreError();
    runtime_.reset();
    RunCommand({.argv = {runtime_path_, "delete", "--force", id_}, .timeout = std::chrono::seconds(10)}).status().IgnoreError();
    timer.Step("stop runtime");
  } else if (runtime_) {
    if (runtime_->Running() && agent) agent->Shutdown().IgnoreError();
    if (runtime_->RunningAfter(std::chrono::seconds(1))) {
      RunCommand({.argv = {runtime_path_, "kill", id_, "KILL"}, .timeout = std::chrono::seconds(10)}).status().IgnoreError();
      runtime_->RunningAfter(std::chrono::seconds(5));
    }
    runtime_.reset();  // kills and reaps whatever is left of the runtime's group
    timer.Step("stop runtime");
  }
  // `run` deletes the container when its init exits; if the runtime died
  // first its state is still there.
  if (::access(StrCat("/run/", Basename(runtime_path_), "/", id_).c_str(), F_OK) == 0) {
    RunCommand({.argv = {runtime_path_, "delete", "--force", id_}, .timeout = std::chrono::seconds(10)}).status().IgnoreError();
  }
  errors.Note(RemoveSandboxDev(id_));  // (first: its pages would keep the memory cgroup, dying)
  RemoveSandboxCgroups(node_.cgroup_parent + "/" + id_);
  timer.Step("clean up runtime state");
  if (upper_) {
    errors.Note(upper_->Destroy());
    upper_.reset();
  }
  timer.Step("delete upper volume");
  return errors.Take();
}

void ContainerBackend::Release() {
  destroyed_ = true;
  if (upper_) upper_->Release();
  upper_.reset();
  if (runtime_) runtime_->Detach();
  runtime_.reset();
}

}  // namespace strata::launcher
