// Forwarder: a gateway passes a call on to the node that holds (or will
// hold) the sandbox and relays the node's answer as it comes, so an
// exec's output streams through and a file upload is passed on as it
// arrives, never held whole. The caller's token never reaches the node:
// the gateway's own credential does, with the caller's tenant named in
// X-Strata-Tenant (docs/api.md, "Gateways").
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "launcher/front/http_server.h"
#include "common/status.h"
#include "common/units.h"

namespace strata::cache {
class HttpClient;
}

namespace strata::launcher {

class Forwarder {
 public:
  struct Options {
    std::string credential;  // the gateway's token on the nodes
    std::string ca_file;     // CAs of the nodes' certificates (empty: the system's)
    Duration connect_timeout = std::chrono::seconds(1);
  };
  explicit Forwarder(Options options);
  ~Forwarder();

  struct Call {
    std::string node_url;  // "https://127.0.0.2:7443"
    std::string method;
    std::string target;    // path and query, encoded: "/v1/sandboxes/sb-a-12/files?path=%2Fx"
    std::string tenant;    // "" for the operator's call
    // With the gateway's credential and the caller's tenant; false for a
    // call the node authenticates by what it carries itself (an E2B envd
    // call: the sandbox's access token).
    bool as_gateway = true;
    std::vector<std::pair<std::string, std::string>> headers;  // the caller's to pass on (Accept, Idempotency-Key, ...)
    std::string body;
    // The caller's connection (a duplicate the call may keep): when it
    // hangs up, the node's call is cut too.
    std::shared_ptr<int> client_fd;
    // Until the node's answer is in (a stream's headers, a JSON answer
    // whole); 0: as long as the caller waits. ETIMEDOUT past it.
    Duration timeout{0};
  };
  struct Outcome {
    Status error;          // no (whole) answer from the node
    bool reached = false;  // with an error: the request may have reached the node
    HttpServer::Response response;
  };
  // The node's answer: JSON bodies whole, anything else (an exec's frames,
  // a file) as a stream that relays the node's.
  Outcome Forward(Call call);
  // A file upload passed on piece by piece (PUT .../files).
  std::unique_ptr<HttpServer::Upload> ForwardUpload(Call call);

 private:
  cache::HttpClient& ClientFor(const std::string& node_url);

  Options options_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<cache::HttpClient>> clients_;  // by node URL: its connections stay open
};

}  // namespace strata::launcher
