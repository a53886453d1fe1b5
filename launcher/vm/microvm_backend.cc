// MicroVmBackend: upper disk, guest, boot.
#include "launcher/vm/microvm_backend.h"

#include <unistd.h>

#include <cmath>
#include <memory>
#include <thread>

#include "common/crypto.h"
#include "common/log.h"
#include "common/strings.h"
#include "launcher/protocol/layout.h"
#include "launcher/sandbox/seccomp.h"
#include "launcher/net/netns.h"
#include "launcher/net/policy.h"
#include "launcher/vm/vm_templates.h"
#include "vmm/guest_files.h"

namespace strata::launcher {

using nlohmann::json;

Status AddMicroVmBackend(BackendTable& table) {
  return table.Add({
      .name = "microvm",
      .make = [](const NodeConfig& node, const std::string& id, const std::string& dir) -> std::unique_ptr<Backend> {
        return std::make_unique<MicroVmBackend>(node, id, dir);
      },
      .available = [](const NodeConfig& node) -> Status {
        if (::access(node.vm_kernel.c_str(), R_OK) != 0) return ErrnoError(errno, "microvm: guest kernel " + node.vm_kernel);
        if (node.jail_binary.empty()) return Error(ENOENT, "microvm: no strata-jail beside the launcher (set STRATA_JAIL)");
        return OkStatus();
      },
      .memory_commit = [](const SandboxSpec& spec) {
        return (spec.limits.memory ? spec.limits.memory : kDefaultVmMemory) + kVmOverheadCommit;
      },
      // The upper is inside the guest's disk image, with the guest's own ids.
      .open_upper = [](const NodeConfig&, const UpperVolume& captured, const std::string& scratch) -> Result<OpenedUpper> {
        STRATA_ASSIGN_OR_RETURN(MountPoint disk, MountVmDisk(captured.path() + "/disk.img", scratch));
        OpenedUpper opened;
        opened.dir = disk.target() + "/upper";
        opened.id_base = 0;
        opened.id_count = 65536;
        opened.mount = std::move(disk);
        return opened;
      },
      .warm_pools = true,
      .warm_up = true,
      .machine = true,
  });
}

MicroVmBackend::MicroVmBackend(NodeConfig node, std::string id, std::string dir)
    : node_(std::move(node)), id_(std::move(id)), dir_(std::move(dir)) {}

Status MicroVmBackend::Start(const BackendStart& start) {
  const SandboxSpec& spec = start.spec;
  StepTimer timer(id_, "microvm create");
  if (spec.network.mode == NetMode::kHost) return Error(ENOTSUP, "network mode host: a microVM cannot share the node's network");
  if (start.layers.size() > kMaxVmLayers) {
    return Error(E2BIG, StrCat("microVM: ", start.layers.size(), " layers; a microVM takes at most ", kMaxVmLayers,
                               " (two disks each, in microvm's 24 virtio-mmio slots): squash some with packdiff"));
  }
  if (node_.jail_binary.empty()) return Error(ENOENT, "find strata-jail: not beside the launcher nor in /usr/local/lib/strata (set STRATA_JAIL)");
  MicroVmSpec vm;
  vm.id = id_;
  vm.dir = dir_;
  vm.agent_socket = dir_ + "/agent/" + kAgentSocketName;
  for (const auto& layer : start.layers) {
    if (!layer.contains("meta") || !layer.contains("blob")) {
      return Error(EPROTO, "microVM: the lazyfs daemon did not name the layer's files (an older lazyfs: upgrade it)");
    }
    vm.layers.push_back({layer["meta"].get<std::string>(), layer["blob"].get<std::string>()});
  }
  // The upper disk: a ready-made ext4 image of --disk bytes (or the copy
  // a template keeps), reflinked into a volume of its own (whose quota
  // allows the image and some metadata).
  STRATA_ASSIGN_OR_RETURN(UpperStore uppers, UpperStore::Open(node_.uppers));
  STRATA_ASSIGN_OR_RETURN(std::string image, vmm::EnsureExt4Template(node_.uppers + "/.vm-templates", spec.disk));
  STRATA_ASSIGN_OR_RETURN(UpperVolume volume, uppers.Create(id_, spec.disk + (uint64_t{64} << 20), 0, 0));
  upper_.emplace(std::move(volume));
  vm.upper_disk = upper_->path() + "/disk.img";
  // The console too: the guest writes it at will, and the volume's quota
  // bounds it.
  vm.console_log = upper_->path() + "/console.log";
  // The initramfs carries the commands' seccomp program (a container's
  // agent finds it in its socket directory).
  STRATA_ASSIGN_OR_RETURN(std::string command_bpf, CommandSeccompProgram(node_, /*agent_filtered=*/false));
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
  std::optional<SandboxNet> net;
  if (spec.network.routed()) {
    STRATA_ASSIGN_OR_RETURN(net, start.attach_network());
    if (!net->ns) return Error(EINVAL, "network of sandbox " + id_ + ": no namespace held");
    STRATA_ASSIGN_OR_RETURN(tap, OpenGuestTap(net->ns->get(), net->address));
    vm.tap_fd = tap.get();
    timer.Step("network");
  }
  // A template of this stack and shape: the guest resumes from it.
  const VmTemplates templates(node_.uppers + "/.vm-templates/saved", node_.vm_templates);
  const std::string key = MicroVm::TemplateKey(vm, spec.disk);
  std::optional<VmTemplate> from = templates.Find(key);
  if (from) {
    // Both files copied from the one template found (its directory is held
    // open): a state never meets another template's disk.
    const std::string state = upper_->path() + "/vm-state";
    if (vmm::CloneFile(from->disk, vm.upper_disk).ok() && vmm::CloneFile(from->state, state).ok()) {
      vm.restore_state = state;
    } else {  // (removed meanwhile: boot)
      ::unlink(vm.upper_disk.c_str());
      ::unlink(state.c_str());
      from.reset();
    }
  }
  if (!from) STRATA_RETURN_IF_ERROR(vmm::CloneFile(image, vm.upper_disk).Annotate("microVM upper disk"));
  timer.Step("upper disk");
  STRATA_RETURN_IF_ERROR(
      MergeSandboxState(dir_, {{"vm", {{"accel", vm.accel}, {"kernel", vm.kernel}, {"template", from ? key : ""}}}}));
  auto started = MicroVm::Start(vm);
  if (!vm.restore_state.empty()) ::unlink(vm.restore_state.c_str());  // (QEMU read it, or is gone)
  if (!started.ok() && from) {
    // A guest that did not resume boots. A state QEMU refused (EBADMSG)
    // is dropped, if it is still the key's.
    STRATA_LOG(kWarn) << "sandbox " << id_ << ": microVM template " << key << " did not resume, booting instead: "
                      << started.status().ToString();
    if (started.status().code() == EBADMSG) templates.Drop(*from);
    from.reset();
    vm.restore_state.clear();
    ::unlink(vm.upper_disk.c_str());
    STRATA_RETURN_IF_ERROR(vmm::CloneFile(image, vm.upper_disk).Annotate("microVM upper disk"));
    STRATA_RETURN_IF_ERROR(MergeSandboxState(dir_, {{"vm", {{"accel", vm.accel}, {"kernel", vm.kernel}, {"template", ""}}}}));
    started = MicroVm::Start(vm);
  }
  if (!started.ok()) return started.status();
  vm_ = std::move(*started);
  tap.reset();  // (QEMU holds it: the tap goes with QEMU)
  timer.Step(from ? "resume the guest from its template" : "start the guest");
  // Booting under TCG on a busy node takes seconds; a guest that died
  // fails at once, with its console's last words.
  const auto until = std::chrono::steady_clock::now() + node_.vm_boot_timeout;
  Status ready;
  while (true) {
    STRATA_RETURN_IF_ERROR(Gone().Annotate("boot"));
    ready = start.agent.WaitReady(std::chrono::seconds(2));
    if (ready.ok() || std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!ready.ok()) {
    std::string why = vm_->Why();
    return Error(ETIMEDOUT, StrCat("microVM: the guest's agent did not answer within ", node_.vm_boot_timeout.count(),
                                   " s (boot)", why.empty() ? "" : "; its console: " + why));
  }
  timer.Step("boot the guest");
  // A guest that booted, before it learns whose it is, becomes its key's
  // template if it has none.
  if (!from) {
    if (auto claim = templates.Begin(key)) {
      Status saved = vm_->Save(claim->state_path());
      if (saved.ok()) saved = vmm::CloneFile(vm.upper_disk, claim->disk_path());
      STRATA_RETURN_IF_ERROR(vm_->Resume().Annotate("resume the microVM after saving its template"));
      if (saved.ok()) saved = claim->Publish();
      if (!saved.ok()) STRATA_LOG(kWarn) << "sandbox " << id_ << ": make the microVM template " << key << ": " << saved.ToString();
      timer.Step("save the template");
    }
  }
  // Who it is: its name, the node's clock (a restored guest's stopped when
  // it was saved), fresh entropy (a restored guest's random state is the
  // template's), and its network.
  STRATA_ASSIGN_OR_RETURN(std::string entropy, RandomBytes(64));
  json identity = {{"hostname", id_},
                   {"time_ns", std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count()},
                   {"entropy", HexEncode(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(entropy.data()), entropy.size()))}};
  if (net) {
    identity["net"] = {{"address", Ipv4ToString(net->address)}, {"gateway", Ipv4ToString(node_.network->config().gateway())}};
  }
  STRATA_RETURN_IF_ERROR(start.agent.Identify(identity).Annotate("microVM: give the guest its identity"));
  timer.Step("identity");
  return OkStatus();
}

void MicroVmBackend::Adopt(const json&) {
  adopted_ = true;
  if (auto uppers = UpperStore::Open(node_.uppers); uppers.ok()) {
    if (auto volume = uppers->Adopt(id_); volume.ok()) upper_.emplace(std::move(*volume));
  }
  // Its guest, and a relay for its channel in this process. A guest that
  // is gone leaves a sandbox whose calls fail and whose destroy cleans up.
  auto vm = MicroVm::Adopt(dir_, dir_ + "/agent/" + kAgentSocketName);
  if (vm.ok()) vm_ = std::move(*vm);
  else STRATA_LOG(kWarn) << "adopt sandbox " << id_ << ": " << vm.status().ToString();
}

Status MicroVmBackend::Gone() const {
  if (vm_ && vm_->Running()) return OkStatus();
  if (!vm_ && adopted_) return Error(EHOSTDOWN, StrCat("sandbox ", id_, ": its microVM is gone (its QEMU had exited when the daemon took it over)"));
  if (!vm_) return Error(EHOSTDOWN, StrCat("sandbox ", id_, ": its microVM is not running"));
  const std::string why = vm_->Why();
  return Error(EHOSTDOWN, StrCat("sandbox ", id_, ": its microVM is gone (QEMU exited)", why.empty() ? "" : "; its console ended: " + why));
}

bool MicroVmBackend::Alive(AgentClient& agent, bool paused) {
  if (!vm_ || !vm_->Running()) return false;
  return paused || agent.Ping().ok();
}

Status MicroVmBackend::Pause() {
  STRATA_RETURN_IF_ERROR(Gone());
  return vm_->Pause().Annotate("pause sandbox " + id_);
}

Status MicroVmBackend::Resume() {
  STRATA_RETURN_IF_ERROR(Gone());
  return vm_->Resume().Annotate("resume sandbox " + id_);
}

bool MicroVmBackend::OomKilled(AgentClient& agent) const {
  // The guest's own OOM killer (its RAM is the limit): its counter.
  auto vmstat = agent.Get("/proc/vmstat");
  if (!vmstat.ok()) return false;
  for (const auto& line : Split(*vmstat, '\n')) {
    if (line.rfind("oom_kill ", 0) == 0) return std::strtoull(line.c_str() + 9, nullptr, 10) > 0;
  }
  return false;
}

Result<UpperVolume> MicroVmBackend::CaptureUpper(AgentClient& agent, bool paused, const std::string& name) {
  if (!upper_) return Error(ENOTSUP, StrCat("snapshot: sandbox ", id_, " has no upper volume"));
  STRATA_ASSIGN_OR_RETURN(UpperStore store, UpperStore::Open(node_.uppers));
  // The guest's filesystem frozen (its dirty pages written), the disk image
  // reflinked by a btrfs snapshot, thawed. A paused guest cannot freeze: it
  // runs for as long as that takes.
  STRATA_RETURN_IF_ERROR(Gone());
  if (paused) STRATA_RETURN_IF_ERROR(vm_->Resume().Annotate("snapshot: resume for the freeze"));
  Status frozen = agent.Freeze(true);
  auto snapshot = frozen.ok() ? store.Snapshot(*upper_, name) : Result<UpperVolume>(frozen.Annotate("snapshot: freeze the guest's upper disk"));
  // A thaw after every freeze asked for, also one that failed or timed
  // out: the agent may have frozen after we stopped waiting, and a frozen
  // filesystem hangs every writer in the guest.
  Status thawed = agent.Freeze(false);
  if (!thawed.ok()) thawed = agent.Freeze(false);
  if (paused) {
    Status paused_again = vm_->Pause();
    if (!paused_again.ok() && snapshot.ok()) return paused_again.Annotate("snapshot: pause again");
  }
  if (!thawed.ok() && snapshot.ok() && frozen.ok()) return thawed.Annotate("snapshot: thaw the guest's upper disk");
  return snapshot;
}

Status MicroVmBackend::Destroy(AgentClient*) {
  if (destroyed_) return OkStatus();
  destroyed_ = true;
  StepTimer timer(id_, "microvm destroy");
  FirstError errors("sandbox " + id_);
  // The guest: QEMU quits at once (nothing in the guest outlives it: its
  // disk goes with the upper volume), and is killed if it does not. One
  // adopted without its guest, or that failed before it started, has its
  // QEMU killed with its cgroups.
  if (vm_) {
    errors.Note(vm_->Stop());
    vm_.reset();
    timer.Step("stop the microVM");
  }
  RemoveSandboxCgroups(node_.cgroup_parent + "/" + id_);
  timer.Step("remove cgroups");
  if (upper_) {
    errors.Note(upper_->Destroy());
    upper_.reset();
  }
  timer.Step("delete upper volume");
  return errors.Take();
}

void MicroVmBackend::Release() {
  destroyed_ = true;
  if (vm_) vm_->Release();
  vm_.reset();
  if (upper_) upper_->Release();
  upper_.reset();
}

}  // namespace strata::launcher
