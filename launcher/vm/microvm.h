// MicroVm: what runs a microVM sandbox's root — the guest (vmm's QEMU,
// jailed, in cgroups of its own) and the relay that turns each connection
// to the sandbox's agent socket into a stream of the guest's one channel,
// so the agent protocol (AgentClient) is the same as a container's.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mount.h"
#include "launcher/protocol/stream_mux.h"
#include "common/unique_fd.h"
#include "vmm/hypervisor.h"

namespace strata::launcher {

// Guest RAM when --memory is not given.
inline constexpr uint64_t kDefaultVmMemory = uint64_t{256} << 20;
// What a microVM takes beside its guest RAM (QEMU; vmm::QemuOverhead under TCG).
inline constexpr uint64_t kVmOverheadCommit = uint64_t{160} << 20;


// A layer as the guest gets it: its two files on lazyfs's node-wide mount.
struct VmLayer {
  std::string meta, blob;
};

struct MicroVmSpec {
  std::string id;           // the sandbox's
  std::string dir;          // the sandbox's directory (vm/ holds the guest's state)
  std::string agent_socket; // where AgentClient connects
  std::vector<VmLayer> layers;  // bottom first
  std::string upper_disk;   // ext4 image, read-write
  std::string console_log;  // where a quota bounds it
  std::string kernel, initramfs, jail_binary;
  std::string accel = "tcg";
  int cpus = 1;
  double cpu_quota = 0;     // cores; 0: none
  uint64_t memory = 0;      // guest RAM
  std::string cgroup;       // relative: "<parent>/<id>"
  // A network (launcher/net/netns.h, OpenGuestTap): the tap the caller
  // holds open until Start returns; tap_fd < 0: loopback only. (The guest
  // takes its address from AgentClient::Identify.)
  int tap_fd = -1;
  // A template's state (VmTemplates) to resume instead of booting; the
  // upper disk must then be a copy of the template's.
  std::string restore_state;
};

// Disks are two per layer and one upper in microvm's 24 virtio-mmio slots
// (the agent channel, the RNG and a network card take three): at most this
// many layers.
inline constexpr size_t kMaxVmLayers = 10;

class MicroVm {
 public:
  // Makes its cgroups, starts the guest and the relay; returns at once
  // (the caller waits for the agent). Nothing is left on error.
  static Result<std::unique_ptr<MicroVm>> Start(const MicroVmSpec& spec);
  // Names what a guest of `spec` depends on (kernel, initramfs, QEMU,
  // accelerator, shape, layers, an upper disk of `disk_bytes`): a state
  // saved from one resumes as any other of the same key.
  static std::string TemplateKey(const MicroVmSpec& spec, uint64_t disk_bytes);
  // The guest of a sandbox started by an earlier launcher; ENOENT if gone.
  static Result<std::unique_ptr<MicroVm>> Adopt(const std::string& dir, const std::string& agent_socket);
  ~MicroVm();

  bool Running() { return guest_->Running(); }
  Status Pause() { return guest_->Pause(); }
  Status Resume() { return guest_->Resume(); }
  // Saves the whole guest to `path` (vmm::Guest::Save): it stays paused.
  Status Save(const std::string& path);
  // Stops the guest and the relay (the cgroups are the caller's to remove).
  Status Stop();
  // Leaves the guest running (a restarted daemon adopts it); the relay stops.
  void Release();
  // Why the guest is gone, from its console ("" when nothing was printed).
  std::string Why() const;

 private:
  MicroVm() = default;
  Status StartRelay(const std::string& agent_socket);
  void Relay();

  std::unique_ptr<vmm::Guest> guest_;
  UniqueFd listener_;
  std::unique_ptr<StreamMux> mux_;
  std::atomic<bool> stopping_{false};
  std::thread relay_;
};

// Mounts a copy of a microVM's upper disk (a snapshot's) read-only at
// `target` (made if missing) through a read-only loop device that goes
// away with the mount.
Result<MountPoint> MountVmDisk(const std::string& image, const std::string& target);

// The cgroups of a microVM's QEMU (memory: RAM plus QEMU's overhead; CPU
// quota; pids), made under `relative` in each hierarchy; returns their
// cgroup.procs files.
Result<std::vector<std::string>> MakeVmCgroups(const std::string& relative, uint64_t memory_limit, double cpu_quota);

}  // namespace strata::launcher
