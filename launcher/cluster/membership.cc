// The node record's JSON and the registration loop.
#include "launcher/cluster/membership.h"

#include <chrono>

#include "common/log.h"
#include "common/strings.h"

namespace strata::launcher {

using nlohmann::json;

int64_t ReportClockMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

json NodeRecord::ToJson() const {
  return {{"name", name},
          {"url", url},
          {"labels", labels},
          {"backends", backends},
          {"accelerator", accelerator},
          {"capacity", {{"slots", slots}, {"cpus", cpus}, {"memory", memory}, {"disk", disk}}},
          {"load",
           {{"sandboxes", sandboxes},
            {"states", states},
            {"memory_available", memory_available},
            {"disk_available", disk_available},
            {"accepting", accepting},
            {"headroom", headroom.is_null() ? json::object() : headroom}}},
          {"at_ms", at_ms}};
}

Result<NodeRecord> NodeRecord::FromJson(const json& j) {
  NodeRecord r;
  try {
    r.name = j.at("name").get<std::string>();
    r.url = j.at("url").get<std::string>();
    r.labels = j.value("labels", std::map<std::string, std::string>{});
    r.backends = j.value("backends", std::vector<std::string>{});
    r.accelerator = j.value("accelerator", "");
    const json capacity = j.value("capacity", json::object());
    r.slots = capacity.value("slots", int64_t{0});
    r.cpus = capacity.value("cpus", int64_t{0});
    r.memory = capacity.value("memory", uint64_t{0});
    r.disk = capacity.value("disk", uint64_t{0});
    const json load = j.value("load", json::object());
    r.sandboxes = load.value("sandboxes", int64_t{0});
    r.states = load.value("states", std::map<std::string, int64_t>{});
    r.memory_available = load.value("memory_available", uint64_t{0});
    r.disk_available = load.value("disk_available", uint64_t{0});
    r.accepting = load.value("accepting", true);
    r.headroom = load.value("headroom", json::object());
    r.at_ms = j.value("at_ms", int64_t{0});
  } catch (const json::exception& e) {
    return Error(EPROTO, StrCat("node record: ", e.what()));
  }
  return r;
}

int64_t NodeRecord::EffectiveSlots() const {
  if (slots > 0) return slots;
  return std::max<int64_t>(1, static_cast<int64_t>(memory >> 28));
}

Result<std::unique_ptr<Registrar>> Registrar::Start(Options options, NodeRecord node, std::function<void(NodeRecord*)> report) {
  if (options.lease_seconds < 2 || options.lease_seconds > 10) {
    return Error(EINVAL, StrCat("cluster: the lease is 2 to 10 seconds, not ", options.lease_seconds));
  }
  std::unique_ptr<Registrar> r(new Registrar());
  STRATA_ASSIGN_OR_RETURN(r->etcd_, EtcdClient::Create(options.endpoints, std::chrono::seconds(2), options.ca_file));
  // Another live node under this name, elsewhere: two nodes would take
  // turns in one record and sandboxes would be routed to the wrong one.
  auto live = r->etcd_->Get(kLivePrefix + node.name);
  if (live.ok() && *live) {
    auto other = NodeRecord::FromJson(json::parse((*live)->value, nullptr, false));
    if (other.ok() && other->url != node.url) {
      return Error(EADDRINUSE, StrCat("cluster: node name ", Quote(node.name), " is registered by a live node at ", other->url,
                                      " (this one serves ", node.url, "); give each node its own --node"));
    }
  } else if (!live.ok()) {
    STRATA_LOG(kWarn) << "cluster: " << live.status().ToString() << "; registering when etcd answers";
  }
  r->options_ = std::move(options);
  r->node_ = std::move(node);
  r->report_ = std::move(report);
  r->thread_ = std::thread([p = r.get()] { p->Run(); });
  return r;
}

Registrar::~Registrar() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (lease_) etcd_->Revoke(lease_).IgnoreError();
}

strata::Status Registrar::RefreshOnce() {
  if (lease_) {
    strata::Status alive = etcd_->KeepAlive(lease_);
    if (alive.code() == ENOENT) {
      STRATA_LOG(kWarn) << "cluster: " << alive.ToString() << "; registering again";
      lease_ = 0;
    } else if (!alive.ok()) {
      return alive;
    }
  }
  if (!lease_) {
    STRATA_ASSIGN_OR_RETURN(int64_t lease, etcd_->Grant(options_.lease_seconds));
    NodeRecord registered = node_;  // (the lasting record: no load)
    STRATA_RETURN_IF_ERROR(etcd_->Put(kNodesPrefix + node_.name, registered.ToJson().dump()));
    lease_ = lease;
    STRATA_LOG(kInfo) << "cluster: registered node " << node_.name << " (" << node_.url << ") under lease " << lease;
  }
  NodeRecord now = node_;
  if (report_) report_(&now);
  now.at_ms = ReportClockMs();
  return etcd_->Put(kLivePrefix + node_.name, now.ToJson().dump(), lease_);
}

void Registrar::Run() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    lock.unlock();
    strata::Status s = RefreshOnce();
    lock.lock();
    if (s.ok()) {
      ++refreshes_;
      if (!last_error_.empty()) STRATA_LOG(kInfo) << "cluster: etcd answers again";
      last_error_.clear();
    } else {
      if (last_error_.empty()) STRATA_LOG(kWarn) << "cluster: refresh: " << s.ToString();
      last_error_ = s.ToString();
    }
    cv_.wait_for(lock, options_.period, [&] { return stopping_; });
  }
}

json Registrar::Status() {
  std::lock_guard lock(mu_);
  return {{"node", node_.name},
          {"registered", lease_ != 0 && last_error_.empty()},
          {"lease", std::to_string(lease_.load())},
          {"refreshes", refreshes_},
          {"last_error", last_error_}};
}

}  // namespace strata::launcher
