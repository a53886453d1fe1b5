// The node's table of back ends, and what generic code asks of it.
#include "launcher/sandbox/backend.h"

#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <mutex>

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

Result<std::string> RuntimeOf(const BackendKind& kind, const NodeConfig& node, const std::string& requested) {
  if (kind.oci_runtime) return node.RuntimeFor(requested);
  if (requested.empty()) return std::string();
  return Error(EINVAL, StrCat("runtime ", Quote(requested), ": a ", kind.name, " sandbox runs no OCI runtime (containers and fncall pools do)"));
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

namespace {

struct StepSums {
  std::mutex mu;
  std::map<std::pair<std::string, std::string>, std::pair<double, uint64_t>> sums;  // (path, step) -> (seconds, count)
};

StepSums& Steps() {
  static StepSums* steps = new StepSums;  // (never destroyed: threads may time steps while the process exits)
  return *steps;
}

}  // namespace

void StepTimer::Step(const char* name) {
  auto now = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(now - last_).count();
  STRATA_LOG(kDebug) << id_ << ": " << path_ << ": " << name << " " << seconds * 1000 << " ms";
  last_ = now;
  StepSums& steps = Steps();
  std::lock_guard lock(steps.mu);
  auto& [sum, count] = steps.sums[{path_, name}];
  sum += seconds;
  ++count;
}

std::string StepMetrics() {
  StepSums& steps = Steps();
  std::lock_guard lock(steps.mu);
  std::string out =
      "# HELP strata_sandbox_step_seconds Time in each step of a sandbox's creation and destruction, by path and step.\n"
      "# TYPE strata_sandbox_step_seconds summary\n";
  for (const auto& [key, value] : steps.sums) {
    const std::string labels = StrCat("{path=\"", key.first, "\",step=\"", key.second, "\"}");
    char sum[32];
    std::snprintf(sum, sizeof sum, "%.6f", value.first);
    out += StrCat("strata_sandbox_step_seconds_sum", labels, " ", sum, "\n");
    out += StrCat("strata_sandbox_step_seconds_count", labels, " ", value.second, "\n");
  }
  return out;
}

}  // namespace strata::launcher
