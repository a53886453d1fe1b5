// Cordons are keys of their own (kCordonPrefix), not part of a node's
// record: the node rewrites its record every second and must not undo an
// operator's cordon.
#include "launcher/cluster/admin.h"

#include <chrono>
#include <thread>

#include "common/strings.h"
#include "launcher/cluster/etcd.h"
#include "launcher/cluster/membership.h"

namespace strata::launcher {

using nlohmann::json;

Status Cordon(const std::string& endpoints, const std::string& node, const std::string& by) {
  STRATA_ASSIGN_OR_RETURN(auto etcd, EtcdClient::Create(endpoints));
  STRATA_ASSIGN_OR_RETURN(auto known, etcd->Get(kNodesPrefix + node));
  if (!known) return Error(ENOENT, "cordon: no node " + Quote(node) + " ever registered in this cluster");
  json record = {{"by", by}, {"at", static_cast<int64_t>(::time(nullptr))}};
  return etcd->Put(kCordonPrefix + node, record.dump()).Annotate("cordon " + node);
}

Status Uncordon(const std::string& endpoints, const std::string& node) {
  STRATA_ASSIGN_OR_RETURN(auto etcd, EtcdClient::Create(endpoints));
  return etcd->Delete(kCordonPrefix + node).Annotate("uncordon " + node);
}

Status Drain(const std::string& endpoints, const std::string& node, Duration timeout,
             const std::function<void(int64_t)>& progress) {
  STRATA_RETURN_IF_ERROR(Cordon(endpoints, node, "drain"));
  STRATA_ASSIGN_OR_RETURN(auto etcd, EtcdClient::Create(endpoints));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  // Only a report the node wrote after the cordon counts (an older one may
  // not show sandboxes made just before it): etcd's revisions order them,
  // whatever the two hosts' clocks say.
  STRATA_ASSIGN_OR_RETURN(auto cordon, etcd->Get(kCordonPrefix + node));
  const int64_t cordon_revision = cordon ? cordon->mod_revision : 0;
  int64_t last = -1;
  while (true) {
    auto live = etcd->Get(kLivePrefix + node);
    int64_t count = -1;
    if (live.ok() && *live) {
      auto record = NodeRecord::FromJson(json::parse((*live)->value, nullptr, false));
      if (record.ok() && (*live)->mod_revision > cordon_revision) count = record->sandboxes;
    } else if (live.ok()) {
      return Error(EHOSTDOWN, "drain " + node + ": the node is not live (lost or stopped); its sandboxes cannot be counted");
    }
    if (count == 0) return OkStatus();
    if (count != last && count > 0 && progress) progress(count);
    last = count;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Error(ETIMEDOUT, StrCat("drain ", node, ": ", count, " sandboxes still there at the deadline (the node stays cordoned)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

Result<json> ListNodes(const std::string& endpoints) {
  STRATA_ASSIGN_OR_RETURN(auto etcd, EtcdClient::Create(endpoints));
  STRATA_ASSIGN_OR_RETURN(auto kvs, etcd->Prefix(kClusterPrefix));
  std::map<std::string, json> nodes;
  for (const auto& kv : kvs) {
    json value = json::parse(kv.value, nullptr, false);
    if (kv.key.starts_with(kNodesPrefix)) {
      auto& n = nodes[kv.key.substr(std::strlen(kNodesPrefix))];
      if (!n.contains("live")) {
        n = value;
        n["live"] = false;
        n["cordoned"] = false;
      }
    }
  }
  for (const auto& kv : kvs) {
    json value = json::parse(kv.value, nullptr, false);
    if (kv.key.starts_with(kLivePrefix)) {
      auto& n = nodes[kv.key.substr(std::strlen(kLivePrefix))];
      const bool cordoned = n.value("cordoned", false);
      n = value;
      n["live"] = true;
      n["cordoned"] = cordoned;
    } else if (kv.key.starts_with(kCordonPrefix)) {
      nodes[kv.key.substr(std::strlen(kCordonPrefix))]["cordoned"] = true;
    }
  }
  json out = json::array();
  for (auto& [name, n] : nodes) {
    if (!n.contains("name")) n["name"] = name;
    out.push_back(n);
  }
  return out;
}

}  // namespace strata::launcher
