// SandboxManager: the daemon's sandboxes and their registry.
#include "launcher/node/manager.h"
#include "launcher/node/warm_policy.h"

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
#include "launcher/sandbox/backend.h"
#include "lazyfs/client.h"
#include "packdiff/packdiff.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

constexpr size_t kLatencySamples = 4096;
// How long an unused function-call pool stays warm.
constexpr auto kPoolGrace = std::chrono::seconds(30);

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

constexpr int kWarmFillers = 2;     // sandboxes made at once for pools
constexpr int kWarmMaxSize = 4096;

json CallSpecJson(const SandboxSpec& spec) {
  return {{"layers", spec.layers}, {"env", spec.env}, {"workdir", spec.workdir}, {"files", spec.files.ToJson()}};
}


}  // namespace

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

json SandboxManager::Entry::Info() const {
  auto with_ttl = [&](json info) {
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

void SandboxManager::ReapPools(bool all) {
  std::vector<std::shared_ptr<Pool>> idle;
  {
    std::lock_guard lock(pools_mu_);
    const auto now = std::chrono::steady_clock::now();
    for (auto it = pools_.begin(); it != pools_.end();) {
      if (it->second->users == 0 && (all || now - it->second->idle_since > kPoolGrace)) {
        idle.push_back(it->second);
        it = pools_.erase(it);
      } else {
        ++it;
      }
    }
    std::erase_if(retired_, [&](const std::shared_ptr<Pool>& p) {
      if (p->users > 0) return false;
      idle.push_back(p);
      return true;
    });
  }
  for (auto& pool : idle) {
    const std::string id = pool->warm->id();
    Status s = pool->warm->Destroy();
    if (!s.ok()) STRATA_LOG(kWarn) << "remove function-call pool " << id << ": " << s.ToString();
    Forget(id).IgnoreError();
  }
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
        entry->ttl = record.value("ttl", int64_t{0});
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
      entry->ttl = record.value("ttl", int64_t{0});
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

Result<json> SandboxManager::CreateCall(SandboxSpec spec, const std::string& owner) {
  const std::string key = PoolKey(spec, owner);
  std::shared_ptr<Pool> pool;
  {
    std::lock_guard lock(pools_mu_);
    if (auto it = pools_.find(key); it != pools_.end()) {
      pool = it->second;
      ++pool->users;
    }
  }
  if (pool && !pool->warm->Alive()) {
    // Its agent died (killed, out of memory): a new pool for this and later
    // sandboxes; the old one goes once its last user is destroyed.
    STRATA_LOG(kWarn) << "function-call pool " << pool->warm->id() << " does not answer; starting a new one";
    std::lock_guard lock(pools_mu_);
    if (auto it = pools_.find(key); it != pools_.end() && it->second == pool) {
      pools_.erase(it);
      retired_.push_back(pool);
    }
    --pool->users;
    pool.reset();
  }
  if (!pool) {
    // A new warm sandbox for this stack (two first creations may race: the
    // loser's goes again).
    SandboxSpec warm_spec = spec;
    warm_spec.id = NewSandboxId(node_.name);
    warm_spec.env.clear();
    warm_spec.workdir = "/";
    STRATA_RETURN_IF_ERROR(Record(warm_spec.id, {{"status", "creating"}, {"kind", "pool"}, {"key", key}}));
    auto warm = Sandbox::Create(warm_spec, node_);
    if (!warm.ok()) {
      ++creation_failures_;
      Forget(warm_spec.id).IgnoreError();
      return warm.status();
    }
    if (Status s = Record(warm_spec.id, {{"status", "running"}, {"kind", "pool"}, {"key", key}}); !s.ok()) {
      (*warm)->Destroy().IgnoreError();
      Forget(warm_spec.id).IgnoreError();
      return s;
    }
    std::unique_ptr<Sandbox> spare;
    {
      std::lock_guard lock(pools_mu_);
      auto& slot = pools_[key];
      if (!slot) {
        slot = std::make_shared<Pool>();
        slot->key = key;
        slot->warm = std::move(*warm);
      } else {
        spare = std::move(*warm);
      }
      pool = slot;
      ++pool->users;
    }
    if (spare) {
      spare->Destroy().IgnoreError();
      Forget(warm_spec.id).IgnoreError();
    }
  }
  auto entry = std::make_shared<Entry>();
  entry->id = spec.id.empty() ? NewSandboxId(node_.name) : spec.id;
  entry->created = static_cast<int64_t>(::time(nullptr));
  entry->pool = pool;
  entry->spec = spec;
  entry->owner = owner;
  entry->ttl = spec.ttl_seconds;
  entry->last_call_ms = NowMs();
  Status s = Record(entry->id, {{"status", "running"}, {"backend", spec.backend}, {"pool", pool->warm->id()},
                                {"created", entry->created}, {"spec", CallSpecJson(spec)}, {"owner", owner},
                                {"ttl", spec.ttl_seconds}});
  if (!s.ok()) {
    std::lock_guard lock(pools_mu_);
    if (--pool->users == 0) pool->idle_since = std::chrono::steady_clock::now();
    return s;
  }
  {
    std::lock_guard lock(mu_);
    sandboxes_[entry->id] = entry;
  }
  ++creations_;
  return entry->Info();
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
  Status s = Record(id, {{"status", "running"}, {"created", info["created"]}, {"owner", owner}, {"ttl", spec.ttl_seconds}});
  if (!s.ok()) {
    (*sandbox)->Destroy().IgnoreError();
    Forget(id).IgnoreError();
    return s;
  }
  auto entry = std::make_shared<Entry>();
  entry->id = id;
  entry->memory_commit = MemoryCommit(node_, spec);
  entry->owner = owner;
  entry->ttl = spec.ttl_seconds;
  entry->last_call_ms = NowMs();
  entry->sandbox = std::move(*sandbox);
  {
    std::lock_guard lock(mu_);
    sandboxes_[id] = entry;
  }
  ++creations_;
  return entry->Info();
}

// --- warm pools -------------------------------------------------------------

json SandboxManager::WarmPool::Info() const {
  json j = WarmSpecJson(spec);
  j["name"] = name;
  j["size"] = size;
  j["ready"] = ready.size();
  j["filling"] = filling;
  j["removing"] = removing;
  j["taken"] = taken;
  j["made"] = made;
  j["failures"] = failures;
  j["shed"] = shed;
  if (!last_error.empty()) j["last_error"] = last_error;
  return j;
}

Status SandboxManager::RecordWarmPool(const WarmPool& pool) {
  // (The lasting registry: a pool outlives a reboot, its sandboxes do not.)
  const std::string key = "warm:" + pool.name;
  if (pool.size == 0) return registry_->ForgetLasting(key);
  return registry_->RecordLasting(
      key, {{"kind", "warm-pool"}, {"name", pool.name}, {"size", pool.size}, {"spec", WarmSpecJson(pool.spec)}});
}

void SandboxManager::SetWarmAdmission(std::function<WarmVerdict(size_t)> admit) {
  {
    std::lock_guard lock(admit_mu_);  // (waits for a call in progress)
    warm_admit_ = std::move(admit);
  }
  warm_cv_.notify_all();
}

const BackendKind* SandboxManager::KindOf(const std::string& backend) const {
  if (!node_.backends) return nullptr;
  auto kind = node_.backends->Find(backend);
  return kind.ok() ? *kind : nullptr;
}

bool SandboxManager::Pooled(const std::string& backend) const {
  const BackendKind* kind = KindOf(backend);
  return kind && kind->warm_pools;
}

Result<json> SandboxManager::SetWarmPool(SandboxSpec spec, int size) {
  if (!Pooled(spec.backend)) {
    std::vector<std::string> pooled;
    if (node_.backends) {
      node_.backends->ForEach([&](const BackendKind& k) {
        if (k.warm_pools) pooled.push_back(k.name);
      });
    }
    return Error(EINVAL, StrCat("warm pool: back end ", Quote(spec.backend), " is not pooled (", Join(pooled, " and "),
                                " are; function calls share one warm sandbox already)"));
  }
  if (spec.layers.empty()) return Error(EINVAL, "warm pool: no layers");
  if (size < 0 || size > kWarmMaxSize) return Error(EINVAL, StrCat("warm pool: size must be from 0 to ", kWarmMaxSize));
  if (spec.network.mode == NetMode::kHost) return Error(EINVAL, "warm pool: a pool does not share the host's network");
  // The layers must resolve now, not in the background.
  {
    STRATA_ASSIGN_OR_RETURN(auto store, cache::OpenStore(cache::DefaultStoreUrl(spec.store)));
    cache::Catalog catalog(store);
    STRATA_RETURN_IF_ERROR(catalog.ResolveStack(spec.layers).status().Annotate("warm pool"));
  }
  const std::string key = WarmKey(spec);
  json info;
  {
    std::lock_guard lock(warm_mu_);
    auto& pool = warm_[key];
    if (!pool) {
      pool = std::make_shared<WarmPool>();
      pool->key = key;
      pool->name = "wp-" + HashBytes(key).Hex().substr(0, 12);
      pool->spec = spec;
      pool->spec.env.clear();
      pool->spec.files = {};
      pool->spec.id.clear();
      pool->spec.ttl_seconds = 0;
    }
    const int old_size = pool->size;
    pool->size = size;
    if (Status s = RecordWarmPool(*pool); !s.ok()) {
      pool->size = old_size;
      return s.Annotate("warm pool " + pool->name);
    }
    info = pool->Info();
    // (A pool of size 0 stays in the map until its ready sandboxes are gone.)
  }
  warm_cv_.notify_all();
  return info;
}

json SandboxManager::WarmPools() {
  json out = json::array();
  std::lock_guard lock(warm_mu_);
  for (auto& [key, pool] : warm_) {
    if (pool->size > 0 || !pool->ready.empty() || pool->filling > 0 || pool->removing > 0) out.push_back(pool->Info());
  }
  return out;
}

Result<std::optional<json>> SandboxManager::TakeWarm(const SandboxSpec& spec, const std::string& owner) {
  if (!Pooled(spec.backend)) return std::optional<json>();
  StepTimer timer(spec.id);
  const std::string key = WarmKey(spec);
  std::shared_ptr<WarmPool> pool;
  std::shared_ptr<Sandbox> sb;
  while (true) {
    {
      std::lock_guard lock(warm_mu_);
      auto it = warm_.find(key);
      if (it == warm_.end() || it->second->ready.empty()) return std::optional<json>();
      pool = it->second;
      sb = std::move(pool->ready.front());
      pool->ready.pop_front();
      last_take_ = std::chrono::steady_clock::now();
    }
    warm_cv_.notify_all();  // a filler makes the next one
    timer.Step("take from the warm pool");
    if (sb->Takeable()) break;
    // Its agent died while it waited (killed, out of memory): the next one.
    STRATA_LOG(kWarn) << "warm pool " << pool->name << ": sandbox " << sb->id() << " does not answer; removing it";
    sb->Destroy().IgnoreError();
    Forget(sb->id()).IgnoreError();
  }
  auto give_back = [&](const Status& s) {
    STRATA_LOG(kWarn) << "warm pool " << pool->name << ": take " << sb->id() << ": " << s.ToString();
    sb->Destroy().IgnoreError();
    Forget(sb->id()).IgnoreError();
    return s;
  };
  timer.Step("see that its agent is there");
  json assignment = sb->Assign(spec);
  {
    // One transaction: the sandbox is the pool's or the create's, never
    // both; the create's settings are in its record (a restart hands them
    // back with Reassign), so the take writes nothing else.
    const json record = {{"status", "running"}, {"created", assignment["created"]}, {"owner", owner}, {"ttl", spec.ttl_seconds},
                         {"internal", sb->id()}, {"warm", pool->name}, {"assigned", std::move(assignment)}};
    if (Status s = registry_->Rename(sb->id(), spec.id, record); !s.ok()) return give_back(s.Annotate("record sandbox " + spec.id));
  }
  timer.Step("record");
  auto entry = std::make_shared<Entry>();
  entry->id = spec.id;
  entry->warm_pool = pool->name;
  entry->memory_commit = MemoryCommit(node_, sb->spec());
  entry->owner = owner;
  entry->ttl = spec.ttl_seconds;
  entry->last_call_ms = NowMs();
  entry->sandbox = std::move(sb);
  {
    std::lock_guard lock(mu_);
    sandboxes_[spec.id] = entry;
  }
  {
    std::lock_guard lock(warm_mu_);
    ++pool->taken;
  }
  ++creations_;
  return std::optional<json>(entry->Info());
}

// Each filler thread: picks a pool short of ready sandboxes and makes one,
// or removes one no pool wants (a pool shrunk or removed, memory short).
void SandboxManager::FillWarm() {
  std::unique_lock lock(warm_mu_);
  while (!warm_stopping_) {
    size_t held = 0;
    for (auto& [key, p] : warm_) held += p->ready.size() + static_cast<size_t>(p->filling);
    WarmVerdict verdict;
    lock.unlock();
    {
      std::lock_guard admit_lock(admit_mu_);
      if (warm_admit_) verdict = warm_admit_(held);
    }
    lock.lock();
    if (warm_stopping_) break;
    // The pools as the policy sees them (warm_policy.h), in warm_'s order.
    std::vector<std::shared_ptr<WarmPool>> pools;
    std::vector<warm::PoolView> views;
    auto look = [&] {
      pools.clear();
      views.clear();
      for (auto& [key, p] : warm_) {
        pools.push_back(p);
        views.push_back({.size = p->size, .ready = static_cast<int>(p->ready.size()), .filling = p->filling, .retry_at = p->retry_at});
      }
    };
    look();
    // Surplus first: a shrunk pool's, or any under memory pressure.
    if (const int i = warm::Surplus(views, verdict.shed); i >= 0) {
      std::shared_ptr<WarmPool> from = pools[i];
      std::shared_ptr<Sandbox> surplus = std::move(from->ready.back());
      from->ready.pop_back();
      if (verdict.shed) ++from->shed;
      ++from->removing;
      lock.unlock();
      const std::string id = surplus->id();
      Status s = surplus->Destroy();
      if (!s.ok()) STRATA_LOG(kWarn) << "warm pool " << from->name << ": remove " << id << ": " << s.ToString();
      Forget(id).IgnoreError();
      surplus.reset();
      lock.lock();
      --from->removing;
      continue;
    }
    std::erase_if(warm_, [](const auto& kv) {
      return kv.second->size == 0 && kv.second->ready.empty() && kv.second->filling == 0 && kv.second->removing == 0;
    });
    look();
    const auto now = std::chrono::steady_clock::now();
    const int fill = warm::ToFill(views, verdict.status.ok(), now);
    // A burst of takes comes first (or the pool has run dry).
    if (fill >= 0 && warm::WaitForQuiet(views[fill], now, last_take_)) {
      warm_cv_.wait_for(lock, warm::kRefillQuiet);
      continue;
    }
    if (fill < 0) {
      // (Woken by a take, a new size or the admission; else a look every
      // half second: memory comes and goes.)
      warm_cv_.wait_for(lock, std::chrono::milliseconds(500));
      continue;
    }
    std::shared_ptr<WarmPool> pool = pools[fill];
    ++pool->filling;
    SandboxSpec spec = pool->spec;
    lock.unlock();
    spec.id = NewSandboxId(node_.name);
    Status s = Record(spec.id, {{"status", "creating"}, {"kind", "warm"}, {"pool", pool->name}});
    std::shared_ptr<Sandbox> made;
    if (s.ok()) {
      auto sb = Sandbox::Create(spec, node_);
      if (sb.ok()) {
        made = std::move(*sb);
        if (made->kind().warm_up && !WarmUpGuest(*made)) {
          s = Error(EHOSTDOWN, StrCat("sandbox ", spec.id, ": it stopped answering its warm-up command"));
        } else {
          s = Record(spec.id, {{"status", "running"}, {"kind", "warm"}, {"pool", pool->name}});
        }
        if (!s.ok()) {
          made->Destroy().IgnoreError();
          made.reset();
        }
      } else {
        s = sb.status();
      }
      if (!made) Forget(spec.id).IgnoreError();
    }
    lock.lock();
    --pool->filling;
    if (made) {
      ++pool->made;
      pool->ready.push_back(std::move(made));  // (a surplus goes in the next round)
      pool->retry_at = {};
      pool->streak = 0;
      pool->last_error.clear();
    } else {
      ++pool->failures;
      ++pool->streak;
      pool->last_error = s.ToString();
      // Backs off: a pool whose layers went away must not spin.
      pool->retry_at = std::chrono::steady_clock::now() + warm::Backoff(pool->streak);
      STRATA_LOG(kWarn) << "warm pool " << pool->name << ": " << s.ToString();
    }
  }
}

// A pooled guest's first command costs what no later one does: under TCG
// the guest's fork and exec paths are translated the first time they run
// (100-120 ms here, against 20 for the next). So the pool runs one before
// it offers the guest; it leaves nothing behind, and a stack without
// `true` only keeps that cost for its taker. The agent bounds the command;
// a guest that hangs whole is abandoned when the daemon stops.
bool SandboxManager::WarmUpGuest(Sandbox& sb) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return sb.Alive();
  UniqueFd hangup(p[0]);
  {
    std::lock_guard lock(warm_mu_);
    if (warm_stopping_) {
      ::close(p[1]);
      return false;
    }
    warm_up_cancels_.push_back(p[1]);
  }
  ExecRequest warm;
  warm.argv = {"true"};
  warm.timeout = std::chrono::seconds(30);
  warm.cancel_fd = hangup.get();
  auto r = sb.Exec(std::move(warm), [](int, std::string_view) {});
  {
    std::lock_guard lock(warm_mu_);
    if (auto it = std::find(warm_up_cancels_.begin(), warm_up_cancels_.end(), p[1]); it != warm_up_cancels_.end()) {
      warm_up_cancels_.erase(it);
      ::close(p[1]);
    }
    if (warm_stopping_) return false;
  }
  if (!r.ok()) STRATA_LOG(kWarn) << "warm pool: warm-up command in " << sb.id() << ": " << r.status().ToString();
  return r.ok() || sb.Alive();
}

Result<std::shared_ptr<SandboxManager::Entry>> SandboxManager::Find(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = sandboxes_.find(id);
  if (it == sandboxes_.end()) return Error(ENOENT, StrCat("sandbox ", Quote(id), ": no such sandbox"));
  return it->second;
}

Result<ExecResult> SandboxManager::Exec(const std::string& id, ExecRequest request, const OutputSink& sink) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sb;  // kept alive while the command runs
  std::shared_ptr<Pool> pool;
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

Result<std::string> SandboxManager::StartDetached(const std::string& id, ExecRequest request, const std::string& exec_id) {
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
  STRATA_ASSIGN_OR_RETURN(json ping, sb->agent().Ping());
  if (ping.value("version", 1) < 2) {
    return Error(ENOTSUP, StrCat("sandbox ", id, ": its agent speaks protocol ", ping.value("version", 1),
                                 "; detached commands need 2 (a sandbox created by this strata)"));
  }
  EntryBusy busy(*entry);
  return sb->agent().StartDetached(request, exec_id);
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

void SandboxManager::ReapExpired() {
  std::vector<std::string> expired;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, e] : sandboxes_) {
      if (e->ttl > 0 && e->busy.load() == 0 && e->ExpiresInMs() <= 0) expired.push_back(id);
    }
  }
  for (const auto& id : expired) {
    // (Checked again: a call may have begun since.)
    auto entry = Find(id);
    if (!entry.ok() || (*entry)->busy.load() > 0 || (*entry)->ExpiresInMs() > 0) continue;
    STRATA_LOG(kInfo) << "sandbox " << id << ": its ttl passed with no call; destroying it";
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
                                                                         uint32_t mode) {
  STRATA_ASSIGN_OR_RETURN(auto entry, Find(id));
  std::shared_ptr<Sandbox> sb;
  {
    std::lock_guard lock(entry->mu);
    STRATA_ASSIGN_OR_RETURN(sb, Container(*entry, "put"));
  }
  // The stream keeps the sandbox object alive (like an exec) while it runs.
  STRATA_ASSIGN_OR_RETURN(auto stream, sb->agent().BeginPut(path, mode, std::nullopt));
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
  std::shared_ptr<Pool> pool;
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
    {
      std::lock_guard lock(pools_mu_);
      if (--pool->users == 0) pool->idle_since = std::chrono::steady_clock::now();
    }
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
