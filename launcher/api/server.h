// The launcher daemon's API: HTTP/JSON on the node's unix socket and, when
// asked, on TCP with TLS and tenant tokens (docs/api.md). Requests become
// SandboxManager calls; this layer owns who may call (the operator, or a
// tenant by its token), what each tenant may ask for, node admission,
// idempotent retries and the wire formats (JSON, frames, NDJSON).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "launcher/api/admission.h"
#include "launcher/front/front.h"
#include "launcher/front/http_server.h"
#include "launcher/node/manager.h"
#include "launcher/front/tenants.h"

namespace strata::launcher {

struct ServeOptions {
  std::string socket_path = kDefaultLauncherSocket;
  std::string state_dir = kDefaultLauncherState;
  // Besides root: members of this group may call on the unix socket (it
  // becomes root:<group> 0660). They are the operator, like root.
  std::string allow_group;
  // Tenants and their tokens (`--tokens`); or the single token of the old
  // `--token-file`, read as the tenant "default".
  std::string tokens_file;
  std::string legacy_token_file;
  // TCP listeners, HOST:PORT; with TLS when both files are given.
  std::vector<std::string> listen;
  std::string tls_cert_file, tls_key_file;
  // Allows a TCP listener without tokens (every TCP caller is then the
  // operator) or without TLS on a non-loopback address.
  bool insecure = false;
  // The stores sandboxes may use; the first is the default. Empty: the
  // daemon's $STRATA_STORE or the local store, and tenants may name none.
  std::vector<std::string> stores;
  // Node admission: creations are refused (503, Retry-After) with this
  // many sandboxes, or while MemAvailable is below the reserve. 0: off.
  int64_t max_sandboxes = 0;
  uint64_t memory_reserve = 0;
  // The memory the node gives sandboxes: creations whose memory limits
  // (each with the agent's reserve) would pass it are refused, and the
  // sandboxes' parent cgroup is capped at it. 0: off.
  uint64_t memory_capacity = 0;
  // Creations are refused while the uppers filesystem has less free space.
  uint64_t disk_reserve = 0;
  // Caps of every TCP listener (the unix socket keeps only the size caps).
  HttpServer::Limits tcp_limits;
};

class LauncherServer {
 public:
  // Checks the options (a TCP listener without tokens or, off loopback,
  // without TLS is refused unless `insecure`), loads the tokens, and
  // listens. Warnings about insecure listeners go to `warnings`.
  static Result<std::unique_ptr<LauncherServer>> Start(const ServeOptions& options, SandboxManager& manager,
                                                       std::vector<std::string>* warnings = nullptr);
  ~LauncherServer();

  // Rereads the tokens file (SIGHUP). On error the tenants stay as they were.
  Status ReloadTokens();
  // Where it listens: "unix:///run/strata/launcher.sock", "https://127.0.0.1:8443".
  std::vector<std::string> urls() const;
  // GET /v1/health's answer: admission headroom, and cluster registration.
  nlohmann::json Health();
  // Health() without the registration (what a registrar reports).
  nlohmann::json NodeHealth();
  // Admitted creations still under way.
  int64_t Creating();
  // The first TCP listener's URL; empty without one.
  std::string TcpUrl() const;
  const ServeOptions& options() const { return options_; }
  SandboxManager& manager() { return manager_; }
  // What Health() shows under "cluster" (the node's registration); null:
  // nothing. Set and reset by whoever registers the node.
  void SetClusterStatus(std::function<nlohmann::json()> status);

  // Another API served on the same listeners (the E2B plane,
  // launcher/e2b/): the requests it claims are its, not /v1's. Set once,
  // before the first request it should see; null: none.
  struct Plane {
    std::function<bool(const HttpServer::Request&)> claims;
    HttpServer::Handler handle;
    HttpServer::UploadHandler upload;  // optional
  };
  void SetPlane(std::shared_ptr<const Plane> plane);
  // What a plane builds on: who calls, by /v1's rules; a /v1 call made
  // in-process for `caller` (the same admission, limits and answers); and
  // whether `caller` may see sandbox `id` (another tenant's is ENOENT).
  Result<Caller> Authenticate(const HttpServer::Request& request) { return auth_.Authenticate(request); }
  HttpServer::Response Call(const HttpServer::Request& request, const Caller& caller) { return Route(request, caller); }
  Status CheckOwner(const std::string& id, const Caller& caller);

 private:
  LauncherServer(const ServeOptions& options, SandboxManager& manager, AuthPolicy policy)
      : options_(options), manager_(manager), auth_(std::move(policy)) {}
  HttpServer::Response Handle(const HttpServer::Request& request);
  HttpServer::Response Route(const HttpServer::Request& request, const Caller& caller);
  std::unique_ptr<HttpServer::Upload> StartUpload(const HttpServer::Request& request,
                                                  std::optional<HttpServer::Response>* refusal);

  HttpServer::Response Create(const HttpServer::Request& request, const nlohmann::json& body, const Caller& caller);
  HttpServer::Response Exec(const HttpServer::Request& request, const std::string& id, const nlohmann::json& body,
                            const Caller& caller);
  HttpServer::Response Detach(const HttpServer::Request& request, const std::string& id, const nlohmann::json& body,
                              ExecRequest exec, const Caller& caller);
  HttpServer::Response Execs(const HttpServer::Request& request, const std::string& id, const std::string& verb,
                             const nlohmann::json& body);
  HttpServer::Response Destroy(const HttpServer::Request& request, const std::string& id, const Caller& caller);
  HttpServer::Response Snapshot(const HttpServer::Request& request, const std::string& id, const nlohmann::json& body,
                                const Caller& caller);

  // Node and tenant admission for one creation: reserves a slot, or says
  // why not (EAGAIN: the node; EDQUOT: the tenant's limits).
  struct Headroom {
    uint64_t disk_available = 0;
    bool inodes_known = false;
    uint64_t inodes_available = 0;
    uint64_t pids_available = UINT64_MAX;
  };
  Headroom NodeHeadroom() const;
  // The node's limits, and its load for AdmitOnNode (admission.h).
  NodeLimits Limits() const;
  NodeLoad Load(const Headroom& room, uint64_t memory_available, uint64_t committed);
  uint64_t SandboxMemoryAvailable() const;
  // `memory`: what the create commits of --memory-capacity.
  Status Admit(const Caller& caller, uint64_t memory = 0);
  void Admitted(const Caller& caller, uint64_t memory = 0);  // the reserved slot is taken or given back

  ServeOptions options_;
  SandboxManager& manager_;
  Authenticator auth_;
  std::mutex admission_mu_;
  int64_t creating_ = 0;  // admitted creations under way
  uint64_t creating_memory_ = 0;  // and what they commit
  std::map<std::string, int64_t> creating_by_tenant_;
  std::mutex cluster_mu_;
  std::function<nlohmann::json()> cluster_status_;
  std::mutex plane_mu_;
  std::shared_ptr<const Plane> plane_;
  std::shared_ptr<const Plane> plane();
  std::unique_ptr<HttpServer> unix_;
  std::vector<std::unique_ptr<HttpServer>> tcp_;
};

}  // namespace strata::launcher
