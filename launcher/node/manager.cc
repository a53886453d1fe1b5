// SandboxManager: the daemon's sandboxes. This file opens it, recovers
// what an earlier daemon left, creates and answers the node's queries;
// function-call pools are in calls.cc, warm pools in warm_pools.cc, execs
// and the rest of a sandbox's life in lifecycle.cc.
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

// Pools are not shared across tenants (their calls share a cgroup).
std::string PoolKey(const SandboxSpec& spec, const std::string& owner) {
  return StrCat(owner, "|", Join(spec.layers, ","), "|", cache::DefaultStoreUrl(spec.store), "|", spec.limits.cpus, "|", spec.limits.memory,
                "|", spec.limits.pids, "|", spec.network.ToJson().dump());
}

// Warm pools: what a ready sandbox must match (the rest a take assigns).
std::string WarmKey(const SandboxSpec& spec) {
  return StrCat(spec.backend, "|", Join(spec.layers, ","), "|", cache::DefaultStoreUrl(spec.store), "|", spec.limits.cpus, "|", spec.limits.memory, "|",
                spec.limits.pids, "|", spec.disk, "|", spec.network.ToJson().dump());
}

json WarmSpecJson(const SandboxSpec& spec) {
  return {{"backend", spec.backend},          {"layers", spec.layers}, {"store", spec.store},
          {"cpus", spec.limits.cpus},          {"memory", spec.limits.memory},
          {"pids", spec.limits.pids},          {"disk", spec.disk},
          {"network", spec.network.ToJson()}};
}

Result<SandboxSpec> WarmSpecFromJson(const json& j) {
  SandboxSpec spec;
  try {
    spec.backend = j.value("backend", std::string(kDefaultBackend));  // (pools recorded before microVM pools were container ones)
    spec.layers = j.at("layers").get<std::vector<std::string>>();
    spec.store = j.value("store", "");
    spec.limits.cpus = j.value("cpus", 0.0);
    spec.limits.memory = j.value("memory", uint64_t{0});
    spec.limits.pids = j.value("pids", int64_t{0});
    spec.disk = j.value("disk", uint64_t{10} << 30);
  } catch (const json::exception& e) {
    return Error(EINVAL, StrCat("warm pool spec: ", e.what()));
  }
  STRATA_ASSIGN_OR_RETURN(spec.network, NetPolicy::FromJson(j.value("network", json())));
  return spec;
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
  Status s = m->Recover();
  if (!s.ok()) return s.Annotate("recover sandboxes from " + state_dir);
  STRATA_ASSIGN_OR_RETURN(m->keys_, IdempotencyKeys::Open(JoinPath(state_dir, "keys")));
  m->keys_->Expire();
  for (int i = 0; i < kWarmFillers; ++i) m->fillers_.emplace_back([p = m.get()] { p->FillWarm(); });
  m->reaper_ = std::thread([p = m.get()] {
    std::unique_lock lock(p->pools_mu_);
    int rounds = 0;
    while (!p->reaper_cv_.wait_for(lock, std::chrono::seconds(5), [p] { return p->stopping_; })) {
      lock.unlock();
      p->ReapPools(false);
      p->ReapExpired();
      if (++rounds % 60 == 0) p->keys_->Expire();
      lock.lock();
    }
  });
  return m;
}

SandboxManager::~SandboxManager() {
  {
    std::lock_guard lock(pools_mu_);
    stopping_ = true;
  }
  reaper_cv_.notify_all();
  if (reaper_.joinable()) reaper_.join();
  {
    std::lock_guard lock(warm_mu_);
    warm_stopping_ = true;
    for (int fd : warm_up_cancels_) ::close(fd);  // (abandons warm-up commands)
    warm_up_cancels_.clear();
  }
  warm_cv_.notify_all();
  for (auto& t : fillers_) t.join();
  // Ready warm sandboxes, like the others, are adopted again by the next daemon.
  for (auto& [key, pool] : warm_) {
    for (auto& sb : pool->ready) sb->Release();
  }
  // Idle pools are only a cache: they go. Sandboxes outlive the daemon (a
  // restart re-adopts them): the objects just let go.
  ReapPools(true);
  std::lock_guard lock(mu_);
  for (auto& [id, entry] : sandboxes_) {
    std::lock_guard entry_lock(entry->mu);
    if (entry->sandbox) entry->sandbox->Release();
  }
  std::lock_guard pools_lock(pools_mu_);
  for (auto& [key, pool] : pools_) pool->warm->Release();
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
      auto spec = WarmSpecFromJson(record.value("spec", json::object()));
      if (!spec.ok()) {
        STRATA_LOG(kWarn) << "removing warm pool " << id << ": " << spec.status().ToString();
        STRATA_RETURN_IF_ERROR(registry_->ForgetLasting(id));
        continue;
      }
      auto pool = std::make_shared<WarmPool>();
      pool->key = WarmKey(*spec);
      pool->name = record.value("name", "");
      pool->spec = std::move(*spec);
      pool->size = record.value("size", 0);
      warm_[pool->key] = pool;
      continue;
    }
    if (const BackendKind* of = record.is_object() ? KindOf(record.value("backend", "")) : nullptr; of && of->calls) {
      std::shared_ptr<Pool> pool;
      for (auto& [key, p] : pools_) {
        if (p->warm->id() == record.value("pool", "")) pool = p;
      }
      if (pool && status == "running") {
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
          STRATA_LOG(kWarn) << "removing function-call sandbox " << id << ": " << files.status().ToString();
          STRATA_RETURN_IF_ERROR(Forget(id));
          ++recovery_.removed;
          continue;
        }
        entry->spec.files = std::move(*files);
        entry->spec.backend = record.value("backend", "");
        ++pool->users;
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
    if (sandbox.ok() && status == "running" && kind == "warm" && (*sandbox)->Alive()) {
      std::shared_ptr<WarmPool> pool;
      for (auto& [key, p] : warm_) {
        if (p->name == record.value("pool", "")) pool = p;
      }
      if (pool) {
        pool->ready.push_back(std::move(*sandbox));
        continue;
      }
    }
    if (sandbox.ok() && status == "running" && record.value("kind", "") == "pool" && (*sandbox)->Alive()) {
      auto pool = std::make_shared<Pool>();
      pool->key = record.value("key", "");
      pool->warm = std::move(*sandbox);
      pool->idle_since = std::chrono::steady_clock::now();
      pools_[pool->key] = pool;
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
  for (auto& [key, p] : pools_) known.insert(p->warm->id());
  for (auto& [key, p] : warm_) {
    for (auto& sb : p->ready) known.insert(sb->id());
  }
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
  {
    std::lock_guard lock(pools_mu_);
    for (auto& [key, p] : pools_) sum += MemoryCommit(node_, p->warm->spec());
  }
  std::lock_guard lock(warm_mu_);
  for (auto& [key, p] : warm_) sum += (p->ready.size() + static_cast<size_t>(p->filling)) * MemoryCommit(node_, p->spec);
  return sum;
}

uint64_t SandboxManager::WarmFillCommit() {
  uint64_t most = 0;
  std::lock_guard lock(warm_mu_);
  for (auto& [key, p] : warm_) {
    if (static_cast<int>(p->ready.size()) + p->filling < p->size) most = std::max(most, MemoryCommit(node_, p->spec));
  }
  return most;
}

bool SandboxManager::WarmReadyFor(const SandboxSpec& spec) {
  if (!Pooled(spec.backend)) return false;
  std::lock_guard lock(warm_mu_);
  auto it = warm_.find(WarmKey(spec));
  return it != warm_.end() && !it->second->ready.empty();
}

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
  size_t pools = 0;
  {
    std::lock_guard lock(pools_mu_);
    pools = pools_.size();
  }
  out += "# HELP strata_fncall_pools Warm function-call pools.\n# TYPE strata_fncall_pools gauge\n";
  out += StrCat("strata_fncall_pools ", pools, "\n");
  {
    std::lock_guard lock(warm_mu_);
    out += "# HELP strata_warm_ready Ready sandboxes of warm pools, by pool.\n# TYPE strata_warm_ready gauge\n";
    for (auto& [key, p] : warm_) out += StrCat("strata_warm_ready{pool=\"", p->name, "\"} ", p->ready.size(), "\n");
    out += "# HELP strata_warm_taken_total Creations served by a warm pool, by pool.\n# TYPE strata_warm_taken_total counter\n";
    for (auto& [key, p] : warm_) out += StrCat("strata_warm_taken_total{pool=\"", p->name, "\"} ", p->taken, "\n");
  }
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
  return out;
}

}  // namespace strata::launcher
