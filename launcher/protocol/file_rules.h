// File rules: paths a sandbox's commands may not see (deny) or change
// (read_only). The launcher merges a sandbox's rules with an exec's and
// sends the result in the exec request; the agent enforces them in the
// kernel before the command starts (docs/security.md, "File rules").
// Shared by the launcher and the agent, so both read a rule the same way.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace strata::launcher {

struct FileRules {
  // Absolute, normalized, sorted, without duplicates; no deny path lies
  // under another, no read_only path under a deny path or another read_only.
  std::vector<std::string> deny;
  std::vector<std::string> read_only;

  bool empty() const { return deny.empty() && read_only.empty(); }
  // {"deny": [...], "read_only": [...]}
  nlohmann::json ToJson() const;
};

// The most paths a rule set may name (deny and read_only together).
inline constexpr size_t kMaxRulePaths = 64;

// Parses {"deny": [...], "read_only": [...]} (null or absent: no rules).
// Errors name `what` (for example "exec: files") and the path.
Result<FileRules> ParseFileRules(const nlohmann::json& j, std::string_view what);
// Builds rules from lists (the CLI's --deny and --read-only), checked and
// normalized as ParseFileRules does.
Result<FileRules> MakeFileRules(std::vector<std::string> deny, std::vector<std::string> read_only, std::string_view what);
// Both sets at once (a sandbox's rules and an exec's).
FileRules MergeFileRules(const FileRules& a, const FileRules& b);
// Whether `path` (absolute, normalized) is `root` or lies under it.
bool PathUnder(std::string_view path, std::string_view root);

}  // namespace strata::launcher
