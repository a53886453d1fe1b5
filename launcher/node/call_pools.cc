// CallPools: one warm, read-only sandbox per layer stack, limits and
// tenant, shared by the fncall sandboxes made with them.
#include "launcher/node/call_pools.h"

#include <algorithm>

#include "common/log.h"
#include "common/strings.h"
#include "launcher/sandbox/backend.h"

namespace strata::launcher {

namespace {

// How long an unused function-call pool stays warm.
constexpr auto kPoolGrace = std::chrono::seconds(30);

}  // namespace

std::string PoolKey(const SandboxSpec& spec, const std::string& owner) {
  return StrCat(owner, "|", spec.runtime, "|", Join(spec.layers, ","), "|", cache::DefaultStoreUrl(spec.store), "|", spec.limits.cpus, "|", spec.limits.memory,
                "|", spec.limits.pids, "|", spec.network.ToJson().dump());
}

Result<std::shared_ptr<CallPools::Pool>> CallPools::Join(const SandboxSpec& spec, const std::string& owner) {
  const std::string key = PoolKey(spec, owner);
  std::shared_ptr<Pool> pool;
  {
    std::lock_guard lock(mu_);
    if (auto it = pools_.find(key); it != pools_.end()) {
      pool = it->second;
      ++pool->users;
    }
  }
  if (pool && !pool->warm->Alive()) {
    // Its agent died (killed, out of memory): a new pool for this and later
    // sandboxes; the old one goes once its last user is destroyed.
    STRATA_LOG(kWarn) << "function-call pool " << pool->warm->id() << " does not answer; starting a new one";
    std::lock_guard lock(mu_);
    if (auto it = pools_.find(key); it != pools_.end() && it->second == pool) {
      pools_.erase(it);
      retired_.push_back(pool);
    }
    --pool->users;
    pool.reset();
  }
  if (pool) return pool;
  // A new warm sandbox for this stack (two first creations may race: the
  // loser's goes again).
  SandboxSpec warm_spec = spec;
  warm_spec.id = NewSandboxId(node_.name);
  warm_spec.env.clear();
  warm_spec.workdir.assign(1, '/');  // (not = "/": g++ 12 warns of a restrict overlap it imagines, PR 105329)
  STRATA_RETURN_IF_ERROR(registry_.Record(warm_spec.id, {{"status", "creating"}, {"kind", "pool"}, {"key", key}}));
  auto warm = Sandbox::Create(warm_spec, node_);
  if (!warm.ok()) {
    registry_.Forget(warm_spec.id).IgnoreError();
    return warm.status();
  }
  if (Status s = registry_.Record(warm_spec.id, {{"status", "running"}, {"kind", "pool"}, {"key", key}}); !s.ok()) {
    (*warm)->Destroy().IgnoreError();
    registry_.Forget(warm_spec.id).IgnoreError();
    return s;
  }
  std::unique_ptr<Sandbox> spare;
  {
    std::lock_guard lock(mu_);
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
    registry_.Forget(warm_spec.id).IgnoreError();
  }
  return pool;
}

void CallPools::Leave(Pool& pool) {
  std::lock_guard lock(mu_);
  if (--pool.users == 0) pool.idle_since = std::chrono::steady_clock::now();
}

void CallPools::Reap(bool all) {
  std::vector<std::shared_ptr<Pool>> idle;
  {
    std::lock_guard lock(mu_);
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
    registry_.Forget(id).IgnoreError();
  }
}

void CallPools::ReleaseAll() {
  std::lock_guard lock(mu_);
  for (auto& [key, pool] : pools_) pool->warm->Release();
  // (A retired pool's warm sandbox stopped answering: it goes with the object.)
}

void CallPools::Adopt(const std::string& key, std::shared_ptr<Sandbox> warm) {
  auto pool = std::make_shared<Pool>();
  pool->key = key;
  pool->warm = std::move(warm);
  pool->idle_since = std::chrono::steady_clock::now();
  std::lock_guard lock(mu_);
  pools_[key] = std::move(pool);
}

std::shared_ptr<CallPools::Pool> CallPools::Rejoin(const std::string& warm_id) {
  std::lock_guard lock(mu_);
  for (auto& [key, p] : pools_) {
    if (p->warm->id() == warm_id) {
      ++p->users;
      return p;
    }
  }
  return nullptr;
}

size_t CallPools::Count() {
  std::lock_guard lock(mu_);
  return pools_.size();
}

uint64_t CallPools::CommittedMemory() {
  uint64_t sum = 0;
  std::lock_guard lock(mu_);
  for (auto& [key, p] : pools_) sum += MemoryCommit(node_, p->warm->spec());
  return sum;
}

void CallPools::AddIds(std::set<std::string>& ids) {
  std::lock_guard lock(mu_);
  for (auto& [key, p] : pools_) ids.insert(p->warm->id());
}

}  // namespace strata::launcher
