#include "launcher/protocol/file_rules.h"

#include <algorithm>

#include "common/strings.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

// The agent's own files and the kernel's: a rule there would break the
// sandbox (or mean nothing), not protect anything.
constexpr const char* kReserved[] = {"/proc", "/sys", "/dev", "/.strata"};

Result<std::string> NormalizeRulePath(const std::string& raw, std::string_view what) {
  if (raw.empty() || raw[0] != '/') return Error(EINVAL, StrCat(what, ": ", Quote(raw), " is not an absolute path"));
  if (raw.size() > 4096) return Error(ENAMETOOLONG, StrCat(what, ": a path is longer than 4096 bytes"));
  std::string out;
  for (const auto& part : Split(raw, '/')) {
    if (part.empty()) continue;
    if (part == "." || part == "..") return Error(EINVAL, StrCat(what, ": ", Quote(raw), " has a \".\" or \"..\" component"));
    if (part.find('\0') != std::string::npos) return Error(EINVAL, StrCat(what, ": a path holds a NUL byte"));
    out += "/" + part;
  }
  if (out.empty()) return Error(EINVAL, StrCat(what, ": a rule for / itself would stop every command"));
  for (const char* r : kReserved) {
    if (PathUnder(out, r)) return Error(EINVAL, StrCat(what, ": ", out, " is under ", r, ", which rules may not name"));
  }
  return out;
}

// Sorted, unique, and nothing under an earlier entry of `over` or of itself.
std::vector<std::string> Minimal(std::vector<std::string> paths, const std::vector<std::string>& over) {
  std::sort(paths.begin(), paths.end());
  std::vector<std::string> out;
  for (auto& p : paths) {
    auto covered = [&](const std::vector<std::string>& roots) {
      return std::any_of(roots.begin(), roots.end(), [&](const std::string& r) { return PathUnder(p, r); });
    };
    if (covered(out) || covered(over)) continue;
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

bool PathUnder(std::string_view path, std::string_view root) {
  if (!path.starts_with(root)) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

json FileRules::ToJson() const { return {{"deny", deny}, {"read_only", read_only}}; }

Result<FileRules> MakeFileRules(std::vector<std::string> deny, std::vector<std::string> read_only, std::string_view what) {
  if (deny.size() + read_only.size() > kMaxRulePaths) {
    return Error(E2BIG, StrCat(what, ": ", deny.size() + read_only.size(), " paths; at most ", kMaxRulePaths));
  }
  for (auto* list : {&deny, &read_only}) {
    for (auto& p : *list) {
      STRATA_ASSIGN_OR_RETURN(p, NormalizeRulePath(p, what));
    }
  }
  FileRules rules;
  rules.deny = Minimal(std::move(deny), {});
  rules.read_only = Minimal(std::move(read_only), rules.deny);
  return rules;
}

Result<FileRules> ParseFileRules(const json& j, std::string_view what) {
  if (j.is_null()) return FileRules{};
  if (!j.is_object()) return Error(EINVAL, StrCat(what, " must be an object {\"deny\": [...], \"read_only\": [...]}"));
  std::vector<std::string> lists[2];
  const char* keys[2] = {"deny", "read_only"};
  for (const auto& [key, value] : j.items()) {
    if (key != keys[0] && key != keys[1]) return Error(EINVAL, StrCat(what, ": unknown key ", Quote(key), " (deny, read_only)"));
  }
  for (int i = 0; i < 2; ++i) {
    if (!j.contains(keys[i]) || j[keys[i]].is_null()) continue;
    const json& list = j[keys[i]];
    if (!list.is_array()) return Error(EINVAL, StrCat(what, ".", keys[i], " must be an array of paths"));
    for (const auto& p : list) {
      if (!p.is_string()) return Error(EINVAL, StrCat(what, ".", keys[i], " must be an array of paths"));
      lists[i].push_back(p.get<std::string>());
    }
  }
  return MakeFileRules(std::move(lists[0]), std::move(lists[1]), what);
}

FileRules MergeFileRules(const FileRules& a, const FileRules& b) {
  std::vector<std::string> deny = a.deny, read_only = a.read_only;
  deny.insert(deny.end(), b.deny.begin(), b.deny.end());
  read_only.insert(read_only.end(), b.read_only.begin(), b.read_only.end());
  FileRules merged;
  merged.deny = Minimal(std::move(deny), {});
  merged.read_only = Minimal(std::move(read_only), merged.deny);
  return merged;
}

}  // namespace strata::launcher
