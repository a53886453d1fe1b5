// Gateway: one API endpoint for a cluster of node daemons. It speaks the
// node API (docs/api.md), so the SDK and the CLI point at it unchanged;
// it authenticates the caller, places a create on a node by load
// (Placer), and sends every later call for a sandbox straight to the node
// its id names. Stateless: the cluster's view comes from etcd (polled), so
// any number of gateways run side by side, and a gateway keeps placing
// from the last view it had while etcd elects a leader. docs/cluster.md.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/front/http_server.h"
#include "launcher/front/front.h"
#include "launcher/front/tenants.h"
#include "launcher/cluster/etcd.h"
#include "launcher/cluster/forward.h"
#include "launcher/cluster/placement.h"

namespace strata::launcher {

struct GatewayOptions {
  std::string cluster;  // etcd endpoints, comma-separated
  std::string etcd_ca;
  // Where callers reach it: TCP HOST:PORT, with TLS when both files are given.
  std::vector<std::string> listen;
  std::string tls_cert_file, tls_key_file;
  std::string tokens_file;  // tenants (the nodes' tokens file); required unless `insecure`
  bool insecure = false;    // no tokens: every caller is the operator
  // The gateway's credential on the nodes (a `gateway=yes` line of their
  // tokens file) and the CAs of their certificates.
  std::string node_token_file;
  std::string node_ca_file;
  PlacementPolicy policy;
  Duration poll = std::chrono::milliseconds(500);
  // A create tries nodes (refusals, nodes that cannot be reached) for this long.
  Duration create_deadline = std::chrono::seconds(30);
  HttpServer::Limits limits;
};

class Gateway {
 public:
  // Reads the credential and tokens, loads the cluster's view once (a
  // gateway that cannot reach etcd at start refuses to start), listens.
  static Result<std::unique_ptr<Gateway>> Start(GatewayOptions options, std::vector<std::string>* warnings = nullptr);
  ~Gateway();

  std::vector<std::string> urls() const;
  Status ReloadTokens();

 private:
  // A node as the gateway last saw it.
  struct NodeState {
    NodeRecord record;  // its live record, or its registration when lost
    bool live = false;
    bool cordoned = false;
  };
  using View = std::map<std::string, NodeState>;

  explicit Gateway(GatewayOptions options);
  Status Refresh();  // one read of etcd into the view and the placer
  void Watch();
  std::shared_ptr<const View> view();

  HttpServer::Response Handle(const HttpServer::Request& request);
  HttpServer::Response Route(const HttpServer::Request& request, const Caller& caller);
  std::unique_ptr<HttpServer::Upload> StartUpload(const HttpServer::Request& request,
                                                  std::optional<HttpServer::Response>* refusal);
  HttpServer::Response Create(const HttpServer::Request& request, const Caller& caller);
  // A create placed by load and passed on, with an Idempotency-Key, until
  // a node takes it (/v1's and E2B's alike).
  HttpServer::Response Place(const HttpServer::Request& request, const Caller& caller, const PlacementRequest& want);
  HttpServer::Response List(const Caller& caller);
  HttpServer::Response Metrics();
  nlohmann::json Health();
  // The node that holds sandbox `id`, or the answer to give instead (404
  // for an id no node ever had, 503 "node lost" for a node whose lease
  // expired).
  Result<NodeState> NodeOf(const std::string& id, std::optional<HttpServer::Response>* answer);
  Forwarder::Call CallFor(const HttpServer::Request& request, const Caller& caller, const NodeState& node);
  // E2B's API through the gateway (gateway_e2b.cc): its control plane for
  // the caller of X-API-KEY, its envd calls passed on to the sandbox's
  // node as they are (that node checks the sandbox's access token).
  HttpServer::Response E2b(const HttpServer::Request& request);
  HttpServer::Response E2bControl(const HttpServer::Request& request, const Caller& caller);
  HttpServer::Response E2bCreate(const HttpServer::Request& request, const Caller& caller);
  HttpServer::Response E2bList(const HttpServer::Request& request, const Caller& caller);
  // GET /sandboxes/metrics: each node answers for the sandboxes it has.
  HttpServer::Response E2bMetrics(const HttpServer::Request& request, const Caller& caller);
  // The same GET (path and query) to every live node at once: each
  // node's JSON answer, and the nodes that are not live or did not answer.
  struct FanOutAnswers {
    std::vector<std::pair<std::string, Forwarder::Outcome>> answers;
    std::vector<std::string> missing;
  };
  FanOutAnswers FanOut(const HttpServer::Request& request, const Caller& caller);
  HttpServer::Response E2bEnvd(const HttpServer::Request& request);
  std::unique_ptr<HttpServer::Upload> E2bUpload(const HttpServer::Request& request,
                                                std::optional<HttpServer::Response>* refusal);
  Forwarder::Call EnvdCallFor(const HttpServer::Request& request, const std::string& id, const NodeState& node);
  // A live node, for calls every node answers alike (templates).
  std::optional<NodeState> AnyLiveNode();
  // The live node that knows this Idempotency-Key (a retried create), if
  // any; EAGAIN when a live node could not say.
  Result<std::optional<std::string>> NodeWithKey(const std::string& key, const Caller& caller);

  GatewayOptions options_;
  std::unique_ptr<EtcdClient> etcd_;
  std::unique_ptr<Forwarder> forwarder_;
  Placer placer_;
  Authenticator auth_;

  std::mutex view_mu_;
  std::shared_ptr<const View> view_;
  std::string etcd_error_;  // the last refresh's failure, "" when it worked
  std::chrono::steady_clock::time_point view_at_{};

  std::atomic<uint64_t> creates_{0}, placements_{0}, refusals_{0}, unreachable_{0}, forwarded_{0}, lost_answers_{0};

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread watcher_;
  std::vector<std::unique_ptr<HttpServer>> servers_;
};

}  // namespace strata::launcher
