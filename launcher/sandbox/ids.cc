// Sandbox ids.
#include "launcher/sandbox/ids.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <random>

#include "common/strings.h"

namespace strata::launcher {

std::string NewSandboxId(std::string_view node) {
  static std::mt19937_64 rng{(static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}() ^
                             static_cast<uint64_t>(::getpid())};
  static std::mutex mu;
  std::lock_guard lock(mu);
  char buf[16];
  std::snprintf(buf, sizeof buf, "%012llx", static_cast<unsigned long long>(rng() & 0xffffffffffffULL));
  return node.empty() ? StrCat("sb-", buf) : StrCat("sb-", node, "-", buf);
}

std::string SandboxIdNode(std::string_view id) {
  if (!id.starts_with("sb-")) return "";
  id.remove_prefix(3);
  const size_t dash = id.rfind('-');
  if (dash == std::string_view::npos || dash == 0 || id.size() - dash - 1 != 12) return "";
  return std::string(id.substr(0, dash));
}

Status CheckNodeName(std::string_view name) {
  auto fine = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-'; };
  if (name.empty() || name.size() > 20 || name.front() == '-' || name.back() == '-' ||
      !std::all_of(name.begin(), name.end(), fine)) {
    return Error(EINVAL, "node name " + Quote(name) + ": 1 to 20 of a-z, 0-9 and '-' (not first or last)");
  }
  return OkStatus();
}

}  // namespace strata::launcher
