// E2B's sandbox API beside /v1, on the node daemon's own listeners
// (docs/e2b.md): the REST control plane (X-API-KEY: a strata token) made
// of /v1 calls for the same caller, so tenants, limits, admission and
// answers are /v1's; and envd's data plane (its HTTP API and the Connect
// services process.Process and filesystem.Filesystem), routed by the
// E2b-Sandbox-Id header (or a Host "49983-<id>.<domain>") and allowed by
// the sandbox's access token. Templates — named layer stacks with a back
// end and resources — are the node's, kept in its state directory.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/api/server.h"
#include "launcher/e2b/routes.h"

namespace strata::launcher::e2b {

struct Call;
class Watcher;

// What envd version the data plane answers as (the SDK gates features on it).
inline constexpr const char* kEnvdVersion = "0.6.4";
// A create without a timeout lives this long (E2B's default).
inline constexpr int64_t kDefaultTimeoutSeconds = 300;

struct Template {
  std::vector<std::string> layers;  // bottom first
  std::string backend;              // empty: the node's default
  uint64_t memory = 0;              // bytes; 0: none
  double cpus = 0;
  nlohmann::json ToJson(const std::string& name) const;
  static Result<Template> FromJson(const nlohmann::json& j);
};

class Plane {
 public:
  // Reads the templates and the access-token secret from `state_dir`
  // (making the secret on first use), and serves on `server`'s listeners.
  // The plane must outlive the server (its listeners call into it).
  static Result<std::unique_ptr<Plane>> Open(LauncherServer& server, const std::string& state_dir);
  ~Plane();

  // The access token of sandbox `id` (what envd calls must carry).
  std::string AccessToken(const std::string& id) const;

 private:
  Plane(LauncherServer& server) : server_(server) {}
  HttpServer::Response Handle(const HttpServer::Request& request);
  std::unique_ptr<HttpServer::Upload> StartUpload(const HttpServer::Request& request,
                                                  std::optional<HttpServer::Response>* refusal);

  // The control plane, for an authenticated caller.
  HttpServer::Response Control(const HttpServer::Request& request, const Caller& caller);
  HttpServer::Response Create(const HttpServer::Request& request, const nlohmann::json& body, const Caller& caller);
  HttpServer::Response Connect(const std::string& id, const nlohmann::json& body, const Caller& caller);
  HttpServer::Response List(const HttpServer::Request& request, const Caller& caller, bool v2);
  HttpServer::Response Templates(const HttpServer::Request& request, const Caller& caller);
  // E2B's SandboxMetric of sandbox `id` now (from /v1 usage); its CPU
  // share is over the time since the last metric of it asked here (or
  // since it was created).
  Result<nlohmann::json> Metric(const std::string& id, const Caller& caller);
  // GET /sandboxes/metrics?sandbox_ids=A,B: the caller's sandboxes of those.
  HttpServer::Response Metrics(const HttpServer::Request& request, const Caller& caller);
  // A /v1 call for `caller`: its answer's JSON, or the error it answered.
  Result<nlohmann::json> V1(const std::string& method, const std::string& path, const nlohmann::json& body,
                            const Caller& caller, int* status = nullptr, const std::string& idempotency_key = "");
  // E2B's description of a sandbox from /v1's (Sandbox, or with `detail`
  // SandboxDetail / ListedSandbox).
  nlohmann::json Describe(const nlohmann::json& info, bool detail) const;

  // The data plane: the sandbox a call names, if its token allows it.
  Result<std::string> EnvdSandbox(const HttpServer::Request& request) const;
  HttpServer::Response Envd(const HttpServer::Request& request);
  HttpServer::Response Rpc(const HttpServer::Request& request, const std::string& id);
  HttpServer::Response GetFile(const HttpServer::Request& request, const std::string& id);
  // WatchDir, and the polled watchers' calls (watch.cc).
  HttpServer::Response Watch(const HttpServer::Request& request, const Call& call, const std::string& id);

  std::optional<Template> FindTemplate(const std::string& name);
  Status SaveTemplates();

  LauncherServer& server_;
  std::string templates_file_;
  std::string secret_;
  std::mutex mu_;
  std::map<std::string, Template> templates_;
  struct CpuSample {
    double time = 0;     // unix seconds
    double seconds = 0;  // CPU time used by then
  };
  std::map<std::string, CpuSample> cpu_seen_;  // (under mu_) the last metric's, by sandbox
  size_t cpu_sweep_at_ = 4096;                 // (under mu_) cpu_seen_'s size that sweeps it next
  std::mutex watchers_mu_;
  std::map<std::string, std::shared_ptr<Watcher>> watchers_;  // polled watchers, by id
};

}  // namespace strata::launcher::e2b
