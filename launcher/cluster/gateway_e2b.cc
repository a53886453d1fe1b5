// E2B's API through the gateway (docs/e2b.md, "Through a gateway"). The
// control plane is the nodes': a create is placed by load like /v1's and
// passed on as E2B's call, a sandbox's calls go to the node its id names,
// lists are gathered from every live node and paged here. Envd calls are
// passed on as they are, with the sandbox's access token and the caller's
// user; the node checks the token, so the gateway never learns it.
#include <strings.h>

#include <algorithm>
#include <future>

#include "common/strings.h"
#include "common/units.h"
#include "launcher/api/wire.h"
#include "launcher/cluster/gateway.h"
#include "launcher/cluster/gateway_internal.h"
#include "launcher/e2b/connect.h"
#include "launcher/e2b/routes.h"

namespace strata::launcher {

using nlohmann::json;
using Request = HttpServer::Request;
using Response = HttpServer::Response;
using e2b::RestError;
using gw::FromNode;
using gw::NodeLost;

namespace {

// The most sandboxes one list page holds (as on a node).
constexpr size_t kMaxPage = 1000;

// The headers of an envd call its node needs: the Connect protocol's, the
// sandbox's access token, and the caller's user (Authorization: Basic).
constexpr const char* kEnvdHeaders[] = {"content-type",    "accept",           "connect-protocol-version",
                                        "connect-timeout-ms", "keepalive-ping-interval", "x-access-token",
                                        "authorization",   "content-encoding", "connect-content-encoding",
                                        "connect-accept-encoding"};

// A refusal the gateway makes itself (/v1's JSON) in E2B's form.
Response AsE2b(Response r) {
  json j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("error")) return r;
  Response e = RestError(r.status, j["error"].is_string() ? j["error"].get<std::string>() : j["error"].dump());
  e.headers = std::move(r.headers);
  return e;
}

bool HasDotSegment(const std::string& path) {
  for (const auto& part : Split(path, '/')) {
    if (part == "." || part == "..") return true;
  }
  return false;
}

}  // namespace

std::optional<Gateway::NodeState> Gateway::AnyLiveNode() {
  auto v = view();
  std::optional<NodeState> cordoned;  // (one that only takes no new sandboxes still answers)
  for (const auto& [name, state] : *v) {
    if (state.live && !state.cordoned) return state;
    if (state.live && !cordoned) cordoned = state;
  }
  return cordoned;
}

Response Gateway::E2b(const Request& req) {
  if (!e2b::IsControlPath(req.path)) return E2bEnvd(req);
  // The control plane's key is a strata token in X-API-KEY (or /v1's
  // Authorization).
  Request authed = req;
  if (auto key = req.headers.find("x-api-key"); key != req.headers.end() && !req.headers.count("authorization")) {
    authed.headers["authorization"] = "Bearer " + key->second;
  }
  return AsE2b(Answer(
      authed, [this](const Request& r) { return auth_.Authenticate(r); },
      [this](const Request& r, const Caller& caller) { return E2bControl(r, caller); }));
}

Response Gateway::E2bControl(const Request& req, const Caller& caller) {
  if (HasDotSegment(req.path)) return RestError(400, "path " + Quote(req.path) + " has a dot segment");
  const bool list_path = req.path == "/sandboxes" || req.path == "/v2/sandboxes";
  if (list_path && req.method == "POST") return E2bCreate(req, caller);
  if (list_path && req.method == "GET") return E2bList(req, caller);
  if (req.path == "/sandboxes/metrics" && req.method == "GET") return E2bMetrics(req, caller);
  std::optional<NodeState> node;
  if (req.path.starts_with("/sandboxes/") || req.path.starts_with("/v2/sandboxes/")) {
    const size_t skip = req.path.starts_with("/v2/") ? 14 : 11;
    const std::string rest = req.path.substr(skip);
    const std::string id = rest.substr(0, rest.find('/'));
    std::optional<Response> answer;
    auto found = NodeOf(id, &answer);
    if (!found.ok()) return found.status().code() == ENOENT ? RestError(404, "sandbox " + id + " not found") : *answer;
    node = *found;
  } else {
    // Templates (and E2B's build and snapshot calls, which a node refuses
    // as it explains): every node answers alike.
    if (req.path.starts_with("/v1/templates") && req.method != "GET") {
      return RestError(400, "templates are kept by each node: set them there (launcher template set NAME --layer TAG --socket ...)");
    }
    node = AnyLiveNode();
    if (!node) return RestError(503, "no live node in the cluster");
  }
  ++forwarded_;
  auto out = forwarder_->Forward(CallFor(req, caller, *node));
  if (!out.error.ok()) {
    if (out.error.code() == ECANCELED) return RestError(out.error);
    ++unreachable_;
    return NodeLost(node->record.name, "node unreachable: " + out.error.ToString());
  }
  return FromNode(node->record.name, std::move(out.response));
}

Response Gateway::E2bCreate(const Request& req, const Caller& caller) {
  json body = json::parse(req.body.empty() ? "{}" : req.body, nullptr, false);
  if (!body.is_object()) return RestError(400, "create: the body is not a JSON object");
  const json name = body.value("templateID", json("base"));
  if (!name.is_string() || name.get<std::string>().empty() || name.get<std::string>().find('/') != std::string::npos) {
    return RestError(400, "create: templateID must be a template's name");
  }
  // What the template asks for decides where it fits: a node says.
  auto node = AnyLiveNode();
  if (!node) return RestError(503, "create: no live node in the cluster");
  Request ask;
  ask.method = "GET";
  ask.path = "/v1/templates/" + name.get<std::string>();
  Forwarder::Call call = CallFor(ask, caller, *node);
  call.timeout = gw::kProbeTimeout;
  auto out = forwarder_->Forward(std::move(call));
  if (!out.error.ok()) return RestError(503, "create: ask node " + node->record.name + " for template " + Quote(name.get<std::string>()) +
                                                 ": " + out.error.ToString());
  if (out.response.status != 200) return FromNode(node->record.name, std::move(out.response));
  const json t = json::parse(out.response.body, nullptr, false);
  if (!t.is_object()) return RestError(502, "create: node " + node->record.name + " answered a template that is not JSON");
  PlacementRequest want;
  if (t.contains("backend") && t["backend"].is_string()) want.backend = t["backend"].get<std::string>();
  if (t.contains("memory") && t["memory"].is_number_unsigned()) want.memory = t["memory"].get<uint64_t>();
  return Place(req, caller, want);
}

Gateway::FanOutAnswers Gateway::FanOut(const Request& req, const Caller& caller) {
  auto v = view();
  std::vector<std::pair<std::string, std::future<Forwarder::Outcome>>> asks;
  FanOutAnswers out;
  for (const auto& [name, state] : *v) {
    if (!state.live) {
      out.missing.push_back(name);
      continue;
    }
    asks.emplace_back(name, std::async(std::launch::async, [this, state, &req, &caller] {
      Request ask;
      ask.method = "GET";
      ask.path = req.path;
      ask.query = req.query;
      Forwarder::Call call = CallFor(ask, caller, state);
      call.timeout = gw::kFanOutTimeout;
      return forwarder_->Forward(std::move(call));
    }));
  }
  for (auto& [name, ask] : asks) out.answers.emplace_back(name, ask.get());
  return out;
}

Response Gateway::E2bMetrics(const Request& req, const Caller& caller) {
  FanOutAnswers fan = FanOut(req, caller);
  json all = json::object();
  for (auto& [name, out] : fan.answers) {
    std::optional<std::string> body = out.error.ok() && out.response.status == 200 ? gw::WholeBody(out) : std::nullopt;
    json part = body ? json::parse(*body, nullptr, false) : json();
    if (!part.is_object() || !part.contains("sandboxes") || !part["sandboxes"].is_object()) {
      // (A node's refusal of the query is every node's: pass the first on.)
      if (out.error.ok() && out.response.status == 400) return FromNode(name, std::move(out.response));
      fan.missing.push_back(name);
      continue;
    }
    all.update(part["sandboxes"]);
  }
  Response r = api::Json({{"sandboxes", std::move(all)}});
  if (!fan.missing.empty()) r.headers.emplace_back("X-Strata-Missing-Nodes", Join(fan.missing, ","));
  return r;
}

Response Gateway::E2bList(const Request& req, const Caller& caller) {
  // (Filters, limit and nextToken go to every node: each answers its first page after the token.)
  FanOutAnswers fan = FanOut(req, caller);
  std::vector<std::string>& missing = fan.missing;
  size_t limit = kMaxPage;
  if (auto it = req.query.find("limit"); it != req.query.end() && !it->second.empty()) {
    limit = std::clamp<size_t>(std::strtoull(it->second.c_str(), nullptr, 10), 1, kMaxPage);
  }
  std::vector<json> rows;
  bool more = false;
  for (auto& [name, out] : fan.answers) {
    std::optional<std::string> body = out.error.ok() && out.response.status == 200 ? gw::WholeBody(out) : std::nullopt;
    json part = body ? json::parse(*body, nullptr, false) : json();
    if (!part.is_array()) {
      missing.push_back(name);
      continue;
    }
    for (const auto& [k, val] : out.response.headers) {
      if (strcasecmp(k.c_str(), "x-next-token") == 0 && !val.empty()) more = true;
    }
    for (auto& sb : part) rows.push_back(std::move(sb));
  }
  // Each node answered its first `limit` after the token, in id order: the
  // cluster's first `limit` are among them.
  std::sort(rows.begin(), rows.end(), [](const json& a, const json& b) { return a.value("sandboxID", "") < b.value("sandboxID", ""); });
  if (rows.size() > limit) {
    rows.resize(limit);
    more = true;
  }
  Response r = api::Json(rows);
  if (more && !rows.empty()) r.headers.emplace_back("X-Next-Token", rows.back().value("sandboxID", ""));
  if (!missing.empty()) r.headers.emplace_back("X-Strata-Missing-Nodes", Join(missing, ","));
  return r;
}

// --- envd ---------------------------------------------------------------------

Forwarder::Call Gateway::EnvdCallFor(const Request& req, const std::string& id, const NodeState& node) {
  Forwarder::Call call = CallFor(req, Caller{}, node);
  call.as_gateway = false;
  call.headers.clear();
  for (const char* name : kEnvdHeaders) {
    if (auto it = req.headers.find(name); it != req.headers.end()) call.headers.emplace_back(name, it->second);
  }
  call.headers.emplace_back("e2b-sandbox-id", id);  // (also for a call that named it by its Host)
  return call;
}

Response Gateway::E2bEnvd(const Request& req) {
  const bool rpc = req.path.starts_with("/process.") || req.path.starts_with("/filesystem.");
  auto refuse = [&](int status, e2b::Code code, const std::string& message) {
    return rpc ? e2b::ErrorFor(req, code, message) : RestError(status, message);
  };
  const std::string id = e2b::EnvdSandboxId(req);
  if (!e2b::IsSandboxId(id) || HasDotSegment(req.path)) return refuse(502, e2b::Code::kNotFound, "sandbox " + Quote(id) + " not found");
  std::optional<Response> answer;
  auto node = NodeOf(id, &answer);
  if (!node.ok()) {
    if (node.status().code() == ENOENT) return refuse(502, e2b::Code::kNotFound, "sandbox " + Quote(id) + " not found");
    return refuse(503, e2b::Code::kUnavailable, "sandbox " + id + ": its node is lost");
  }
  ++forwarded_;
  auto out = forwarder_->Forward(EnvdCallFor(req, id, *node));
  if (!out.error.ok()) {
    if (out.error.code() != ECANCELED) ++unreachable_;
    return refuse(503, e2b::Code::kUnavailable, "sandbox " + id + ": its node " + node->record.name + " did not answer: " + out.error.ToString());
  }
  return std::move(out.response);
}

std::unique_ptr<HttpServer::Upload> Gateway::E2bUpload(const Request& req, std::optional<Response>* refusal) {
  if (e2b::IsControlPath(req.path) || req.method != "POST" || req.path != "/files") return nullptr;
  const std::string id = e2b::EnvdSandboxId(req);
  std::optional<Response> answer;
  auto node = e2b::IsSandboxId(id) ? NodeOf(id, &answer) : Result<NodeState>(Error(ENOENT, "no sandbox"));
  if (!node.ok()) {
    *refusal = node.status().code() == ENOENT ? RestError(502, "sandbox " + Quote(id) + " not found")
                                              : RestError(503, "sandbox " + id + ": its node is lost");
    return nullptr;
  }
  ++forwarded_;
  return forwarder_->ForwardUpload(EnvdCallFor(req, id, *node));
}

}  // namespace strata::launcher
