// SandboxManager: the daemon's sandboxes. This file opens it, recovers
// what an earlier daemon left, creates and answers the node's queries;
// execs and the rest of a sandbox's life are in lifecycle.cc.
#include "launcher/node/manager.h"

#include <dirent.h>
#include <signal.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <set>

#include "common/fs.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/strings.h"
#include "launcher/node/manager_parts.h"
#include "launcher/sandbox/backend.h"
#include "lazyfs/client.h"
#include "packdiff/packdiff.h"

namespace strata::launcher {

using nlohmann::json;
using namespace manager;  // (manager_parts.h)

namespace {

constexpr int kWarmFillers = 2;  // sandboxes made at once for pools

}  // namespace

namespace manager {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

json CallSpecJson(const SandboxSpec& spec) {
  return {{"layers", spec.layers}, {"env", spec.env}, {"workdir", spec.workdir}, {"files", spec.files.ToJson()}};
}

}  // namespace manager

Result<std::unique_ptr<SandboxManager>> SandboxManager::Open(NodeConfig node, const std::string& state_dir) {
  node.managed = true;
  std::unique_ptr<SandboxManager> m(new SandboxManager(std::move(node)));
  STRATA_ASSIGN_OR_RETURN(m->registry_, Registry::Open(state_dir, BootId()));
  m->recovery_.moved = m->registry_->moved();
  m->calls_ = std::make_unique<CallPools>(m->node_, *m->registry_);
  m->warm_ = std::make_unique<launcher::WarmPools>(m->node_, *m->registry_);
  Status s = m->Recover();
  if (!s.ok()) return s.Annotate("recover sandboxes from " + state_dir);
  STRATA_ASSIGN_OR_RETURN(m->keys_, IdempotencyKeys::Open(JoinPath(state_dir, "keys")));
  m->keys_->Expire();
  m->warm_->Start(kWarmFillers);
  m->reaper_ = std::thread([p = m.get()] {
    std::unique_lock lock(p->reaper_mu_);
    int rounds = 0;
    while (!p->reaper_cv_.wait_for(lock, std::chrono::seconds(5), [p] { return p->stopping_; })) {
      lock.unlock();
      p->calls_->Reap(false);
      p->ReapExpired();
      if (++rounds % 60 == 0) p->keys_->Expire();
      lock.lock();
    }
  });
  return m;
}

SandboxManager::~SandboxManager() {
  {
    std::lock_guard lock(reaper_mu_);
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  // (Null when Open failed before making them.) Ready warm sandboxes, like
  // the others, are adopted again by the next daemon.
  if (warm_) warm_->Stop();
  // Idle function-call pools are only a cache: they go. Sandboxes outlive
  // the daemon (a restart re-adopts them): the objects just let go.
  if (calls_) calls_->Reap(true);
  {
    std::lock_guard lock(mu_);
    for (auto& [id, entry] : sandboxes_) {
      std::lock_guard entry_lock(entry->mu);
      if (entry->sandbox) entry->sandbox->Release();
    }
  }
  if (calls_) calls_->ReleaseAll();
}

int64_t SandboxManager::Entry::ExpiresInMs() const { return ttl > 0 ? last_call_ms.load() + ttl * 1000 - NowMs() : 0; }

bool SandboxManager::Entry::Expired() const {
  // A deadline holds whatever calls are under way; not while paused (as
  // E2B keeps a paused sandbox: a resume sets the next one).
  const int64_t deadline = deadline_ms.load();
  if (deadline > 0 && deadline <= WallMs() && !(sandbox && sandbox->paused())) return true;
  return busy.load() == 0 && ttl > 0 && ExpiresInMs() <= 0;
}

void SandboxManager::Entry::Settle(const SandboxSpec& given) {
  ttl = given.ttl_seconds;
  deadline_ms = given.deadline_ms;
  labels = given.labels;
}

json SandboxManager::Entry::RecordOf(const SandboxSpec& given) {
  json r = {{"ttl", given.ttl_seconds}};
  if (given.deadline_ms > 0) r["deadline_ms"] = given.deadline_ms;
  if (!given.labels.empty()) r["labels"] = given.labels;
  return r;
}

void SandboxManager::Entry::FromRecord(const json& record) {
  ttl = record.value("ttl", int64_t{0});
  deadline_ms = record.value("deadline_ms", int64_t{0});
  if (auto it = record.find("labels"); it != record.end() && it->is_object()) {
    for (const auto& [k, v] : it->items()) {
      if (v.is_string()) labels[k] = v.get<std::string>();
    }
  }
}

json SandboxManager::Entry::Info() const {
  auto with_ttl = [&](json info) {
    if (!labels.empty()) info["labels"] = labels;
    if (const int64_t deadline = deadline_ms.load(); deadline > 0) info["deadline"] = static_cast<double>(deadline) / 1000;
    if (ttl > 0) {
      info["ttl"] = ttl;
      info["expires_in"] = std::max<double>(0, static_cast<double>(ExpiresInMs()) / 1000);
    }
    return info;
  };
  if (sandbox) {
    json info = sandbox->Info();
    if (!warm_pool.empty()) {
      info["id"] = id;
      info["warm_pool"] = warm_pool;
      info["internal_id"] = sandbox->id();
    }
    if (!owner.empty()) info["tenant"] = owner;
    return with_ttl(info);
  }
  json info = pool->warm->Info();
  info["id"] = id;
  info["backend"] = spec.backend;
  info["state"] = "running";
  info["pool"] = pool->warm->id();
  info["created"] = created;
  info["files"] = spec.files.ToJson();
  if (!owner.empty()) info["tenant"] = owner;
  return with_ttl(info);
}

Result<std::shared_ptr<Sandbox>> SandboxManager::Container(Entry& entry, const char* what) {
  if (entry.pool) {
    return Error(ENOTSUP, StrCat(what, ": sandbox ", entry.id, " is a function-call sandbox: every call starts from the "
                                 "read-only image, so there are no files to change, nothing to pause and nothing to snapshot"));
  }
  if (!entry.sandbox) return Error(ENOENT, StrCat("sandbox ", entry.id, " is being destroyed"));
  return entry.sandbox;
}

Status SandboxManager::Record(const std::string& id, const json& record) { return registry_->Record(id, record); }

Status SandboxManager::Forget(const std::string& id) { return registry_->Forget(id); }

Status SandboxManager::Recover() {
  STRATA_ASSIGN_OR_RETURN(auto records, registry_->All());
  // Pools first (function-call sandboxes attach to theirs, ready warm
  // sandboxes to theirs), then the sandboxes.
  auto rank = [](const json& r) {
    const std::string kind = r.is_object() ? r.value("kind", "") : "";
    return kind == "pool" || kind == "warm-pool" ? 0 : kind == "warm" ? 1 : 2;
  };
  std::stable_sort(records.begin(), records.end(), [&](const auto& a, const auto& b) { return rank(a.second) < rank(b.second); });
  for (auto& [id, record] : records) {
    const std::string status = record.is_object() ? record.value("status", "") : "";
    const std::string kind = record.is_object() ? record.value("kind", "") : "";
    if (kind == "warm-pool") {
      STRATA_RETURN_IF_ERROR(warm_->Restore(id, record));
      continue;
    }
    if (const BackendKind* of = record.is_object() ? KindOf(record.value("backend", "")) : nullptr; of && of->calls) {
      std::shared_ptr<CallPools::Pool> pool = status == "running" ? calls_->Rejoin(record.value("pool", "")) : nullptr;
      if (pool) {
        auto entry = std::make_shared<Entry>();
        entry->pool = pool;
        entry->id = id;
        entry->created = record.value("created", int64_t{0});
        entry->owner = record.value("owner", "");
        entry->FromRecord(record);
        entry->last_call_ms = NowMs();  // (a restart counts as a call: the safe side)
        const json spec = record.value("spec", json::object());
        entry->spec.layers = spec.value("layers", std::vector<std::string>{});
        entry->spec.env = spec.value("env", std::vector<std::string>{});
        entry->spec.workdir = spec.value("workdir", std::string("/"));
        auto files = ParseFileRules(spec.value("files", json()), "state files");
        if (!files.ok()) {  // (its rules could not be kept: not adopted)
          calls_->Leave(*pool);
          STRATA_LOG(kWarn) << "removing function-call sandbox " << id << ": " << files.status().ToString();
          STRATA_RETURN_IF_ERROR(Forget(id));
          ++recovery_.removed;
          continue;
        }
        entry->spec.files = std::move(*files);
        entry->spec.backend = record.value("backend", "");
        sandboxes_[id] = entry;
        ++recovery_.adopted;
      } else {
        STRATA_LOG(kWarn) << "removing function-call sandbox " << id << " (its pool is gone)";
        STRATA_RETURN_IF_ERROR(Forget(id));
        ++recovery_.removed;
      }
      continue;
    }
    // A sandbox taken from a warm pool has an id of its own underneath.
    const std::string internal = record.is_object() ? record.value("internal", id) : id;
    auto sandbox = Sandbox::Adopt(internal, node_);
    if (sandbox.ok() && status == "running" && kind == "warm" && (*sandbox)->Alive() &&
        warm_->AdoptReady(record.value("pool", ""), *sandbox)) {
      continue;
    }
    if (sandbox.ok() && status == "running" && record.value("kind", "") == "pool" && (*sandbox)->Alive()) {
      calls_->Adopt(record.value("key", ""), std::move(*sandbox));
      STRATA_LOG(kInfo) << "re-adopted function-call pool " << id;
      continue;
    }
    bool settings_kept = true;
    if (sandbox.ok() && record.is_object() && record.contains("assigned")) {
      // Taken from a warm pool: the create's settings are in its record.
      if (Status s = (*sandbox)->Reassign(record["assigned"]); !s.ok()) {
        STRATA_LOG(kWarn) << "sandbox " << id << ": " << s.ToString();
        settings_kept = false;  // (its rules could not be kept: not adopted)
      }
    }
    if (sandbox.ok() && settings_kept && status == "running" && kind != "pool" && kind != "warm" && (*sandbox)->Alive()) {
      auto entry = std::make_shared<Entry>();
      entry->id = id;
      entry->warm_pool = record.value("warm", "");
      entry->memory_commit = MemoryCommit(node_, (*sandbox)->spec());
      entry->owner = record.value("owner", "");
      entry->FromRecord(record);
      entry->last_call_ms = NowMs();
      entry->sandbox = std::move(*sandbox);
      sandboxes_[id] = entry;
      ++recovery_.adopted;
      STRATA_LOG(kInfo) << "re-adopted sandbox " << id;
      continue;
    }
    // Dead, half-made or half-destroyed: remove whatever it left, after a
    // runtime the dead daemon started, which would finish creating it.
    STRATA_LOG(kWarn) << "removing sandbox " << id << " (" << (status.empty() ? "unknown" : status)
                      << (sandbox.ok() ? ", agent gone" : ", state lost") << ")";
    KillRuntimeStragglers(JoinPath(node_.run_dir, internal));
    if (sandbox.ok()) {
      Status s = (*sandbox)->Destroy();
      if (!s.ok()) STRATA_LOG(kWarn) << "remove sandbox " << id << ": " << s.ToString();
    } else {
      SweepBackend(node_, internal, nlohmann::json());  // (its state is lost: every kind's sweep)
      RemoveSandboxCgroups(node_.cgroup_parent + "/" + internal);  // (and whatever runs there: a microVM's QEMU)
      if (auto uppers = UpperStore::Open(node_.uppers); uppers.ok()) {
        if (auto v = uppers->Adopt(internal); v.ok()) v->Destroy().IgnoreError();
      }
    }
    STRATA_RETURN_IF_ERROR(Forget(id));
    ++recovery_.removed;
  }
  // What this daemon's sandboxes are called on the node (run directories,
  // upper volumes). The run directory and the uppers are this daemon's
  // alone (each claimed, node_claims.h), so what is in them and not known
  // is its own: a crash between making a thing and recording it, or a
  // failed cleanup after a failed create.
  std::set<std::string> known;
  for (auto& [id, e] : sandboxes_) known.insert(e->sandbox ? e->sandbox->id() : id);
  calls_->AddIds(known);
  warm_->AddIds(known);
  if (DIR* dir = ::opendir(node_.run_dir.c_str())) {
    std::vector<std::string> orphans;
    while (dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name.starts_with("sb-") && !known.count(name)) orphans.push_back(name);
    }
    ::closedir(dir);
    for (const auto& id : orphans) {
      auto text = ReadFileToString(JoinPath(node_.run_dir, id) + "/state.json");
      json state = text.ok() ? json::parse(*text, nullptr, false) : json();
      if (!state.is_object() || !state.value("managed", false)) continue;  // a one-shot launcher's
      KillRuntimeStragglers(JoinPath(node_.run_dir, id));
      if (auto sandbox = Sandbox::Adopt(id, node_); sandbox.ok()) {
        STRATA_LOG(kWarn) << "removing unrecorded sandbox " << id;
        (*sandbox)->Destroy().IgnoreError();
        ++recovery_.removed;
      }
    }
  }
  if (auto uppers = UpperStore::Open(node_.uppers); uppers.ok()) {
    for (const auto& name : uppers->List().value_or({})) {
      if (!name.starts_with("sb-") || known.count(name)) continue;
      if (::access(JoinPath(node_.run_dir, name).c_str(), F_OK) == 0) continue;  // (a one-shot launcher's)
      if (auto v = uppers->Adopt(name); v.ok()) {
        STRATA_LOG(kWarn) << "removing upper volume " << name << " of a sandbox that is gone";
        v->Destroy().IgnoreError();
      }
    }
  }
  // Network namespaces, veths and rules of sandboxes that are gone.
  if (node_.network) {
    Status s = node_.network->Reconcile();
    if (!s.ok()) STRATA_LOG(kWarn) << "remove leftover sandbox networks: " << s.ToString();
  }
  // Snapshots a daemon was packing when it died, of this registry's
  // sandboxes only ("<id>-<ms>"): another daemon may share the uppers'
  // filesystem, and recovery touches only what its own registry recorded
  // (every sandbox is recorded before anything of it exists). At the first
  // start in a boot, every one in its uppers: the registry that named them
  // was the earlier boot's, and no daemon has packed one since.
  if (auto uppers = UpperStore::Open(node_.uppers); uppers.ok()) {
    std::set<std::string> recorded;
    for (const auto& [id, record] : records) {
      recorded.insert(id);
      if (record.is_object()) recorded.insert(record.value("internal", id));
    }
    const bool first_start_in_boot = registry_->first_start_in_boot();
    Status s = uppers->RemoveSnapshots([&](std::string_view name) {
      if (first_start_in_boot) return true;
      const size_t dash = name.rfind('-');
      return dash != std::string_view::npos && recorded.count(std::string(name.substr(0, dash))) > 0;
    });
    if (!s.ok()) STRATA_LOG(kWarn) << "remove leftover snapshots: " << s.ToString();
    if (s.ok() && first_start_in_boot) {
      if (Status w = registry_->MarkSwept(); !w.ok()) STRATA_LOG(kWarn) << "record the snapshot sweep: " << w.ToString();
    }
  }
  return OkStatus();
}

// A ready sandbox from WarmPools, recorded as the create's.
Result<std::optional<json>> SandboxManager::TakeWarm(const SandboxSpec& spec, const std::string& owner) {
  StepTimer timer(spec.id, "warm take");
  std::optional<launcher::WarmPools::Taken> taken = warm_->Take(spec);
  if (!taken) return std::optional<json>();
  timer.Step("take a ready sandbox from the warm pool");
  std::shared_ptr<Sandbox> sb = std::move(taken->sandbox);
  json assignment = sb->Assign(spec);
  {
    // One transaction: the sandbox is the pool's or the create's, never
    // both; the create's settings are in its record (a restart hands them
    // back with Reassign), so the take writes nothing else.
    json record = {{"status", "running"}, {"created", assignment["created"]}, {"owner", owner},
                   {"internal", sb->id()}, {"warm", taken->pool}, {"assigned", std::move(assignment)}};
    record.update(Entry::RecordOf(spec));
    if (Status s = registry_->Rename(sb->id(), spec.id, record); !s.ok()) {
      STRATA_LOG(kWarn) << "warm pool " << taken->pool << ": take " << sb->id() << ": " << s.ToString();
      warm_->Discard(*sb);
      return s.Annotate("record sandbox " + spec.id);
    }
  }
  timer.Step("record");
  auto entry = std::make_shared<Entry>();
  entry->id = spec.id;
  entry->warm_pool = taken->pool;
  entry->memory_commit = MemoryCommit(node_, sb->spec());
  entry->owner = owner;
  entry->Settle(spec);
  entry->last_call_ms = NowMs();
  entry->sandbox = std::move(sb);
  {
    std::lock_guard lock(mu_);
    sandboxes_[spec.id] = entry;
  }
  warm_->Took(taken->pool);
  ++creations_;
  return std::optional<json>(entry->Info());
}

Result<json> SandboxManager::CreateCall(SandboxSpec spec, const std::string& owner) {
  auto joined = calls_->Join(spec, owner);
  if (!joined.ok()) {
    ++creation_failures_;
    return joined.status();
  }
  std::shared_ptr<CallPools::Pool> pool = std::move(*joined);
  auto entry = std::make_shared<Entry>();
  entry->id = spec.id.empty() ? NewSandboxId(node_.name) : spec.id;
  entry->created = static_cast<int64_t>(::time(nullptr));
  entry->pool = pool;
  entry->spec = spec;
  entry->owner = owner;
  entry->Settle(spec);
  entry->last_call_ms = NowMs();
  json record = {{"status", "running"}, {"backend", spec.backend}, {"pool", pool->warm->id()},
                 {"created", entry->created}, {"spec", CallSpecJson(spec)}, {"owner", owner}};
  record.update(Entry::RecordOf(spec));
  if (Status s = Record(entry->id, record); !s.ok()) {
    calls_->Leave(*pool);
    return s;
  }
  {
    std::lock_guard lock(mu_);
    sandboxes_[entry->id] = entry;
  }
  ++creations_;
  return entry->Info();
}

const BackendKind* SandboxManager::KindOf(const std::string& backend) const {
  if (!node_.backends) return nullptr;
  auto kind = node_.backends->Find(backend);
  return kind.ok() ? *kind : nullptr;
}

Result<json> SandboxManager::SetWarmPool(SandboxSpec spec, int size) { return warm_->Set(std::move(spec), size); }

json SandboxManager::WarmPools() { return warm_->List(); }

void SandboxManager::SetWarmAdmission(std::function<WarmVerdict(size_t)> admit) { warm_->SetAdmission(std::move(admit)); }

Result<json> SandboxManager::Create(SandboxSpec spec, const std::string& owner) {
  if (!spec.id.empty() && Exists(spec.id)) return Error(EEXIST, StrCat("sandbox ", spec.id, " exists"));
  if (const BackendKind* kind = KindOf(spec.backend); kind && kind->calls) return CreateCall(std::move(spec), owner);
  if (spec.id.empty()) spec.id = NewSandboxId(node_.name);
  STRATA_ASSIGN_OR_RETURN(auto taken, TakeWarm(spec, owner));
  if (taken) return std::move(*taken);
  const std::string id = spec.id;
  // Recorded before anything exists, so a crash in the middle is cleaned up.
  STRATA_RETURN_IF_ERROR(Record(id, {{"status", "creating"}, {"created", ::time(nullptr)}, {"owner", owner}}));
  auto sandbox = Sandbox::Create(spec, node_);
  if (!sandbox.ok()) {
    ++creation_failures_;
    Forget(id).IgnoreError();
    return sandbox.status();
  }
  json info = (*sandbox)->Info();
  json record = {{"status", "running"}, {"created", info["created"]}, {"owner", owner}};
  record.update(Entry::RecordOf(spec));
  Status s = Record(id, record);
  if (!s.ok()) {
    (*sandbox)->Destroy().IgnoreError();
    Forget(id).IgnoreError();
    return s;
  }
  auto entry = std::make_shared<Entry>();
  entry->id = id;
  entry->memory_commit = MemoryCommit(node_, spec);
  entry->owner = owner;
  entry->Settle(spec);
  entry->last_call_ms = NowMs();
  entry->sandbox = std::move(*sandbox);
  {
    std::lock_guard lock(mu_);
    sandboxes_[id] = entry;
  }
  ++creations_;
  return entry->Info();
}

size_t SandboxManager::Count() {
  std::lock_guard lock(mu_);
  return sandboxes_.size();
}

uint64_t SandboxManager::CommittedMemory() {
  uint64_t sum = 0;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, e] : sandboxes_) sum += e->memory_commit;
  }
  return sum + calls_->CommittedMemory() + warm_->CommittedMemory();
}

uint64_t SandboxManager::WarmFillCommit() { return warm_->FillCommit(); }

bool SandboxManager::WarmReadyFor(const SandboxSpec& spec) { return warm_->ReadyFor(spec); }

std::map<std::string, int64_t> SandboxManager::StateCounts() {
  std::map<std::string, int64_t> counts;
  std::lock_guard lock(mu_);
  for (auto& [id, e] : sandboxes_) {
    // (a sandbox's own paused flag: read without its entry's lock, as a count may be)
    ++counts[e->sandbox && e->sandbox->paused() ? "paused" : "running"];
  }
  return counts;
}

size_t SandboxManager::CountOwned(const std::string& owner) {
  std::lock_guard lock(mu_);
  size_t n = 0;
  for (auto& [id, e] : sandboxes_) n += e->owner == owner;
  return n;
}

Result<std::string> SandboxManager::Owner(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  return entry->owner;
}

bool SandboxManager::Exists(const std::string& id) {
  std::lock_guard lock(mu_);
  return sandboxes_.count(id) > 0;
}

bool SandboxManager::Live(const std::string& id) {
  auto entry = Find(id);
  if (!entry.ok()) return false;
  std::lock_guard lock((*entry)->mu);
  return !(*entry)->gone();
}

json SandboxManager::List(const std::optional<std::string>& owner) {
  std::vector<std::shared_ptr<Entry>> entries;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, e] : sandboxes_) {
      if (!owner || e->owner == *owner) entries.push_back(e);
    }
  }
  json out = json::array();
  for (auto& e : entries) {
    std::lock_guard lock(e->mu);
    if (!e->gone()) out.push_back(e->Info());
  }
  return out;
}

std::string SandboxManager::Metrics() {
  int running = 0, paused = 0;
  {
    std::vector<std::shared_ptr<Entry>> entries;
    {
      std::lock_guard lock(mu_);
      for (auto& [id, e] : sandboxes_) entries.push_back(e);
    }
    for (auto& e : entries) {
      std::lock_guard lock(e->mu);
      if (e->gone()) continue;
      (e->sandbox && e->sandbox->paused() ? paused : running)++;
    }
  }
  std::vector<double> samples;
  double sum = 0;
  {
    std::lock_guard lock(latency_mu_);
    samples = exec_ms_;
    sum = exec_ms_sum_ / 1000;
  }
  std::sort(samples.begin(), samples.end());
  auto quantile = [&](double q) {
    return samples.empty() ? 0.0 : samples[std::min(samples.size() - 1, static_cast<size_t>(q * static_cast<double>(samples.size())))] / 1000;
  };
  uint64_t layer_mounts = 0, cache_bytes = 0;
  lazyfs::Client lazyfs(node_.lazyfs_socket);
  if (auto stats = lazyfs.Call("stats"); stats.ok()) {
    layer_mounts = (*stats)["layers"].size();
    cache_bytes = (*stats)["cache"].value("bytes", uint64_t{0});
  }
  std::string out;
  out += "# HELP strata_sandboxes Sandboxes by state.\n# TYPE strata_sandboxes gauge\n";
  out += StrCat("strata_sandboxes{state=\"running\"} ", running, "\n");
  out += StrCat("strata_sandboxes{state=\"paused\"} ", paused, "\n");
  out += "# HELP strata_fncall_pools Warm function-call pools.\n# TYPE strata_fncall_pools gauge\n";
  out += StrCat("strata_fncall_pools ", calls_->Count(), "\n");
  warm_->AppendMetrics(out);
  out += "# HELP strata_sandbox_creations_total Sandboxes created.\n# TYPE strata_sandbox_creations_total counter\n";
  out += StrCat("strata_sandbox_creations_total ", creations_.load(), "\n");
  out += "# HELP strata_sandbox_creation_failures_total Sandbox creations that failed.\n# TYPE strata_sandbox_creation_failures_total counter\n";
  out += StrCat("strata_sandbox_creation_failures_total ", creation_failures_.load(), "\n");
  out += "# HELP strata_sandbox_destructions_total Sandboxes destroyed.\n# TYPE strata_sandbox_destructions_total counter\n";
  out += StrCat("strata_sandbox_destructions_total ", destructions_.load(), "\n");
  out += "# HELP strata_snapshots_total Snapshots published.\n# TYPE strata_snapshots_total counter\n";
  out += StrCat("strata_snapshots_total ", snapshots_.load(), "\n");
  out += "# HELP strata_exec_duration_seconds Exec latency (recent execs).\n# TYPE strata_exec_duration_seconds summary\n";
  char buf[64];
  for (double q : {0.5, 0.9, 0.99}) {
    std::snprintf(buf, sizeof buf, "%.6f", quantile(q));
    out += StrCat("strata_exec_duration_seconds{quantile=\"", q == 0.5 ? "0.5" : q == 0.9 ? "0.9" : "0.99", "\"} ", buf, "\n");
  }
  std::snprintf(buf, sizeof buf, "%.6f", sum);
  out += StrCat("strata_exec_duration_seconds_sum ", buf, "\n");
  out += StrCat("strata_exec_duration_seconds_count ", execs_.load(), "\n");
  out += "# HELP strata_layer_mounts Layers mounted by lazyfs on this node.\n# TYPE strata_layer_mounts gauge\n";
  out += StrCat("strata_layer_mounts ", layer_mounts, "\n");
  out += "# HELP strata_cache_bytes Bytes in the node's chunk cache.\n# TYPE strata_cache_bytes gauge\n";
  out += StrCat("strata_cache_bytes ", cache_bytes, "\n");
  out += StepMetrics();
  return out;
}

}  // namespace strata::launcher
