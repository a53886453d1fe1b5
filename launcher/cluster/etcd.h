// EtcdClient: the few etcd v3 calls a cluster needs (leases, put, range,
// delete), over etcd's JSON gateway (`/v3/...`) with libcurl, failing over
// between the members it is given. Consensus, leases and their expiry are
// etcd's; this is only their client. Thread-safe.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"

namespace strata::cache {
class HttpClient;
}

namespace strata::launcher {

class EtcdClient {
 public:
  // `endpoints`: "http://127.0.0.1:2379,http://127.0.0.1:22379" (https
  // with the system's CAs or `ca_file`). A call tries the member that last
  // answered, then each other one, each within `timeout`.
  static Result<std::unique_ptr<EtcdClient>> Create(const std::string& endpoints, Duration timeout = std::chrono::seconds(2),
                                                    const std::string& ca_file = "");
  ~EtcdClient();

  struct KeyValue {
    std::string key, value;
    int64_t mod_revision = 0;
    int64_t lease = 0;
  };

  // A lease of `ttl_seconds`; its keys go when it is not kept alive.
  Result<int64_t> Grant(int64_t ttl_seconds);
  // Renews the lease; ENOENT when it has expired (grant a new one).
  Status KeepAlive(int64_t lease);
  Status Revoke(int64_t lease);
  Status Put(const std::string& key, const std::string& value, int64_t lease = 0);
  Status Delete(const std::string& key);
  // Every key under `prefix`, in key order.
  Result<std::vector<KeyValue>> Prefix(const std::string& prefix);
  Result<std::optional<KeyValue>> Get(const std::string& key);

 private:
  EtcdClient() = default;
  // POSTs `body` to `path` on a member that answers; the answer's JSON.
  Result<std::string> Call(const std::string& path, const std::string& body);
  Result<std::vector<KeyValue>> Range(const std::string& key, const std::string& range_end);

  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<cache::HttpClient>> clients_;  // one per member
  std::atomic<size_t> current_{0};
};

}  // namespace strata::launcher
