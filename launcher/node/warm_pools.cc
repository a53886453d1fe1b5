// WarmPools: ready sandboxes of a stack kept for the creates that match,
// filled and shed by the policy of warm_policy.h.
#include "launcher/node/warm_pools.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/hash.h"
#include "launcher/node/warm_policy.h"
#include "launcher/sandbox/backend.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

constexpr int kWarmMaxSize = 4096;  // ready sandboxes one pool may ask for

}  // namespace

std::string WarmKey(const SandboxSpec& spec) {
  return StrCat(spec.backend, "|", spec.runtime, "|", Join(spec.layers, ","), "|", cache::DefaultStoreUrl(spec.store), "|", spec.limits.cpus, "|", spec.limits.memory, "|",
                spec.limits.pids, "|", spec.disk, "|", spec.network.ToJson().dump());
}

json WarmSpecJson(const SandboxSpec& spec) {
  json j = {{"backend", spec.backend},          {"layers", spec.layers}, {"store", spec.store},
          {"cpus", spec.limits.cpus},          {"memory", spec.limits.memory},
          {"pids", spec.limits.pids},          {"disk", spec.disk},
          {"network", spec.network.ToJson()}};
  if (!spec.runtime.empty()) j["runtime"] = spec.runtime;
  return j;
}

Result<SandboxSpec> WarmSpecFromJson(const json& j) {
  SandboxSpec spec;
  try {
    spec.backend = j.value("backend", std::string(kDefaultBackend));  // (pools recorded before microVM pools were container ones)
    spec.runtime = j.value("runtime", "");
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

json WarmPools::Pool::Info() const {
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

WarmPools::~WarmPools() { Stop(); }

void WarmPools::Start(int fillers) {
  for (int i = 0; i < fillers; ++i) fillers_.emplace_back([this] { Fill(); });
}

void WarmPools::Stop() {
  {
    std::lock_guard lock(mu_);
    if (stopping_ && fillers_.empty()) return;
    stopping_ = true;
    for (int fd : warm_up_cancels_) ::close(fd);  // (abandons warm-up commands)
    warm_up_cancels_.clear();
  }
  cv_.notify_all();
  for (auto& t : fillers_) t.join();
  fillers_.clear();
  // Ready warm sandboxes, like the others, are adopted again by the next daemon.
  std::lock_guard lock(mu_);
  for (auto& [key, pool] : pools_) {
    for (auto& sb : pool->ready) sb->Release();
  }
}

Status WarmPools::Restore(const std::string& key, const json& record) {
  auto spec = WarmSpecFromJson(record.value("spec", json::object()));
  if (!spec.ok()) {
    STRATA_LOG(kWarn) << "removing warm pool " << key << ": " << spec.status().ToString();
    return registry_.ForgetLasting(key);
  }
  auto pool = std::make_shared<Pool>();
  pool->key = WarmKey(*spec);
  pool->name = record.value("name", "");
  pool->spec = std::move(*spec);
  pool->size = record.value("size", 0);
  std::lock_guard lock(mu_);
  pools_[pool->key] = std::move(pool);
  return OkStatus();
}

bool WarmPools::AdoptReady(const std::string& name, std::unique_ptr<Sandbox>& sandbox) {
  std::lock_guard lock(mu_);
  for (auto& [key, p] : pools_) {
    if (p->name == name) {
      p->ready.push_back(std::move(sandbox));
      return true;
    }
  }
  return false;
}

Status WarmPools::RecordPool(const Pool& pool) {
  // (The lasting registry: a pool outlives a reboot, its sandboxes do not.)
  const std::string key = "warm:" + pool.name;
  if (pool.size == 0) return registry_.ForgetLasting(key);
  return registry_.RecordLasting(
      key, {{"kind", "warm-pool"}, {"name", pool.name}, {"size", pool.size}, {"spec", WarmSpecJson(pool.spec)}});
}

void WarmPools::SetAdmission(std::function<Verdict(size_t)> admit) {
  {
    std::lock_guard lock(admit_mu_);  // (waits for a call in progress)
    admit_ = std::move(admit);
  }
  cv_.notify_all();
}

bool WarmPools::Pooled(const std::string& backend) const {
  if (!node_.backends) return false;
  auto kind = node_.backends->Find(backend);
  return kind.ok() && (*kind)->warm_pools;
}

Result<json> WarmPools::Set(SandboxSpec spec, int size) {
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
    std::lock_guard lock(mu_);
    auto& pool = pools_[key];
    if (!pool) {
      pool = std::make_shared<Pool>();
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
    if (Status s = RecordPool(*pool); !s.ok()) {
      pool->size = old_size;
      return s.Annotate("warm pool " + pool->name);
    }
    info = pool->Info();
    // (A pool of size 0 stays in the map until its ready sandboxes are gone.)
  }
  cv_.notify_all();
  return info;
}

json WarmPools::List() {
  json out = json::array();
  std::lock_guard lock(mu_);
  for (auto& [key, pool] : pools_) {
    if (pool->size > 0 || !pool->ready.empty() || pool->filling > 0 || pool->removing > 0) out.push_back(pool->Info());
  }
  return out;
}

std::optional<WarmPools::Taken> WarmPools::Take(const SandboxSpec& spec) {
  if (!Pooled(spec.backend)) return std::nullopt;
  const std::string key = WarmKey(spec);
  while (true) {
    std::shared_ptr<Pool> pool;
    std::shared_ptr<Sandbox> sb;
    {
      std::lock_guard lock(mu_);
      auto it = pools_.find(key);
      if (it == pools_.end() || it->second->ready.empty()) return std::nullopt;
      pool = it->second;
      sb = std::move(pool->ready.front());
      pool->ready.pop_front();
      last_take_ = std::chrono::steady_clock::now();
    }
    cv_.notify_all();  // a filler makes the next one
    if (sb->Takeable()) return Taken{std::move(sb), pool->name};
    // Its agent died while it waited (killed, out of memory): the next one.
    STRATA_LOG(kWarn) << "warm pool " << pool->name << ": sandbox " << sb->id() << " does not answer; removing it";
    Discard(*sb);
  }
}

void WarmPools::Took(const std::string& name) {
  std::lock_guard lock(mu_);
  for (auto& [key, p] : pools_) {
    if (p->name == name) ++p->taken;
  }
}

void WarmPools::Discard(Sandbox& sandbox) {
  sandbox.Destroy().IgnoreError();
  registry_.Forget(sandbox.id()).IgnoreError();
}

uint64_t WarmPools::CommittedMemory() {
  uint64_t sum = 0;
  std::lock_guard lock(mu_);
  for (auto& [key, p] : pools_) sum += (p->ready.size() + static_cast<size_t>(p->filling)) * MemoryCommit(node_, p->spec);
  return sum;
}

uint64_t WarmPools::FillCommit() {
  uint64_t most = 0;
  std::lock_guard lock(mu_);
  for (auto& [key, p] : pools_) {
    if (static_cast<int>(p->ready.size()) + p->filling < p->size) most = std::max(most, MemoryCommit(node_, p->spec));
  }
  return most;
}

bool WarmPools::ReadyFor(const SandboxSpec& spec) {
  if (!Pooled(spec.backend)) return false;
  std::lock_guard lock(mu_);
  auto it = pools_.find(WarmKey(spec));
  return it != pools_.end() && !it->second->ready.empty();
}

void WarmPools::AddIds(std::set<std::string>& ids) {
  std::lock_guard lock(mu_);
  for (auto& [key, p] : pools_) {
    for (auto& sb : p->ready) ids.insert(sb->id());
  }
}

void WarmPools::AppendMetrics(std::string& out) {
  std::lock_guard lock(mu_);
  out += "# HELP strata_warm_ready Ready sandboxes of warm pools, by pool.\n# TYPE strata_warm_ready gauge\n";
  for (auto& [key, p] : pools_) out += StrCat("strata_warm_ready{pool=\"", p->name, "\"} ", p->ready.size(), "\n");
  out += "# HELP strata_warm_taken_total Creations served by a warm pool, by pool.\n# TYPE strata_warm_taken_total counter\n";
  for (auto& [key, p] : pools_) out += StrCat("strata_warm_taken_total{pool=\"", p->name, "\"} ", p->taken, "\n");
}

// Each filler thread: picks a pool short of ready sandboxes and makes one,
// or removes one no pool wants (a pool shrunk or removed, memory short).
void WarmPools::Fill() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    size_t held = 0;
    for (auto& [key, p] : pools_) held += p->ready.size() + static_cast<size_t>(p->filling);
    Verdict verdict;
    lock.unlock();
    {
      std::lock_guard admit_lock(admit_mu_);
      if (admit_) verdict = admit_(held);
    }
    lock.lock();
    if (stopping_) break;
    // The pools as the policy sees them (warm_policy.h), in pools_'s order.
    std::vector<std::shared_ptr<Pool>> pools;
    std::vector<warm::PoolView> views;
    auto look = [&] {
      pools.clear();
      views.clear();
      for (auto& [key, p] : pools_) {
        pools.push_back(p);
        views.push_back({.size = p->size, .ready = static_cast<int>(p->ready.size()), .filling = p->filling, .retry_at = p->retry_at});
      }
    };
    look();
    // Surplus first: a shrunk pool's, or any under memory pressure.
    if (const int i = warm::Surplus(views, verdict.shed); i >= 0) {
      std::shared_ptr<Pool> from = pools[i];
      std::shared_ptr<Sandbox> surplus = std::move(from->ready.back());
      from->ready.pop_back();
      if (verdict.shed) ++from->shed;
      ++from->removing;
      lock.unlock();
      const std::string id = surplus->id();
      Status s = surplus->Destroy();
      if (!s.ok()) STRATA_LOG(kWarn) << "warm pool " << from->name << ": remove " << id << ": " << s.ToString();
      registry_.Forget(id).IgnoreError();
      surplus.reset();
      lock.lock();
      --from->removing;
      continue;
    }
    std::erase_if(pools_, [](const auto& kv) {
      return kv.second->size == 0 && kv.second->ready.empty() && kv.second->filling == 0 && kv.second->removing == 0;
    });
    look();
    const auto now = std::chrono::steady_clock::now();
    const int fill = warm::ToFill(views, verdict.status.ok(), now);
    // A burst of takes comes first (or the pool has run dry).
    if (fill >= 0 && warm::WaitForQuiet(views[fill], now, last_take_)) {
      cv_.wait_for(lock, warm::kRefillQuiet);
      continue;
    }
    if (fill < 0) {
      // (Woken by a take, a new size or the admission; else a look every
      // half second: memory comes and goes.)
      cv_.wait_for(lock, std::chrono::milliseconds(500));
      continue;
    }
    std::shared_ptr<Pool> pool = pools[fill];
    ++pool->filling;
    SandboxSpec spec = pool->spec;
    lock.unlock();
    spec.id = NewSandboxId(node_.name);
    Status s = registry_.Record(spec.id, {{"status", "creating"}, {"kind", "warm"}, {"pool", pool->name}});
    std::shared_ptr<Sandbox> made;
    if (s.ok()) {
      auto sb = Sandbox::Create(spec, node_);
      if (sb.ok()) {
        made = std::move(*sb);
        if (made->kind().warm_up && !WarmUpGuest(*made)) {
          s = Error(EHOSTDOWN, StrCat("sandbox ", spec.id, ": it stopped answering its warm-up command"));
        } else {
          s = registry_.Record(spec.id, {{"status", "running"}, {"kind", "warm"}, {"pool", pool->name}});
        }
        if (!s.ok()) {
          made->Destroy().IgnoreError();
          made.reset();
        }
      } else {
        s = sb.status();
      }
      if (!made) registry_.Forget(spec.id).IgnoreError();
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
bool WarmPools::WarmUpGuest(Sandbox& sb) {
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return sb.Alive();
  UniqueFd hangup(p[0]);
  {
    std::lock_guard lock(mu_);
    if (stopping_) {
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
    std::lock_guard lock(mu_);
    if (auto it = std::find(warm_up_cancels_.begin(), warm_up_cancels_.end(), p[1]); it != warm_up_cancels_.end()) {
      warm_up_cancels_.erase(it);
      ::close(p[1]);
    }
    if (stopping_) return false;
  }
  if (!r.ok()) STRATA_LOG(kWarn) << "warm pool: warm-up command in " << sb.id() << ": " << r.status().ToString();
  return r.ok() || sb.Alive();
}

}  // namespace strata::launcher
