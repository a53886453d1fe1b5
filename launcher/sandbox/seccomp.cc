// Compiling OCI seccomp profiles with libseccomp.
#include "launcher/sandbox/seccomp.h"

#include <seccomp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "common/fs.h"
#include "common/hash.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace strata::launcher {
namespace {

struct CtxDeleter {
  void operator()(scmp_filter_ctx ctx) const { seccomp_release(ctx); }
};

Result<uint32_t> Action(const std::string& name, int errno_ret) {
  if (name == "SCMP_ACT_ALLOW") return SCMP_ACT_ALLOW;
  if (name == "SCMP_ACT_ERRNO") return SCMP_ACT_ERRNO(static_cast<uint16_t>(errno_ret));
  if (name == "SCMP_ACT_KILL" || name == "SCMP_ACT_KILL_THREAD") return SCMP_ACT_KILL;
  if (name == "SCMP_ACT_KILL_PROCESS") return SCMP_ACT_KILL_PROCESS;
  if (name == "SCMP_ACT_LOG") return SCMP_ACT_LOG;
  return Error(EINVAL, "seccomp profile: unsupported action " + Quote(name));
}

Result<scmp_compare> Op(const std::string& name) {
  if (name == "SCMP_CMP_NE") return SCMP_CMP_NE;
  if (name == "SCMP_CMP_LT") return SCMP_CMP_LT;
  if (name == "SCMP_CMP_LE") return SCMP_CMP_LE;
  if (name == "SCMP_CMP_EQ") return SCMP_CMP_EQ;
  if (name == "SCMP_CMP_GE") return SCMP_CMP_GE;
  if (name == "SCMP_CMP_GT") return SCMP_CMP_GT;
  if (name == "SCMP_CMP_MASKED_EQ") return SCMP_CMP_MASKED_EQ;
  return Error(EINVAL, "seccomp profile: unsupported comparison " + Quote(name));
}

Result<uint32_t> Arch(const std::string& name) {
  if (name == "SCMP_ARCH_X86_64") return SCMP_ARCH_X86_64;
  if (name == "SCMP_ARCH_X86") return SCMP_ARCH_X86;
  if (name == "SCMP_ARCH_X32") return SCMP_ARCH_X32;
  if (name == "SCMP_ARCH_AARCH64") return SCMP_ARCH_AARCH64;
  if (name == "SCMP_ARCH_ARM") return SCMP_ARCH_ARM;
  return Error(EINVAL, "seccomp profile: unsupported architecture " + Quote(name));
}

}  // namespace

Result<std::string> CompileSeccomp(const nlohmann::json& profile) {
  try {
    const int default_errno = profile.value("defaultErrnoRet", 1);
    STRATA_ASSIGN_OR_RETURN(uint32_t default_action, Action(profile.at("defaultAction").get<std::string>(), default_errno));
    std::unique_ptr<void, CtxDeleter> ctx(seccomp_init(default_action));
    if (!ctx) return Error(ENOMEM, "seccomp_init");
    for (const auto& a : profile.value("architectures", nlohmann::json::array())) {
      STRATA_ASSIGN_OR_RETURN(uint32_t arch, Arch(a.get<std::string>()));
      int rc = seccomp_arch_add(ctx.get(), arch);
      if (rc != 0 && rc != -EEXIST) return ErrnoError(-rc, "seccomp: add architecture " + a.get<std::string>());
    }
    for (const auto& rule : profile.at("syscalls")) {
      STRATA_ASSIGN_OR_RETURN(uint32_t action,
                              Action(rule.at("action").get<std::string>(), rule.value("errnoRet", default_errno)));
      std::vector<scmp_arg_cmp> args;
      for (const auto& arg : rule.value("args", nlohmann::json::array())) {
        STRATA_ASSIGN_OR_RETURN(scmp_compare op, Op(arg.at("op").get<std::string>()));
        args.push_back({arg.at("index").get<unsigned>(), op, arg.at("value").get<uint64_t>(), arg.value("valueTwo", uint64_t{0})});
      }
      for (const auto& name : rule.at("names")) {
        int nr = seccomp_syscall_resolve_name(name.get<std::string>().c_str());
        if (nr == __NR_SCMP_ERROR) continue;  // not a system call on these architectures
        int rc = seccomp_rule_add_array(ctx.get(), action, nr, static_cast<unsigned>(args.size()), args.data());
        if (rc != 0 && rc != -EEXIST && rc != -EACCES) {
          return ErrnoError(-rc, "seccomp: add rule for " + name.get<std::string>());
        }
      }
    }
    UniqueFd mem(::memfd_create("strata-seccomp", MFD_CLOEXEC));
    if (!mem) return ErrnoError(errno, "memfd_create");
    int rc = seccomp_export_bpf(ctx.get(), mem.get());
    if (rc != 0) return ErrnoError(-rc, "seccomp: export BPF");
    off_t size = ::lseek(mem.get(), 0, SEEK_END);
    std::string bpf(static_cast<size_t>(size), '\0');
    STRATA_ASSIGN_OR_RETURN(size_t n, PreadFull(mem.get(), bpf, 0));
    bpf.resize(n);
    return Base64Encode(bpf);
  } catch (const nlohmann::json::exception& e) {
    return Error(EINVAL, StrCat("seccomp profile: ", e.what()));
  }
}

Result<std::string> CompiledSeccompBase64(const nlohmann::json& profile, const std::string& cache_dir) {
  const std::string path = StrCat(cache_dir, "/", HashBytes(profile.dump()).Hex(), ".bpf64");
  if (auto cached = ReadFileToString(path); cached.ok() && !cached->empty()) return *cached;
  STRATA_ASSIGN_OR_RETURN(std::string compiled, CompileSeccomp(profile));
  if (MakeDirs(cache_dir, 0700).ok()) WriteFileAtomic(path, compiled, false).IgnoreError();
  return compiled;
}

}  // namespace strata::launcher
