// SandboxManager's execs and the rest of a sandbox's life: detached
// execs, files, pause, resume, destroy, snapshot, its network policy.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "launcher/node/manager.h"
#include "launcher/node/manager_parts.h"
#include "launcher/sandbox/backend.h"
#include "lazyfs/client.h"
#include "packdiff/packdiff.h"

namespace strata::launcher {

using nlohmann::json;
using namespace manager;  // (manager_parts.h)

namespace {

// Exec latencies kept for the metrics (a ring).
constexpr size_t kLatencySamples = 4096;

}  // namespace

Result<std::shared_ptr<SandboxManager::Entry>> SandboxManager::Find(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return Error(ENOENT, StrCat("sandbox ", Quote(id), ": no such sandbox"));
  return it->second;
}

Result<ExecResult> SandboxManager::Exec(const std::string& id, ExecRequest request, const OutputSink& sink) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sb;  // kept alive while the command runs
  std::shared_ptr<CallPools::Pool> pool;
  {
    std::lock_guard lock(entry->mu);
    if (entry->gone()) return Error(ENOENT, StrCat("sandbox ", id, " is being destroyed"));
    if (entry->pool) {
      pool = entry->pool;
      sb = pool->warm;
      if (request.env.empty()) request.env = entry->spec.env;
      if (request.cwd.empty()) request.cwd = entry->spec.workdir;
      if (!request.grader) request.files = MergeFileRules(entry->spec.files, request.files);
    } else {
      if (entry->sandbox->paused()) return Error(EBUSY, StrCat("sandbox ", id, " is paused; resume it first"));
      sb = entry->sandbox;
    }
  }
  // No lock while the command runs: a destroy ends it (the agent goes).
  EntryBusy busy(*entry);
  auto start = std::chrono::steady_clock::now();
  auto result = sb->Exec(std::move(request), sink);
  if (result.ok() && result->signal == SIGKILL && !result->timed_out) result->oom_killed = sb->OomKilled();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  ++execs_;
  {
    std::lock_guard lock(latency_mu_);
    exec_ms_sum_ += ms;
    if (exec_ms_.size() < kLatencySamples) exec_ms_.push_back(ms);
    else exec_ms_[exec_ms_next_++ % kLatencySamples] = ms;
  }
  return result;
}

Status SandboxManager::CheckExec(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::lock_guard lock(entry->mu);
  if (entry->gone()) return Error(ENOENT, StrCat("sandbox ", id, " is being destroyed"));
  if (entry->sandbox && entry->sandbox->paused()) return Error(EBUSY, StrCat("sandbox ", id, " is paused; resume it first"));
  return OkStatus();
}

Result<std::string> SandboxManager::StartDetached(const std::string& id, ExecRequest request, const std::string& exec_id,
                                                  uint32_t* pid) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sb;
  {
    std::lock_guard lock(entry->mu);
    STRATA_ASSIGN_OR_RETURN(sb, Container(*entry, "detached exec"));
    if (sb->paused()) return Error(EBUSY, StrCat("sandbox ", id, " is paused; resume it first"));
  }
  sb->FillDefaults(request);
  STRATA_RETURN_IF_ERROR(sb->CheckAgentFor(request));
  // A sandbox started by an older strata runs an agent that would take a
  // detached request for a plain one.
  STRATA_ASSIGN_OR_RETURN(int version, sb->AgentVersion());
  if (version < 2) {
    return Error(ENOTSUP, StrCat("sandbox ", id, ": its agent speaks protocol ", version,
                                 "; detached commands need 2 (a sandbox created by this strata)"));
  }
  EntryBusy busy(*entry);
  return sb->agent().StartDetached(request, exec_id, pid);
}

Result<std::optional<ExecResult>> SandboxManager::Attach(const std::string& id, const std::string& exec_id, uint64_t stdout_offset,
                                                         uint64_t stderr_offset, bool follow, const OutputSink& sink, int cancel_fd) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sb;
  {
    std::lock_guard lock(entry->mu);
    STRATA_ASSIGN_OR_RETURN(sb, Container(*entry, "attach"));
  }
  EntryBusy busy(*entry);
  auto r = sb->agent().Attach(exec_id, stdout_offset, stderr_offset, follow, sink, cancel_fd);
  if (r.ok() && *r && (*r)->signal == SIGKILL && !(*r)->timed_out) (*r)->oom_killed = sb->OomKilled();
  return r;
}

Result<json> SandboxManager::ExecStatus(const std::string& id, const std::string& exec_id, Duration wait) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sb;
  {
    std::lock_guard lock(entry->mu);
    STRATA_ASSIGN_OR_RETURN(sb, Container(*entry, "exec status"));
  }
  EntryBusy busy(*entry);
  STRATA_ASSIGN_OR_RETURN(json status, sb->agent().ExecStatus(exec_id, wait));
  if (status.contains("exit")) {
    json& exit = status["exit"];
    exit["oom_killed"] = exit.value("signal", 0) == SIGKILL && !exit.value("timed_out", false) && sb->OomKilled();
  }
  return status;
}

Result<json> SandboxManager::ListExecs(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sb;
  {
    std::lock_guard lock(entry->mu);
    STRATA_ASSIGN_OR_RETURN(sb, Container(*entry, "list execs"));
  }
  return sb->agent().ListExecs();
}

Status SandboxManager::SignalExec(const std::string& id, const std::string& exec_id, int signal) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sb;
  {
    std::lock_guard lock(entry->mu);
    STRATA_ASSIGN_OR_RETURN(sb, Container(*entry, "signal"));
  }
  return sb->agent().SignalExec(exec_id, signal);
}

std::shared_ptr<void> SandboxManager::Hold(const std::string& id) {
  auto entry = Find(id);
  if (!entry.ok()) return nullptr;
  ++(*entry)->busy;
  return std::shared_ptr<void>(nullptr, [e = *entry](void*) {
    e->last_call_ms = NowMs();
    --e->busy;
  });
}

void SandboxManager::Touch(const std::string& id) {
  auto entry = Find(id);
  if (entry.ok()) (*entry)->last_call_ms = NowMs();
}

Status SandboxManager::SetDeadline(const std::string& id, int64_t deadline_ms) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::lock_guard lock(entry->mu);  // (the record and the entry agree)
  STRATA_RETURN_IF_ERROR(registry_->Update(id, {{"deadline_ms", deadline_ms}}).Annotate("record the deadline of " + id));
  entry->deadline_ms = deadline_ms;  // (the reaper sees it within its period)
  return OkStatus();
}

void SandboxManager::ReapExpired() {
  std::vector<std::string> expired;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, e] : sandboxes_) {
      if (e->Expired()) expired.push_back(id);
    }
  }
  for (const auto& id : expired) {
    // (Checked again: a call may have begun since.)
    auto entry = Find(id);
    if (!entry.ok() || !(*entry)->Expired()) continue;
    STRATA_LOG(kInfo) << "sandbox " << id << ": its ttl or deadline passed; destroying it";
    Status s = Destroy(id);
    if (!s.ok() && s.code() != ENOENT) STRATA_LOG(kWarn) << "destroy expired sandbox " << id << ": " << s.ToString();
  }
}

// A call in progress on an entry: its ttl does not run out under it, and
// counts again from when it ends.
SandboxManager::EntryBusy::EntryBusy(Entry& e) : entry(e) { ++entry.busy; }
SandboxManager::EntryBusy::~EntryBusy() {
  entry.last_call_ms = NowMs();
  --entry.busy;
}

Result<AgentClient> SandboxManager::AgentOf(const std::string& id, const char* what) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::lock_guard lock(entry->mu);
  STRATA_ASSIGN_OR_RETURN(auto sb, Container(*entry, what));
  return sb->agent();
}

Result<std::unique_ptr<AgentClient::PutStream>> SandboxManager::BeginPut(const std::string& id, const std::string& path,
                                                                         uint32_t mode, const std::string& user) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sb;
  {
    std::lock_guard lock(entry->mu);
    STRATA_ASSIGN_OR_RETURN(sb, Container(*entry, "put"));
  }
  // The stream keeps the sandbox object alive (like an exec) while it runs.
  STRATA_ASSIGN_OR_RETURN(auto stream, sb->agent().BeginPut(path, mode, std::nullopt, user));
  stream->Keep(sb);
  return stream;
}

Status SandboxManager::Pause(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::lock_guard lock(entry->mu);
  STRATA_ASSIGN_OR_RETURN(auto sb, Container(*entry, "pause"));
  if (sb->paused()) return OkStatus();
  return sb->Pause();
}

Status SandboxManager::Resume(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::lock_guard lock(entry->mu);
  STRATA_ASSIGN_OR_RETURN(auto sb, Container(*entry, "resume"));
  if (!sb->paused()) return OkStatus();
  return sb->Resume();
}

Status SandboxManager::Destroy(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sandbox;
  std::shared_ptr<CallPools::Pool> pool;
  {
    std::lock_guard lock(entry->mu);
    if (entry->gone()) return Error(ENOENT, StrCat("sandbox ", id, " is being destroyed"));
    // Recorded before anything goes, so a crash from here on is cleaned up
    // at the next start; a failure leaves the sandbox as it was.
    // (With the id it has underneath, which a taken one's differs from.)
    if (entry->sandbox) STRATA_RETURN_IF_ERROR(Record(id, {{"status", "destroying"}, {"internal", entry->sandbox->id()}}));
    sandbox = std::move(entry->sandbox);
    pool = std::move(entry->pool);
  }
  if (pool) {  // the pool stays warm for the next one
    {
      std::lock_guard lock(mu_);
      sandboxes_.erase(id);
    }
    calls_->Leave(*pool);
    ++destructions_;
    return Forget(id);
  }
  if (sandbox->paused()) sandbox->Resume().IgnoreError();  // a frozen init cannot exit
  Status s = sandbox->Destroy();
  {
    std::lock_guard lock(mu_);
    sandboxes_.erase(id);
  }
  Status forget = Forget(id);
  ++destructions_;
  return s.ok() ? forget : s;
}

Result<json> SandboxManager::Snapshot(const std::string& id, const std::string& tag, std::vector<std::string> excludes,
                                      bool include_denied) {
  STRATA_ASSIGN_OR_RETURN(cache::LayerRef ref, cache::ParseTag(tag));
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::optional<UpperVolume> snapshot;
  std::vector<std::string> parents;
  std::string store_url;
  const BackendKind* kind = nullptr;
  const auto start = std::chrono::steady_clock::now();
  {
    std::lock_guard lock(entry->mu);
    STRATA_ASSIGN_OR_RETURN(auto sb, Container(*entry, "snapshot"));
    kind = &sb->kind();
    STRATA_ASSIGN_OR_RETURN(UpperVolume captured, sb->CaptureUpper());
    snapshot.emplace(std::move(captured));
    for (const auto& layer : sb->layers()) parents.push_back(layer.digest.Hex());
    store_url = sb->store_url();
    if (!include_denied) {
      for (const std::string& path : sb->spec().files.deny) {  // (as a glob: its own metacharacters escaped)
        std::string glob;
        for (char c : path) {
          if (c == '*' || c == '?' || c == '[' || c == '\\') glob += '\\';
          glob += c;
        }
        excludes.push_back(std::move(glob));
      }
    }
  }
  const double frozen_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  STRATA_ASSIGN_OR_RETURN(auto store, cache::OpenStore(store_url));
  cache::Catalog catalog(store);
  // A container's upper is a directory with the node's mapped ids; other
  // kinds open theirs (a microVM's is inside its disk image, with the
  // guest's own ids).
  OpenedUpper opened;
  opened.dir = snapshot->upper();
  opened.id_base = node_.idmap.host;
  opened.id_count = node_.idmap.size;
  if (kind->open_upper) {
    // (Not in the sandbox's directory: a destroy meanwhile removes that.)
    auto o = kind->open_upper(node_, *snapshot, StrCat(node_.run_dir, "/.snapshot-mounts/", id, "-", snapshot_seq_++));
    if (!o.ok()) {
      snapshot->Destroy().IgnoreError();
      return o.status().Annotate(StrCat("snapshot sandbox ", id));
    }
    opened = std::move(*o);
  }
  auto report = packdiff::PackUpper({.upper = opened.dir, .parents = parents, .tag = ref, .excludes = std::move(excludes),
                                     .id_shift = packdiff::IdShift{opened.id_base, opened.id_count}},
                                    catalog);
  opened.Close();  // (before the volume goes)
  Status removed = snapshot->Destroy();
  if (!report.ok()) return report.status().Annotate(StrCat("snapshot sandbox ", id));
  if (!removed.ok()) STRATA_LOG(kWarn) << "snapshot of " << id << ": " << removed.ToString();
  json parents_json = json::array();
  for (const auto& d : report->parents) parents_json.push_back(d.Hex());
  json out = {{"digest", report->digest.Hex()},
              {"tag", ref.ToString()},
              {"parents", parents_json},
              {"layer_bytes", report->layer_bytes},
              {"frozen_ms", frozen_ms},
              {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()}};
  if (report->push) {
    out["bytes_uploaded"] = report->push->bytes_uploaded;
    out["bytes_present"] = report->push->bytes_present;
  }
  ++snapshots_;
  return out;
}

Result<json> SandboxManager::Network(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sb;
  {
    std::lock_guard lock(entry->mu);
    if (entry->gone()) return Error(ENOENT, StrCat("sandbox ", id, " is being destroyed"));
    sb = entry->sandbox ? entry->sandbox : entry->pool->warm;
  }
  json j = sb->NetworkInfo();
  if (entry->pool) j["pool"] = sb->id();
  return j;
}

Result<json> SandboxManager::Usage(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sb;
  {
    std::lock_guard lock(entry->mu);
    if (entry->gone()) return Error(ENOENT, StrCat("sandbox ", id, " is being destroyed"));
    sb = entry->sandbox ? entry->sandbox : entry->pool->warm;
  }
  json j = sb->Usage();
  j["id"] = id;
  if (entry->pool) {
    j["shared"] = true;
    j["created"] = entry->created;
  }
  return j;
}

Result<json> SandboxManager::SetNetwork(const std::string& id, const NetPolicy& policy) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  {
    std::lock_guard lock(entry->mu);
    if (entry->gone()) return Error(ENOENT, StrCat("sandbox ", id, " is being destroyed"));
    if (entry->pool) {
      return Error(EBADSLT, StrCat("network of ", id, ": a function-call sandbox shares its pool's network, whose policy "
                                   "is fixed at create (create one with the policy you need)"));
    }
    STRATA_RETURN_IF_ERROR(entry->sandbox->SetNetwork(policy));
  }
  return Network(id);
}

Result<json> SandboxManager::Info(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::lock_guard lock(entry->mu);
  if (entry->gone()) return Error(ENOENT, StrCat("sandbox ", id, " is being destroyed"));
  return entry->Info();
}

}  // namespace strata::launcher
