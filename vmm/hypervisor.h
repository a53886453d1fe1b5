// The hypervisor as the microVM back end sees it: start a guest from a
// kernel, an initramfs and a command line, with disks, an agent channel and
// limits; pause, resume, stop; find it again after the launcher restarts.
// QemuHypervisor (qemu.h) implements it; docs/vmm.md maps Firecracker and
// Cloud Hypervisor onto the same calls.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"

namespace strata::vmm {

struct GuestDisk {
  std::string path;       // opened by the launcher (root) and handed over
  bool read_only = true;
  std::string serial;     // how the guest tells the disks apart (<= 20 bytes)
};

// A network card: a tap device the caller opened (and keeps open until
// Start returns), handed to the hypervisor as a descriptor.
struct GuestNic {
  int tap_fd = -1;
  std::string mac;        // "52:54:00:xx:xx:xx"
};

// Where the hypervisor runs: as its own uid, in cgroups the caller made
// (their cgroup.procs files), in a root made in `root_dir` (an empty
// directory) that holds only the system's /usr and what the guest needs.
struct Jail {
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;       // e.g. the kvm group
  std::vector<std::string> cgroups;
  std::string root_dir;
  std::string jail_binary;         // strata-jail
};

struct GuestSpec {
  std::string name;                // for QEMU's -name and logs
  std::string kernel, initramfs, cmdline;
  std::vector<GuestDisk> disks;
  std::optional<GuestNic> nic;     // none: the guest has loopback only
  int cpus = 1;
  uint64_t memory = uint64_t{256} << 20;
  // Holds the guest's sockets (QMP, the agent channel) and its console log.
  std::string state_dir;
  // Where the console goes (default: state_dir/console.log). The guest
  // writes it at will: put it where a quota bounds it.
  std::string console_log;
  std::string accel = "tcg";       // "kvm" or "tcg"
  Jail jail;
  // A state Guest::Save wrote, of a guest of this same spec but its name,
  // network card address and writable disks' paths: the guest resumes
  // from it instead of booting (its writable disks must hold what the
  // saved guest's held when it was saved). Empty: boot.
  std::string restore_state;
};

class Guest {
 public:
  virtual ~Guest() = default;
  // The unix socket on which the guest's agent channel (one byte stream to
  // its virtio-serial port) is reached. One connection at a time.
  virtual std::string channel_path() const = 0;
  // Whether the hypervisor process still runs.
  virtual bool Running() = 0;
  // Stops and continues every vCPU (the whole machine).
  virtual Status Pause() = 0;
  virtual Status Resume() = 0;
  // Writes the whole machine's state (RAM and devices) to `path` and
  // leaves the guest paused, its disks flushed: a copy of each writable
  // disk made now belongs with the state. Resume() continues the guest.
  virtual Status Save(const std::string& path, Duration deadline) = 0;
  // Ends the guest: asks the hypervisor to quit, kills it after `grace`,
  // waits until it is gone. Idempotent.
  virtual Status Stop(Duration grace) = 0;
  // Lets go without stopping it (a restarted launcher adopts it).
  virtual void Release() = 0;
  // The last lines the guest's console printed (why it died, for errors).
  virtual std::string ConsoleTail(size_t max_bytes = 2048) const = 0;
};

class Hypervisor {
 public:
  virtual ~Hypervisor() = default;
  // Starts a guest; returns once the hypervisor answers its control
  // channel (the guest may still be booting), or, restoring a saved state,
  // once the guest runs again (EBADMSG: the state did not load). Nothing
  // is left behind on error.
  virtual Result<std::unique_ptr<Guest>> Start(const GuestSpec& spec) = 0;
  // A guest started earlier with this `state_dir`; ENOENT when it is gone.
  virtual Result<std::unique_ptr<Guest>> Adopt(const std::string& state_dir) = 0;
};

}  // namespace strata::vmm
