// Sandbox: compose, start, run, tear down.
#include "launcher/sandbox/sandbox.h"

#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include "common/fs.h"
#include "common/log.h"
#include "common/subprocess.h"
#include "common/strings.h"
#include "launcher/sandbox/backend.h"
#include "launcher/protocol/layout.h"
#include "launcher/sandbox/ids.h"
#include "launcher/sandbox/seccomp.h"
#include "lazyfs/client.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

// The spec as state.json keeps it (Adopt reads it back).
json SpecState(const SandboxSpec& spec) {
  return {{"layers", spec.layers},
          {"backend", spec.backend},
          {"runtime", spec.runtime},
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

namespace {

std::string SelfDir() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = '\0';
  return Dirname(buf);
}

bool ProcessAlive(pid_t pid) { return pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM); }

const char* const kControllers[] = {"memory", "cpu", "cpuacct", "cpuset", "pids", "devices", "freezer", "blkio",
                                    "hugetlb", "systemd", "unified", "net_cls", "net_prio", "perf_event", "rdma", "misc"};

}  // namespace

// (The runtime normally has removed them; a cgroup stays busy until its
// last process is reaped.)
void RemoveSandboxCgroups(const std::string& relative) {
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

Result<const BackendKind*> FindBackend(const NodeConfig& node, const std::string& name) {
  if (!node.backends) return Error(ENOTSUP, "backend " + Quote(name) + ": this launcher offers no back ends");
  return node.backends->Find(name);
}

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
  if (auto v = env("STRATA_RUNTIMES"); !v.empty()) {
    n.runtimes = Split(v, ',');
  } else {
    for (const char* name : {"crun", "runc"}) {
      if (!FindProgram(name).empty()) n.runtimes.push_back(name);
    }
  }
  if (auto v = env("STRATA_CGROUP_PARENT"); !v.empty()) n.cgroup_parent = v;
  if (auto v = env("STRATA_AGENT"); !v.empty()) n.agent_binary = v;
  if (auto v = env("STRATA_NSEXEC"); !v.empty()) n.nsexec_binary = v;
  if (auto v = env("STRATA_IDMAP"); !v.empty()) {
    auto m = IdMapping::Parse(v);
    if (m.ok()) n.idmap = *m;
  }
  for (auto [binary, name] : {std::pair{&n.agent_binary, "strata-agent"}, std::pair{&n.nsexec_binary, "strata-nsexec"}}) {
    if (!binary->empty()) continue;
    for (const std::string& candidate : {StrCat(SelfDir(), "/", name), StrCat("/usr/local/lib/strata/", name)}) {
      if (::access(candidate.c_str(), X_OK) == 0) {
        *binary = candidate;
        break;
      }
    }
  }
  if (auto v = env("STRATA_VM_KERNEL"); !v.empty()) n.vm_kernel = v;
  if (auto v = env("STRATA_VM_ACCEL"); !v.empty()) n.vm_accel = v;
  if (auto v = env("STRATA_JAIL"); !v.empty()) n.jail_binary = v;
  if (auto v = env("STRATA_VM_TEMPLATES"); !v.empty()) n.vm_templates = static_cast<size_t>(std::max(0, std::atoi(v.c_str())));
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

std::vector<std::string> NodeConfig::RuntimeNames() const {
  std::vector<std::string> names = {Basename(runtime)};
  for (const auto& r : runtimes) {
    if (!r.empty() && std::find(names.begin(), names.end(), Basename(r)) == names.end()) names.push_back(Basename(r));
  }
  return names;
}

Result<std::string> NodeConfig::RuntimeFor(const std::string& requested) const {
  if (requested.empty() || requested == runtime || requested == Basename(runtime)) return runtime;
  // By name only: a path is not a name any entry has, so it is refused
  // like any program the node does not offer.
  for (const auto& r : runtimes) {
    if (requested == Basename(r) && requested.find('/') == std::string::npos) return r;
  }
  return Error(EINVAL, StrCat("runtime ", Quote(requested), ": this node offers ", JoinOr(RuntimeNames()),
                              " (an OCI runtime it runs is installed and named in STRATA_RUNTIMES)"));
}


Result<std::string> CommandSeccompProgram(const NodeConfig& node, bool agent_filtered) {
  STRATA_ASSIGN_OR_RETURN(std::string bpf64, CompiledSeccompBase64(agent_filtered ? CommandOnAgentSeccompProfile() : DefaultSeccompProfile(),
                                                                   JoinPath(Dirname(node.run_dir), "seccomp")));
  auto bpf = Base64Decode(bpf64);
  if (!bpf) return Error(EINVAL, "seccomp cache: not base64");
  return std::move(*bpf);
}

Status MergeSandboxState(const std::string& dir, const json& changes) {
  auto text = ReadFileToString(dir + "/state.json");
  json state = text.ok() ? json::parse(*text, nullptr, false) : json::object();
  if (!state.is_object()) state = json::object();
  state.update(changes);
  return WriteFileAtomic(dir + "/state.json", state.dump(), false);
}

Result<std::unique_ptr<Sandbox>> Sandbox::Create(const SandboxSpec& spec, const NodeConfig& node) {
  std::unique_ptr<Sandbox> sb(new Sandbox());
  sb->node_ = node;
  sb->spec_ = spec;
  sb->id_ = spec.id.empty() ? NewSandboxId(node.name) : spec.id;
  sb->dir_ = JoinPath(node.run_dir, sb->id_);
  Status s = sb->Start(spec);
  if (!s.ok()) {
    Status cleanup = sb->Destroy();
    if (!cleanup.ok()) STRATA_LOG(kWarn) << "clean up after a failed start: " << cleanup.ToString();
    return s.Annotate("create sandbox " + sb->id_);
  }
  return sb;
}

Status Sandbox::Start(const SandboxSpec& spec) {
  StepTimer timer(id_, "create");
  if (node_.agent_binary.empty()) {
    return Error(ENOENT, "find strata-agent: not beside the launcher nor in /usr/local/lib/strata (set STRATA_AGENT)");
  }
  STRATA_ASSIGN_OR_RETURN(kind_, FindBackend(node_, spec.backend));
  STRATA_ASSIGN_OR_RETURN(spec_.runtime, RuntimeOf(*kind_, node_, spec.runtime));
  backend_ = kind_->make(node_, id_, dir_);
  STRATA_RETURN_IF_ERROR(MakeDirs(dir_ + "/agent", 0711));
  // Who owns the sandbox: a sweep removes it once this process is gone
  // (unless a daemon manages it), and a restarted daemon re-adopts it.
  created_ = static_cast<int64_t>(::time(nullptr));
  store_url_ = cache::DefaultStoreUrl(spec.store);
  json state = {{"id", id_},
                {"pid", ::getpid()},
                {"managed", node_.managed},
                {"uppers", node_.uppers},
                {"lazyfs_socket", node_.lazyfs_socket},
                {"runtime", spec_.runtime.empty() ? node_.runtime : spec_.runtime},
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

  // 2. Each layer mounted once per node by lazyfs (for a container
  //    idmapped for the node's range; a guest reads the files as they
  //    are); the whole stack in one request (the daemon starts on first use).
  json refs = json::array();
  for (const auto& layer : stack_) refs.push_back(layer.digest.Hex());
  json acquire = {{"refs", refs}, {"store", store->url()}, {"holder", id_}};
  if (backend_->IdmappedLayers()) acquire["idmap"] = node_.idmap.ToString();
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
  timer.Step("acquire layers from lazyfs");

  // 3. The root over them, and the agent in it (the back end's).
  agent_ = std::make_unique<AgentClient>(dir_ + "/agent/" + kAgentSocketName);
  agent_->SetRulePaths(spec.files);
  STRATA_RETURN_IF_ERROR(backend_->Start({.spec = spec_,
                                          .layers = (*acquired)["layers"],
                                          .agent = *agent_,
                                          .attach_network = [this, &spec] { return AttachNetwork(spec.network); }}));
  // Its processes (a container's, or QEMU's tap) hold its network
  // namespace now: it goes with them (and its veth with it).
  if (net_) net_->ns.reset();
  return OkStatus();
}

void Sandbox::FillDefaults(ExecRequest& request) const {
  request.isolate = kind_ && kind_->calls;
  // A call of a pool with a network of its own keeps it (the policy is
  // the pool's); otherwise each call gets loopback only.
  request.isolate_network = spec_.network.mode == NetMode::kNone;
  if (request.env.empty()) {
    request.env = spec_.env;
  } else if (request.merge_env) {
    std::set<std::string> given;
    for (const auto& kv : request.env) given.insert(kv.substr(0, kv.find('=')));
    std::vector<std::string> env;
    for (const auto& kv : spec_.env) {
      if (!given.count(kv.substr(0, kv.find('=')))) env.push_back(kv);
    }
    env.insert(env.end(), request.env.begin(), request.env.end());
    request.env = std::move(env);
  }
  if (request.cwd.empty()) request.cwd = spec_.workdir.empty() ? "/" : spec_.workdir;
  if (!request.grader) request.files = MergeFileRules(spec_.files, request.files);
  if (!request.kill_leftovers) request.kill_leftovers = spec_.kill_leftovers;
}

Result<int> Sandbox::AgentVersion() {
  int version = agent_version_.load();
  if (version == 0) {
    STRATA_ASSIGN_OR_RETURN(nlohmann::json ping, agent_->Ping());
    version = ping.value("version", 1);
    agent_version_ = version;
  }
  return version;
}

Status Sandbox::CheckAgentFor(const ExecRequest& request) {
  if (request.files.empty() && request.user.empty() && !request.pty) return OkStatus();
  STRATA_ASSIGN_OR_RETURN(int version, AgentVersion());
  if (request.pty && version < 7) {
    return Error(ENOTSUP, StrCat("sandbox ", id_, ": its agent speaks protocol ", version,
                                 " and would run the command without a terminal; a pty needs 7 (a sandbox created by this strata)"));
  }
  if (!request.user.empty() && version < 6) {
    return Error(ENOTSUP, StrCat("sandbox ", id_, ": its agent speaks protocol ", version,
                                 " and cannot run a command as a user; that needs 6 (a sandbox created by this strata)"));
  }
  if (request.files.empty()) return OkStatus();
  if (version < 3) {
    return Error(ENOTSUP, StrCat("sandbox ", id_, ": its agent speaks protocol ", version,
                                 " and would ignore file rules; they need 3 (a sandbox created by this strata)"));
  }
  return OkStatus();
}

Result<ExecResult> Sandbox::Exec(ExecRequest request, const OutputSink& sink) {
  FillDefaults(request);
  STRATA_RETURN_IF_ERROR(backend_->Gone());
  STRATA_RETURN_IF_ERROR(CheckAgentFor(request));
  auto result = agent_->Exec(request, sink);
  if (!result.ok()) {
    Status gone = backend_->Gone();
    if (!gone.ok()) return gone;
  }
  return result;
}


Result<SandboxNet> Sandbox::AttachNetwork(const NetPolicy& policy) {
  if (!node_.network && node_.managed) {
    return Error(ENOTSUP, StrCat("network mode ", NetModeName(policy.mode), ": sandbox networks are off on this node (",
                                 node_.network_off_reason, ")"));
  }
  if (!node_.network) {
    return Error(ENOTSUP, StrCat("network mode ", NetModeName(policy.mode),
                                 " needs the launcher daemon (its DNS proxy and address pool): start `launcher serve`"));
  }
  // Recorded at once: a crash after this leaves the daemon's recovery
  // something to remove.
  STRATA_ASSIGN_OR_RETURN(SandboxNet net, node_.network->Attach(id_, policy));
  net_ = net;
  STRATA_RETURN_IF_ERROR(SaveState({{"net", net.ToJson()}}));
  return net;
}

bool Sandbox::OomKilled() const { return backend_ && agent_ && backend_->OomKilled(*agent_); }

void Sandbox::Interrupt() {
  if (agent_) agent_->Shutdown().IgnoreError();
}

Status Sandbox::Destroy() {
  if (destroyed_) return OkStatus();
  destroyed_ = true;
  StepTimer timer(id_, "destroy");
  FirstError errors("sandbox " + id_);
  if (backend_) {
    errors.Keep(backend_->Destroy(agent_.get()));  // (it logged its own)
    timer.Step("remove the root");
  }
  if (net_) {
    if (node_.network) errors.Note(node_.network->Detach(id_, *net_));
    else errors.Note(Error(ENOTSUP, "remove the network of sandbox " + id_ + ": no node network here (the daemon's recovery will)"));
    net_.reset();
    timer.Step("remove network");
  }
  if (!held_.empty()) {
    lazyfs::Client lazyfs(node_.lazyfs_socket);
    errors.Note(ReleaseLayers(lazyfs, id_, held_));
    held_.clear();
  }
  timer.Step("release layers");
  if (!dir_.empty()) errors.Note(RemoveTree(dir_));
  timer.Step("remove directory");
  return errors.Take();
}

Sandbox::~Sandbox() { Destroy().IgnoreError(); }

Result<std::unique_ptr<Sandbox>> Sandbox::Adopt(const std::string& id, const NodeConfig& node) {
  std::unique_ptr<Sandbox> sb(new Sandbox());
  sb->node_ = node;
  sb->id_ = id;
  sb->dir_ = JoinPath(node.run_dir, id);
  auto text = ReadFileToString(sb->dir_ + "/state.json");
  if (!text.ok()) return text.status().Annotate("adopt sandbox " + id);
  json state = json::parse(*text, nullptr, false);
  if (!state.is_object()) return Error(EINVAL, "adopt sandbox " + id + ": state.json is not valid JSON");
  sb->store_url_ = state.value("store", "");
  sb->created_ = state.value("created", int64_t{0});
  sb->paused_ = state.value("paused", false);
  const json spec = state.value("spec", json::object());
  sb->spec_.layers = spec.value("layers", std::vector<std::string>{});
  sb->spec_.backend = spec.value("backend", std::string(kDefaultBackend));
  // Made first: whatever fails below leaves a sandbox whose destructor
  // stops what the back end runs (a QEMU in the sandbox's cgroups too).
  auto kind = FindBackend(node, sb->spec_.backend);
  if (!kind.ok()) return kind.status().Annotate("adopt sandbox " + id);
  sb->kind_ = *kind;
  // (A sandbox of a daemon before 2026-12-07 has the runtime in its state alone.)
  sb->spec_.runtime = spec.value("runtime", std::string());
  if (sb->spec_.runtime.empty() && sb->kind_->oci_runtime) sb->spec_.runtime = state.value("runtime", node.runtime);
  sb->backend_ = sb->kind_->make(node, id, sb->dir_);
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
      auto m = catalog.SharedManifest(d);
      if (m.ok()) sb->stack_.push_back({d, std::move(*m)});
    }
  }
  sb->agent_ = std::make_unique<AgentClient>(sb->dir_ + "/agent/" + kAgentSocketName);
  sb->agent_->SetRulePaths(sb->spec_.files);
  sb->backend_->Adopt(state);
  return sb;
}

void Sandbox::Release() {
  destroyed_ = true;
  if (backend_) backend_->Release();
  held_.clear();
}

bool Sandbox::Alive() { return backend_ && agent_ && backend_->Alive(*agent_, paused_); }

bool Sandbox::Takeable() { return backend_ && agent_ && !paused_ && backend_->Takeable(*agent_); }

Status Sandbox::Pause() {
  STRATA_RETURN_IF_ERROR(backend_->Pause());
  paused_ = true;
  return SaveState({{"paused", true}});
}

Status Sandbox::Resume() {
  STRATA_RETURN_IF_ERROR(backend_->Resume());
  paused_ = false;
  return SaveState({{"paused", false}});
}

Result<UpperVolume> Sandbox::CaptureUpper() {
  const std::string name = StrCat(id_, "-", std::chrono::duration_cast<std::chrono::milliseconds>(
                                                std::chrono::system_clock::now().time_since_epoch()).count());
  if (!backend_->SnapshotsWhilePaused() || paused_) return backend_->CaptureUpper(*agent_, paused_, name);
  // Paused as any pause is (recorded: a daemon that dies meanwhile finds
  // it paused, as it is), for as short as the snapshot takes.
  STRATA_RETURN_IF_ERROR(Pause());
  auto snapshot = backend_->CaptureUpper(*agent_, true, name);
  Status resumed = Resume();
  if (!resumed.ok()) return resumed.Annotate("thaw after the snapshot");
  return snapshot;
}

json Sandbox::Assign(const SandboxSpec& spec) {
  json assignment = {{"env", spec.env},
                     {"workdir", spec.workdir},
                     {"files", spec.files.ToJson()},
                     {"kill_leftovers", spec.kill_leftovers},
                     {"created", ::time(nullptr)}};
  spec_.env = spec.env;
  spec_.workdir = spec.workdir;
  spec_.files = spec.files;
  spec_.kill_leftovers = spec.kill_leftovers;
  created_ = assignment["created"];
  agent_->SetRulePaths(spec_.files);
  return assignment;
}

Status Sandbox::Reassign(const json& assignment) {
  if (!assignment.is_object()) return Error(EINVAL, "reassign sandbox " + id_ + ": the take's record holds no settings");
  STRATA_ASSIGN_OR_RETURN(FileRules files, ParseFileRules(assignment.value("files", json()), "assigned files"));
  spec_.env = assignment.value("env", std::vector<std::string>{});
  spec_.workdir = assignment.value("workdir", std::string("/"));
  spec_.files = std::move(files);
  spec_.kill_leftovers = assignment.value("kill_leftovers", false);
  created_ = assignment.value("created", int64_t{0});
  agent_->SetRulePaths(spec_.files);
  return OkStatus();
}

Status Sandbox::SaveState(const json& changes) { return MergeSandboxState(dir_, changes); }

json Sandbox::Info() const {
  json layers = json::array();
  for (const auto& l : stack_) {
    layers.push_back({{"digest", l.digest.Hex()}, {"kind", cache::LayerKindName(l.manifest->kind)}, {"name", l.manifest->name}});
  }
  json info = {{"id", id_},
          {"backend", spec_.backend},
          {"state", destroyed_ ? "destroyed" : (paused_ ? "paused" : "running")},
          {"created", created_},
          {"layers", layers},
          {"limits", {{"cpus", spec_.limits.cpus}, {"memory", spec_.limits.memory}, {"pids", spec_.limits.pids}, {"disk", spec_.disk}}},
          {"network", NetworkSummary()},
          {"files", spec_.files.ToJson()},
          {"kill_leftovers", spec_.kill_leftovers}};
  if (!spec_.runtime.empty()) info["runtime"] = Basename(spec_.runtime);
  return info;
}

json Sandbox::Usage() const {
  const std::string cgroup = StrCat(node_.cgroup_parent, "/", id_);
  auto number = [](const Result<std::string>& text) -> std::optional<uint64_t> {
    if (!text.ok()) return std::nullopt;
    return static_cast<uint64_t>(std::strtoull(text->c_str(), nullptr, 10));
  };
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  json cpu = {{"limit", spec_.limits.cpus}};
  if (auto ns = number(ReadFileToString(StrCat("/sys/fs/cgroup/cpuacct/", cgroup, "/cpuacct.usage")))) {
    cpu["seconds"] = static_cast<double>(*ns) / 1e9;
  }
  json memory = {{"limit", spec_.limits.memory}};
  if (auto used = number(ReadFileToString(StrCat("/sys/fs/cgroup/memory/", cgroup, "/memory.usage_in_bytes")))) {
    memory["used"] = *used;
  }
  if (auto stat = ReadFileToString(StrCat("/sys/fs/cgroup/memory/", cgroup, "/memory.stat")); stat.ok()) {
    for (std::string_view line : Split(*stat, '\n')) {
      if (line.starts_with("total_cache ")) memory["cache"] = std::strtoull(std::string(line.substr(12)).c_str(), nullptr, 10);
    }
  }
  json disk = {{"limit", spec_.disk}};
  if (backend_ && backend_->upper()) {
    if (auto used = backend_->upper()->UsedBytes(); used.ok()) disk["used"] = *used;
  }
  return {{"time", now}, {"created", created_}, {"cpu", std::move(cpu)}, {"memory", std::move(memory)}, {"disk", std::move(disk)}};
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
  if (kind_ && kind_->calls) {
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
    // What its kind made beside the generic parts (a container's runtime
    // state, /dev and root); every kind's when the state does not say.
    SweepBackend(node, id, state);
    RemoveSandboxCgroups(state.is_object() ? state.value("cgroup", node.cgroup_parent + "/" + id) : node.cgroup_parent + "/" + id);
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
