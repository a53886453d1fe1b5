// The node's table of back ends, and what generic code asks of it.
#include "launcher/sandbox/backend.h"

#include <sys/stat.h>

#include "common/strings.h"

namespace strata::launcher {

void OpenedUpper::Close() {
  if (!mount.mounted()) return;
  const std::string at = mount.target();
  Status unmounted = mount.Unmount();
  if (!unmounted.ok()) STRATA_LOG(kWarn) << "captured upper: " << unmounted.ToString();
  ::rmdir(at.c_str());
}

Status BackendTable::Add(BackendKind kind) {
  for (const auto& k : kinds_) {
    if (k.name == kind.name) return Error(EEXIST, "backend " + Quote(kind.name) + ": listed twice");
  }
  if (!kind.make) return Error(EINVAL, "backend " + Quote(kind.name) + ": nothing makes it");
  kinds_.push_back(std::move(kind));
  return OkStatus();
}

Result<const BackendKind*> BackendTable::Find(std::string_view name) const {
  for (const auto& k : kinds_) {
    if (k.name == name) return &k;
  }
  return Error(EINVAL, StrCat("backend ", Quote(name), ": not one of ", Join(Names(), ", ")));
}

std::vector<std::string> BackendTable::Names() const {
  std::vector<std::string> names;
  for (const auto& k : kinds_) names.push_back(k.name);
  return names;
}

std::vector<std::string> BackendTable::Available(const NodeConfig& node) const {
  std::vector<std::string> names;
  for (const auto& k : kinds_) {
    if (k.available(node).ok()) names.push_back(k.name);
  }
  return names;
}

void SweepBackend(const NodeConfig& node, const std::string& id, const nlohmann::json& state) {
  if (!node.backends) return;
  const nlohmann::json st = state.is_object() ? state : nlohmann::json::object();
  const nlohmann::json spec = st.value("spec", nlohmann::json::object());
  const BackendKind* named = nullptr;
  if (spec.is_object() && spec.contains("backend") && spec["backend"].is_string()) {
    if (auto kind = node.backends->Find(spec["backend"].get<std::string>()); kind.ok()) named = *kind;
  }
  node.backends->ForEach([&](const BackendKind& k) {
    if (k.sweep && (!named || named == &k)) k.sweep(node, id, st);
  });
}

uint64_t MemoryCommit(const NodeConfig& node, const SandboxSpec& spec) {
  if (!node.backends) return 0;
  auto kind = node.backends->Find(spec.backend);
  return kind.ok() ? (*kind)->memory_commit(spec) : 0;
}

}  // namespace strata::launcher
