// QEMU microVMs. Descriptors rather than paths: the launcher (root) opens
// the layer files (on a FUSE mount only root may read), the upper disk and
// the sockets, and QEMU, jailed as its own uid, gets them through -add-fd
// and fd= options.
#include "vmm/qemu.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "common/unix_socket.h"
#include "vmm/qmp.h"

namespace strata::vmm {

using json = nlohmann::json;

namespace {

constexpr const char* kQmpSocket = "qmp.sock";
constexpr const char* kChannelSocket = "channel.sock";
constexpr const char* kConsoleLog = "console.log";
constexpr const char* kQemuLog = "qemu.log";
constexpr const char* kStateFile = "vm.json";
constexpr int kFirstFd = 3;  // QMP, channel, console, the disks, then the tap

// A process's start time (field 22 of /proc/PID/stat): with the pid, it
// names the process even after the pid is reused.
uint64_t StartTime(pid_t pid) {
  std::ifstream in(StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return 0;
  std::vector<std::string> fields = Split(stat.substr(paren + 2), ' ');
  return fields.size() > 19 ? std::strtoull(fields[19].c_str(), nullptr, 10) : 0;
}

std::string Tail(const std::string& path, size_t max_bytes) {
  auto text = ReadFileToString(path);
  if (!text.ok()) return "";
  std::string s = text->size() > max_bytes ? text->substr(text->size() - max_bytes) : *text;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s;
}

Status WaitForMigration(QmpClient& qmp, std::chrono::steady_clock::time_point until);

class QemuGuest : public Guest {
 public:
  QemuGuest(std::string state_dir, std::string console_log, std::optional<Subprocess> process, pid_t pid, uint64_t start)
      : state_dir_(std::move(state_dir)), console_log_(std::move(console_log)), process_(std::move(process)), pid_(pid),
        start_(start) {}
  ~QemuGuest() override {
    if (!released_) Stop(std::chrono::seconds(2)).IgnoreError();
  }

  std::string channel_path() const override { return state_dir_ + "/" + kChannelSocket; }

  bool Running() override {
    std::lock_guard lock(mu_);
    return RunningLocked();
  }

  Status Pause() override { return Command("stop").Annotate("pause the microVM"); }

  Status Save(const std::string& path, Duration deadline) override {
    std::lock_guard lock(mu_);
    if (!RunningLocked()) return Error(ESRCH, StrCat("save the microVM: its QEMU is gone: ", Tail(console_log_, 300)));
    STRATA_RETURN_IF_ERROR(QmpLocked());
    Status s = SaveLocked(path, deadline);
    if (!s.ok()) qmp_.reset();
    return s.Annotate("save the microVM to " + path);
  }
  Status Resume() override { return Command("cont").Annotate("resume the microVM"); }

  Status Stop(Duration grace) override {
    std::lock_guard lock(mu_);
    if (stopped_) return OkStatus();
    if (RunningLocked()) {
      // A clean quit first (QEMU flushes the upper disk), then the waiter
      // is killed: QEMU dies with it (its parent-death signal).
      if (QmpLocked().ok()) qmp_->Execute("quit", nullptr, std::chrono::seconds(2)).status().IgnoreError();
      const auto until = std::chrono::steady_clock::now() + grace;
      while (RunningLocked() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (RunningLocked()) {
        // The waiter and QEMU share its process group (QEMU also dies with
        // the waiter, by its parent-death signal).
        ::kill(-pid_, SIGKILL);
        ::kill(pid_, SIGKILL);
        for (int i = 0; i < 500 && RunningLocked(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
    // QEMU (RAM to unmap) may outlive its waiter by a moment: until the
    // group is empty it still holds the disks and its cgroups.
    for (int i = 0; i < 500 && ::kill(-pid_, 0) == 0; ++i) {
      if (i == 100) ::kill(-pid_, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (RunningLocked() || ::kill(-pid_, 0) == 0) {
      return Error(EBUSY, StrCat("stop the microVM: its hypervisor (process group ", pid_, ") did not exit"));
    }
    process_.reset();
    qmp_.reset();
    stopped_ = true;
    return OkStatus();
  }

  void Release() override {
    std::lock_guard lock(mu_);
    released_ = true;
    if (process_) process_->Detach();
    process_.reset();
  }

  std::string ConsoleTail(size_t max_bytes) const override { return Tail(console_log_, max_bytes); }

 private:
  bool RunningLocked() {
    if (stopped_) return false;
    if (process_) return process_->Running();
    return ::kill(pid_, 0) == 0 && StartTime(pid_) == start_;
  }
  Status QmpLocked() {
    if (qmp_) return OkStatus();
    auto client = QmpClient::Connect(state_dir_ + "/" + kQmpSocket, std::chrono::seconds(5));
    if (!client.ok()) return client.status();
    qmp_.emplace(std::move(*client));
    return OkStatus();
  }
  Status SaveLocked(const std::string& path, Duration deadline) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    STRATA_ASSIGN_OR_RETURN(UniqueFd out, OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC, 0600));
    STRATA_RETURN_IF_ERROR(qmp_->Execute("stop").status());
    STRATA_RETURN_IF_ERROR(qmp_->ExecuteWithFd("getfd", {{"fdname", "state"}}, out.get()).status());
    STRATA_RETURN_IF_ERROR(qmp_->Execute("migrate", {{"uri", "fd:state"}}).status());
    out.reset();  // (QEMU holds its own copy until the stream ends)
    Status done = WaitForMigration(*qmp_, until);
    if (!done.ok()) qmp_->Execute("migrate_cancel").status().IgnoreError();
    return done;
  }
  Status Command(const char* command) {
    std::lock_guard lock(mu_);
    if (!RunningLocked()) return Error(ESRCH, StrCat("its QEMU is gone: ", Tail(console_log_, 300)));
    STRATA_RETURN_IF_ERROR(QmpLocked());
    auto result = qmp_->Execute(command);
    if (!result.ok()) {
      qmp_.reset();  // a broken connection is made again next time
      return result.status();
    }
    return OkStatus();
  }

  std::mutex mu_;
  std::string state_dir_, console_log_;
  std::optional<Subprocess> process_;  // the jail's waiter, when we started it
  pid_t pid_;
  uint64_t start_;
  std::optional<QmpClient> qmp_;
  bool stopped_ = false, released_ = false;
};

// Polls a migration (out: Save; in: a restore) until it completed.
Status WaitForMigration(QmpClient& qmp, std::chrono::steady_clock::time_point until) {
  while (true) {
    STRATA_ASSIGN_OR_RETURN(json info, qmp.Execute("query-migrate"));
    const std::string status = info.value("status", "");
    if (status == "completed") return OkStatus();
    if (status == "failed" || status == "cancelled") {
      return Error(EIO, StrCat("migration ", status, info.contains("error-desc") ? ": " + info.value("error-desc", "") : ""));
    }
    if (std::chrono::steady_clock::now() > until) return Error(ETIMEDOUT, StrCat("migration still ", status.empty() ? "starting" : status));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

std::string TcgKernelArgs() {
  std::string args = "tsc=reliable no_timer_check";
  // The TSC's own rate where the kernel says it; else the CPU's rate (on
  // a VM, as here, the hypervisor's TSC rate; with frequency scaling it
  // may differ, and the guest's clock with it).
  if (auto khz = ReadFileToString("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); khz.ok() && std::atoll(khz->c_str()) > 0) {
    return StrCat(args, " tsc_early_khz=", std::atoll(khz->c_str()));
  }
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) == 0 && line.find(':') != std::string::npos) {
      const double mhz = std::strtod(line.c_str() + line.find(':') + 1, nullptr);
      if (mhz > 0) args += StrCat(" tsc_early_khz=", static_cast<uint64_t>(mhz * 1000));
      break;
    }
  }
  return args;
}

uint64_t QemuOverhead(const std::string& accel, const QemuOptions& options) {
  // `scripts/bench vm` measured 154 MiB resident for a 128 MiB guest
  // under TCG (the RAM it touched, the TCG cache, QEMU); KVM was not there
  // to measure: its figure is TCG's less the cache.
  uint64_t base = uint64_t{96} << 20;
  if (accel == "tcg") base += static_cast<uint64_t>(options.tcg_cache_mib) << 20;
  return base;
}

std::vector<std::string> QemuHypervisor::CommandLine(const GuestSpec& spec) const {
  const bool kvm = spec.accel == "kvm";
  std::vector<std::string> a = {options_.binary, "-name", spec.name, "-nodefaults", "-no-user-config", "-nographic",
                                "-no-reboot"};
  // Under TCG there is no kvmclock: the kernel needs the PIT and the PIC to
  // calibrate its timers. ACPI describes the 24 virtio-mmio slots.
  a.insert(a.end(), {"-M", kvm ? "microvm,acpi=on,pit=off,pic=off,rtc=on" : "microvm,acpi=on,pit=on,pic=on,rtc=on"});
  if (kvm) a.insert(a.end(), {"-accel", "kvm", "-cpu", "host"});
  else a.insert(a.end(), {"-accel", StrCat("tcg,tb-size=", options_.tcg_cache_mib)});
  a.insert(a.end(), {"-smp", StrCat(std::max(spec.cpus, 1)), "-m", StrCat(std::max<uint64_t>(spec.memory >> 20, 64), "M")});
  a.insert(a.end(), {"-kernel", "/vm/kernel", "-initrd", "/vm/initramfs", "-append",
                     kvm ? spec.cmdline : spec.cmdline + " " + TcgKernelArgs()});
  a.insert(a.end(), {"-global", "virtio-mmio.force-legacy=false"});
  int fd = kFirstFd;
  a.insert(a.end(), {"-chardev", StrCat("socket,id=qmp,fd=", fd++, ",server=on,wait=off"), "-mon", "chardev=qmp,mode=control"});
  a.insert(a.end(), {"-device", "virtio-serial-device,max_ports=2", "-chardev",
                     StrCat("socket,id=agent,fd=", fd++, ",server=on,wait=off"), "-device",
                     "virtserialport,chardev=agent,name=strata.agent"});
  const int console = fd++;
  a.insert(a.end(), {"-add-fd", StrCat("fd=", console, ",set=", console), "-chardev",
                     StrCat("file,id=console,path=/dev/fdset/", console), "-serial", "chardev:console"});
  for (size_t i = 0; i < spec.disks.size(); ++i) {
    const GuestDisk& d = spec.disks[i];
    const int disk = fd++;
    // A writable disk comes twice, read-only and read-write: QEMU opens it
    // read-only first, and a descriptor set hands out only matching modes.
    if (!d.read_only) a.insert(a.end(), {"-add-fd", StrCat("fd=", fd++, ",set=", disk)});
    a.insert(a.end(), {"-add-fd", StrCat("fd=", disk, ",set=", disk), "-drive",
                       // No image locks: each writable disk is one guest's alone, and
                       // after a Save QEMU could not take its own back (its read-only
                       // descriptor of the disk keeps a lock the read-write one meets).
                       StrCat("file=/dev/fdset/", disk, ",if=none,id=disk", i, ",format=raw,file.locking=off,read-only=",
                              d.read_only ? "on" : "off",
                              d.read_only ? "" : ",discard=unmap"),
                       "-device", StrCat("virtio-blk-device,drive=disk", i, ",serial=", d.serial)});
  }
  if (spec.nic) {
    // (No vhost: the node has no /dev/vhost-net, and it would be one more
    // device in the jail.)
    a.insert(a.end(), {"-netdev", StrCat("tap,id=net0,fd=", fd++, ",vhost=off"), "-device",
                       StrCat("virtio-net-device,netdev=net0,mac=", spec.nic->mac)});
  }
  // Entropy from the host (QEMU's getrandom): without it the guest's
  // random pool is not ready for about a second after boot, and a
  // getrandom() (the agent's temporary names, a command's Python) waits.
  a.insert(a.end(), {"-device", "virtio-rng-device"});
  if (!spec.restore_state.empty()) a.insert(a.end(), {"-incoming", StrCat("fd:", fd++)});
  a.insert(a.end(), {"-sandbox", "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"});
  return a;
}

Result<std::unique_ptr<Guest>> QemuHypervisor::Start(const GuestSpec& spec) {
  if (spec.disks.size() + (spec.nic ? 1 : 0) > 22) {
    return Error(E2BIG, StrCat("microVM ", spec.name, ": ", spec.disks.size(), " disks", spec.nic ? " and a network card" : "",
                               ", and microvm has 24 virtio-mmio slots (two are the agent channel's and the RNG's)"));
  }
  for (const auto& path : {spec.kernel, spec.initramfs}) {
    if (::access(path.c_str(), R_OK) != 0) return ErrnoError(errno, "microVM " + spec.name + ": read " + path);
  }
  STRATA_RETURN_IF_ERROR(MakeDirs(spec.state_dir, 0700));
  const std::string root = spec.jail.root_dir.empty() ? spec.state_dir + "/root" : spec.jail.root_dir;
  STRATA_RETURN_IF_ERROR(MakeDirs(root, 0755));
  STRATA_ASSIGN_OR_RETURN(UniqueFd qmp, ListenUnix(spec.state_dir + "/" + kQmpSocket, 0600));
  STRATA_ASSIGN_OR_RETURN(UniqueFd channel, ListenUnix(spec.state_dir + "/" + kChannelSocket, 0600));
  const std::string console_log = spec.console_log.empty() ? spec.state_dir + "/" + kConsoleLog : spec.console_log;
  STRATA_ASSIGN_OR_RETURN(UniqueFd console, OpenFile(console_log, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600));
  std::vector<UniqueFd> disks;  // in CommandLine's order
  for (const auto& d : spec.disks) {
    for (int flags : d.read_only ? std::vector<int>{O_RDONLY} : std::vector<int>{O_RDWR, O_RDONLY}) {
      auto fd = OpenFile(d.path, flags);
      if (!fd.ok()) return fd.status().Annotate(StrCat("microVM ", spec.name, ": open disk ", d.serial));
      disks.push_back(std::move(*fd));
    }
  }
  UniqueFd state;
  if (!spec.restore_state.empty()) {
    auto opened = OpenFile(spec.restore_state, O_RDONLY);
    if (!opened.ok()) return opened.status().Annotate(StrCat("microVM ", spec.name, ": open the saved state"));
    state = std::move(*opened);
  }
  std::vector<int> pass = {qmp.get(), channel.get(), console.get()};
  for (const auto& d : disks) pass.push_back(d.get());
  if (spec.nic) pass.push_back(spec.nic->tap_fd);
  if (state) pass.push_back(state.get());

  std::vector<std::string> argv = {spec.jail.jail_binary, "--root", root, "--uid", StrCat(spec.jail.uid), "--gid",
                                   StrCat(spec.jail.gid), "--bind", spec.kernel + ":/vm/kernel", "--bind",
                                   spec.initramfs + ":/vm/initramfs"};
  for (gid_t g : spec.jail.groups) argv.insert(argv.end(), {"--group", StrCat(g)});
  for (const auto& c : spec.jail.cgroups) argv.insert(argv.end(), {"--cgroup", c});
  if (spec.accel == "kvm") argv.insert(argv.end(), {"--dev", "kvm"});
  argv.push_back("--");
  for (auto& arg : CommandLine(spec)) argv.push_back(std::move(arg));
  // Nothing of the launcher's environment (a store's credentials) reaches
  // the jail or QEMU.
  STRATA_ASSIGN_OR_RETURN(Subprocess process, Subprocess::Start({.argv = argv,
                                                                 .env = {"PATH=/usr/bin:/bin", "LANG=C"},
                                                                 .clear_env = true,
                                                                 .stdout_mode = StdStream::kNull,
                                                                 .stderr_mode = StdStream::kFile,
                                                                 .stderr_file = spec.state_dir + "/" + kQemuLog,
                                                                 .pass_fds = pass}));
  // QEMU holds them now; with ours closed, a dead QEMU refuses connections.
  qmp.reset();
  channel.reset();
  const pid_t pid = process.pid();
  auto guest = std::make_unique<QemuGuest>(spec.state_dir, console_log, std::move(process), pid, StartTime(pid));
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(
      spec.state_dir + "/" + kStateFile,
      json{{"pid", pid}, {"start", StartTime(pid)}, {"accel", spec.accel}, {"console", console_log}}.dump(), false));
  auto client = QmpClient::Connect(spec.state_dir + "/" + kQmpSocket, options_.start_deadline);
  if (!client.ok()) {
    for (int i = 0; i < 100 && guest->Running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::string log = Tail(spec.state_dir + "/" + kQemuLog, 1000);
    guest->Stop(std::chrono::seconds(1)).IgnoreError();
    if (!log.empty()) return Error(EIO, StrCat("microVM ", spec.name, ": QEMU did not start: ", log));
    return client.status().Annotate(StrCat("microVM ", spec.name, ": QEMU did not answer QMP"));
  }
  if (!spec.restore_state.empty()) {
    // The state loads while QMP answers; the guest stays paused after (it
    // was saved paused) until told to continue.
    Status restored = WaitForMigration(*client, std::chrono::steady_clock::now() + options_.start_deadline);
    if (restored.ok()) restored = client->Execute("cont").status();
    if (!restored.ok()) {
      // (QMP takes one client: ours quits QEMU, then Stop waits for it.)
      {
        QmpClient last = std::move(*client);
        last.Execute("quit", nullptr, std::chrono::seconds(2)).status().IgnoreError();
      }
      guest->Stop(std::chrono::seconds(1)).IgnoreError();
      std::string log = Tail(spec.state_dir + "/" + kQemuLog, 600);
      return Error(EBADMSG, StrCat("microVM ", spec.name, ": restore the saved state: ", restored.message(),
                                   log.empty() ? "" : " (QEMU: " + log + ")"));
    }
  }
  return std::unique_ptr<Guest>(std::move(guest));
}

std::vector<std::string> BareBootCommandLine(const std::string& kernel, const std::string& initramfs, const std::string& accel,
                                             const QemuOptions& options) {
  const bool kvm = accel == "kvm";
  std::vector<std::string> argv = {options.binary, "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
                                   "-M", kvm ? "microvm,acpi=on,pit=off,pic=off,rtc=on" : "microvm,acpi=on,pit=on,pic=on,rtc=on",
                                   "-accel", kvm ? "kvm" : StrCat("tcg,tb-size=", options.tcg_cache_mib), "-m", "128M",
                                   "-kernel", kernel, "-initrd", initramfs, "-append",
                                   // (quiet as microVMs are; the agent's own words still reach the console)
                                   StrCat("console=ttyS0 reboot=t panic=-1 quiet 8250.nr_uarts=1", kvm ? "" : " " + TcgKernelArgs()),
                                   "-serial", "stdio"};
  if (kvm) argv.insert(argv.end(), {"-cpu", "host"});
  return argv;
}

Status ProbeBoot(const std::string& kernel, const std::string& initramfs, const std::string& accel, Duration deadline,
                 const QemuOptions& options) {
  const std::vector<std::string> argv = BareBootCommandLine(kernel, initramfs, accel, options);
  STRATA_ASSIGN_OR_RETURN(SubprocessResult r, RunCommand({.argv = argv, .timeout = deadline}));
  if (r.out.find("strata-agent:") != std::string::npos) return OkStatus();
  std::string tail = r.out.size() > 300 ? r.out.substr(r.out.size() - 300) : r.out;
  if (r.timed_out) {
    return Error(ETIMEDOUT, StrCat("a probe guest under ", accel, " did not reach its init within ",
                                   std::chrono::duration_cast<std::chrono::seconds>(deadline).count(), " s",
                                   tail.empty() ? "" : "; its console: " + tail));
  }
  return Error(EIO, StrCat("a probe guest under ", accel, " failed: QEMU ", r.Describe(), ": ", r.err.substr(0, 300), tail));
}

Result<std::unique_ptr<Guest>> QemuHypervisor::Adopt(const std::string& state_dir) {
  auto text = ReadFileToString(state_dir + "/" + kStateFile);
  if (!text.ok()) return Error(ENOENT, "adopt microVM in " + state_dir + ": no " + kStateFile);
  json state = json::parse(*text, nullptr, false);
  if (!state.is_object()) return Error(EINVAL, "adopt microVM in " + state_dir + ": " + kStateFile + " is not JSON");
  const pid_t pid = state.value("pid", 0);
  const uint64_t start = state.value("start", uint64_t{0});
  if (pid <= 0 || ::kill(pid, 0) != 0 || StartTime(pid) != start) {
    return Error(ENOENT, StrCat("adopt microVM in ", state_dir, ": its QEMU (pid ", pid, ") is gone"));
  }
  return std::unique_ptr<Guest>(
      new QemuGuest(state_dir, state.value("console", state_dir + "/" + kConsoleLog), std::nullopt, pid, start));
}

}  // namespace strata::vmm
