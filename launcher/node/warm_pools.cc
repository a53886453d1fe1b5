// SandboxManager's warm pools: ready sandboxes of a stack kept for the
// creates that match, filled and shed by the policy of warm_policy.h.
#include <fcntl.h>
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
#include "launcher/node/warm_policy.h"
#include "launcher/sandbox/backend.h"

namespace strata::launcher {

using nlohmann::json;
using namespace manager;  // (manager_parts.h)

namespace {

constexpr int kWarmMaxSize = 4096;  // ready sandboxes one pool may ask for

}  // namespace

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
    json record = {{"status", "running"}, {"created", assignment["created"]}, {"owner", owner},
                   {"internal", sb->id()}, {"warm", pool->name}, {"assigned", std::move(assignment)}};
    record.update(Entry::RecordOf(spec));
    if (Status s = registry_->Rename(sb->id(), spec.id, record); !s.ok()) return give_back(s.Annotate("record sandbox " + spec.id));
  }
  timer.Step("record");
  auto entry = std::make_shared<Entry>();
  entry->id = spec.id;
  entry->warm_pool = pool->name;
  entry->memory_commit = MemoryCommit(node_, sb->spec());
  entry->owner = owner;
  entry->Settle(spec);
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

}  // namespace strata::launcher
