// SandboxManager's function-call pools: one warm, read-only sandbox per
// layer stack and limits, shared by the fncall sandboxes made with them.
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

namespace strata::launcher {

using nlohmann::json;
using namespace manager;  // (manager_parts.h)

namespace {

// How long an unused function-call pool stays warm.
constexpr auto kPoolGrace = std::chrono::seconds(30);

}  // namespace

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
  entry->Settle(spec);
  entry->last_call_ms = NowMs();
  json record = {{"status", "running"}, {"backend", spec.backend}, {"pool", pool->warm->id()},
                 {"created", entry->created}, {"spec", CallSpecJson(spec)}, {"owner", owner}};
  record.update(Entry::RecordOf(spec));
  Status s = Record(entry->id, record);
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

}  // namespace strata::launcher
