// The default seccomp profile compiled once per node: libseccomp turns the
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

}  // namespace strata::launcher
