// The CLI's (and SDKs' model) side of the launcher daemon's API.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "launcher/agent_client.h"

namespace strata::cache {
class HttpClient;
}

namespace strata::launcher {

class LauncherClient {
 public:
  explicit LauncherClient(std::string socket_path, std::string token = "");
  ~LauncherClient();

  // Whether a daemon answers on the socket.
  bool Alive();
  Result<nlohmann::json> Create(const nlohmann::json& spec);
  // Streams output to `sink` as it comes; returns how the command ended.
  Result<ExecResult> Exec(const std::string& id, const nlohmann::json& request, const OutputSink& sink);
  Status Put(const std::string& id, const std::string& path, std::string_view data, uint32_t mode);
  Result<std::string> Get(const std::string& id, const std::string& path);
  Status Pause(const std::string& id);
  Status Resume(const std::string& id);
  Result<nlohmann::json> Snapshot(const std::string& id, const std::string& tag);
  Status Destroy(const std::string& id);
  Result<nlohmann::json> List();
  Result<nlohmann::json> Info(const std::string& id);
  Result<std::string> Metrics();

 private:
  Result<std::string> Call(const std::string& method, const std::string& path, std::string_view body,
                           const std::function<bool(std::string_view)>& sink = nullptr);
  std::string socket_path_, token_;
  std::unique_ptr<cache::HttpClient> http_;
};

}  // namespace strata::launcher
