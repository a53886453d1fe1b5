// The CLI's (and SDKs' model) side of the launcher daemon's API.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "launcher/sandbox/agent_client.h"

namespace strata::cache {
class HttpClient;
}

namespace strata::launcher {

struct HttpAnswer {
  long status = 0;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // names lowercased
};

// Where a daemon is and how to reach it: `url` is "unix:///path",
// "http(s)://HOST:PORT" or a bare socket path; `token` goes as
// "Authorization: Bearer"; `ca_file` is the PEM of the CA that signed an
// https daemon's certificate (empty: the system's).
struct DaemonAddress {
  std::string url = std::string("unix://") + "/run/strata/launcher.sock";
  std::string token;
  std::string ca_file;
};

class LauncherClient {
 public:
  explicit LauncherClient(DaemonAddress address);
  // A daemon on a unix socket.
  explicit LauncherClient(std::string socket_path, std::string token = "");
  ~LauncherClient();
  LauncherClient(LauncherClient&&) noexcept;
  LauncherClient& operator=(LauncherClient&&) noexcept;

  // Whether a daemon answers.
  bool Alive();
  Result<nlohmann::json> Create(const nlohmann::json& spec);
  // Streams output to `sink` as it comes; returns how the command ended.
  Result<ExecResult> Exec(const std::string& id, const nlohmann::json& request, const OutputSink& sink);
  Status Put(const std::string& id, const std::string& path, std::string_view data, uint32_t mode);
  Result<std::string> Get(const std::string& id, const std::string& path);
  Status Pause(const std::string& id);
  Result<nlohmann::json> Network(const std::string& id);
  Result<nlohmann::json> Usage(const std::string& id);
  Result<nlohmann::json> SetNetwork(const std::string& id, const nlohmann::json& policy);
  Status Resume(const std::string& id);
  Result<nlohmann::json> Snapshot(const std::string& id, const std::string& tag, bool include_denied = false);
  Status Destroy(const std::string& id);
  Result<nlohmann::json> List();
  Result<nlohmann::json> Info(const std::string& id);
  Result<std::string> Metrics();
  // Warm pools (the operator's): keeps `size` sandboxes of `spec` ready
  // (0 removes the pool); the pools and their counters.
  Result<nlohmann::json> SetWarmPool(const nlohmann::json& spec, int size);
  Result<nlohmann::json> WarmPools();
  // Templates (the E2B plane's named layer stacks, launcher/e2b/).
  Result<nlohmann::json> Templates();
  Result<nlohmann::json> SetTemplate(const std::string& name, const nlohmann::json& spec);
  Status RemoveTemplate(const std::string& name);

  // Any call, with extra headers ("Idempotency-Key: k"), every status
  // returned as it is (for tests, benchmarks and the SDK's model).
  Result<struct HttpAnswer> Raw(const std::string& method, const std::string& path, std::string_view body,
                                const std::vector<std::string>& headers = {},
                                const std::function<bool(std::string_view)>& sink = nullptr);

  const DaemonAddress& address() const { return address_; }

 private:
  Result<std::string> Call(const std::string& method, const std::string& path, std::string_view body,
                           const std::function<bool(std::string_view)>& sink = nullptr);
  DaemonAddress address_;
  std::string base_;         // "http://launcher" or the daemon's http(s) URL
  std::string socket_path_;  // for a unix daemon
  std::unique_ptr<cache::HttpClient> http_;
};

}  // namespace strata::launcher
