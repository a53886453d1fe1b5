// QemuHypervisor: microVMs on QEMU's `microvm` machine: direct boot of an
// uncompressed vmlinux (PVH), virtio-mmio disks and one virtio-serial port,
// driven over QMP, confined by strata-jail and QEMU's own seccomp filter
// (-sandbox on). Every file QEMU uses but its kernel and initramfs is a
// descriptor the launcher opened, so the jail needs no path of the node.
#pragma once

#include <memory>
#include <string>

#include "vmm/hypervisor.h"

namespace strata::vmm {

struct QemuOptions {
  std::string binary = "/usr/bin/qemu-system-x86_64";
  // How long QEMU may take to answer QMP after it was started.
  Duration start_deadline = std::chrono::seconds(20);
  // Translated-code cache under TCG, in MiB (QEMU's default is 1 GiB of
  // address space per guest, much of it touched over time).
  int tcg_cache_mib = 64;
};

// Kernel parameters a guest needs under TCG, which has no kvmclock: the
// TSC's rate given (the host's, which TCG's TSC runs at) rather than
// calibrated against the PIT, which fails now and then on a busy host and
// leaves the guest hanging at boot.
std::string TcgKernelArgs();

// What QEMU itself takes beyond guest RAM (its code, the TCG cache,
// device state, I/O buffers): a microVM's cgroup allows RAM plus this.
uint64_t QemuOverhead(const std::string& accel, const QemuOptions& options = {});

// QEMU booting `kernel` with `initramfs`, no disks, the console on stdout,
// on the machine microVMs get: the probe below, and the baseline of
// `scripts/bench vm`.
std::vector<std::string> BareBootCommandLine(const std::string& kernel, const std::string& initramfs, const std::string& accel,
                                             const QemuOptions& options = {});

// Boots `kernel` with `initramfs` (whose init must print "strata-agent:"
// to the console and power off, as the agent does when it finds no disks)
// under `accel` ("kvm" or "tcg"), and says whether it got that far within
// `deadline`; a hypervisor that hangs (a broken /dev/kvm) is killed then.
Status ProbeBoot(const std::string& kernel, const std::string& initramfs, const std::string& accel, Duration deadline,
                 const QemuOptions& options = {});

class QemuHypervisor : public Hypervisor {
 public:
  explicit QemuHypervisor(QemuOptions options = {}) : options_(std::move(options)) {}
  Result<std::unique_ptr<Guest>> Start(const GuestSpec& spec) override;
  Result<std::unique_ptr<Guest>> Adopt(const std::string& state_dir) override;
  // The QEMU command line for `spec` (descriptors as QEMU will see them:
  // QMP, channel, console, then the disks in order from 3 on, a writable
  // one read-write then read-only).
  std::vector<std::string> CommandLine(const GuestSpec& spec) const;

 private:
  QemuOptions options_;
};

}  // namespace strata::vmm
