// The seccomp profiles every back end's commands run under (the default,
// the agent's, and the small one a command stacks on the agent's), and
// the default compiled once per node: libseccomp turns the
// OCI profile into the BPF program the kernel loads, and crun takes it as
// is (annotation run.oci.seccomp_bpf_data) instead of compiling the same
// few hundred rules again for every sandbox (half of crun's start time).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace strata::launcher {

// The BPF program for `profile` (OCI linux.seccomp form), base64-encoded as
// crun wants it. Cached in `cache_dir` under the profile's hash, so a
// process compiles a profile at most once per node and boot.
Result<std::string> CompiledSeccompBase64(const nlohmann::json& profile, const std::string& cache_dir);

// The same program, compiled now (no cache).
Result<std::string> CompileSeccomp(const nlohmann::json& profile);

// A default seccomp profile in OCI form: an allowlist of the system calls
// ordinary programs use (like the Docker/Podman default), with clone limited
// to non-namespace flags and clone3 answering ENOSYS so libc falls back.
nlohmann::json DefaultSeccompProfile();
// The default plus what the agent needs to give a command or a call its
// own mount namespace (unshare, mount, mount_setattr, umount2).
nlohmann::json AgentSeccompProfile();
// What a command of an agent that runs under AgentSeccompProfile() loads on
// top of it to be held to the default profile: the agent's extra calls
// answer EPERM, as the default profile's, and everything else is left to
// the agent's program (filters stack; the strictest answer wins), on the
// same architectures. About 20 instructions to load instead of the
// default's 990 (where a microVM's agent runs under no program, its
// commands load the whole default profile).
nlohmann::json CommandOnAgentSeccompProfile();

}  // namespace strata::launcher
