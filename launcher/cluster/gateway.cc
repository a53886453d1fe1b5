// The gateway's routes: creates placed by load, sandbox calls by their
// id's node, lists and metrics gathered from every live node.
#include "launcher/cluster/gateway.h"
#include "launcher/cluster/gateway_internal.h"

#include <fcntl.h>
#include <strings.h>
#include <unistd.h>

#include <future>
#include <random>
#include <set>
#include <sstream>

#include "cache/http_client.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/units.h"
#include "launcher/api/wire.h"
#include "launcher/e2b/routes.h"
#include "launcher/front/front.h"
#include "launcher/front/tenants.h"
#include "launcher/sandbox/ids.h"
#include "launcher/sandbox/spec.h"

namespace strata::launcher {

using nlohmann::json;
using Request = HttpServer::Request;
using Response = HttpServer::Response;

namespace gw {

Response NodeLost(const std::string& node, const std::string& why) {
  Response r = api::Json({{"error", why}, {"node", node}, {"errno", EHOSTDOWN}}, 503);
  r.headers.emplace_back("Retry-After", "1");
  return r;
}

std::string Target(const Request& req) {
  std::string target = cache::EncodeUrlPath(req.path);
  char sep = '?';
  for (const auto& [k, v] : req.query) {
    target += StrCat(sep, cache::EncodeUrlComponent(k), "=", cache::EncodeUrlComponent(v));
    sep = '&';
  }
  return target;
}

Response FromNode(const std::string& node, Response r) {
  if (r.status == 401) {
    return api::Json({{"error", "node " + node + " refused this gateway's credential (its --node-token is not a gateway=yes line of the node's tokens file)"},
                      {"node", node}, {"errno", EACCES}},
                     502);
  }
  return r;
}

std::optional<std::string> WholeBody(Forwarder::Outcome& out) {
  std::string body = std::move(out.response.body);
  if (out.response.stream) {
    try {
      out.response.stream([&](std::string_view piece) {
        body.append(piece);
        return true;
      });
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return body;
}

}  // namespace gw

namespace {

using namespace gw;

using api::Json;

Response Fail(const Status& s) { return HttpServer::ErrorResponse(s); }

std::string RandomKey() {
  static std::mutex mu;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lock(mu);
  return StrCat("gw-", std::to_string(rng()), "-", std::to_string(rng()));
}

// Prometheus text: every series of a node's, with node="NAME" added.
void AddNodeLabel(const std::string& text, const std::string& node, std::set<std::string>* seen_comments, std::string* out) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      if (seen_comments->insert(line).second) *out += line + "\n";
      continue;
    }
    const size_t brace = line.find('{');
    const size_t space = line.find(' ');
    if (brace != std::string::npos && brace < space) {
      *out += StrCat(line.substr(0, brace + 1), "node=\"", node, "\",", line.substr(brace + 1), "\n");
    } else if (space != std::string::npos) {
      *out += StrCat(line.substr(0, space), "{node=\"", node, "\"}", line.substr(space), "\n");
    }
  }
}

}  // namespace

Gateway::Gateway(GatewayOptions options)
    : options_(std::move(options)),
      placer_(options_.policy),
      // Without tokens (only with --insecure) every caller is the operator.
      auth_(AuthPolicy{.who = "gateway", .open_without_tokens = true}) {}

Result<std::unique_ptr<Gateway>> Gateway::Start(GatewayOptions options, std::vector<std::string>* warnings) {
  if (options.listen.empty()) return Error(EINVAL, "gateway: --listen HOST:PORT is required");
  if (options.node_token_file.empty()) return Error(EINVAL, "gateway: --node-token FILE (its credential on the nodes) is required");
  std::unique_ptr<Gateway> g(new Gateway(std::move(options)));
  const GatewayOptions& o = g->options_;
  STRATA_ASSIGN_OR_RETURN(std::string credential, ReadFileToString(o.node_token_file));
  credential = credential.substr(0, credential.find('\n'));
  if (credential.empty()) return Error(EINVAL, "gateway: --node-token " + o.node_token_file + " is empty");
  g->forwarder_ = std::make_unique<Forwarder>(Forwarder::Options{.credential = credential, .ca_file = o.node_ca_file});
  STRATA_RETURN_IF_ERROR(g->auth_.Load(o.tokens_file));
  if (!g->auth_.has_tenants() && !o.insecure) {
    return Error(EINVAL, "gateway: --tokens FILE is required (or --insecure for tests: every caller is then the operator)");
  } else if (!g->auth_.has_tenants() && warnings) {
    warnings->push_back("the gateway has no tokens: every caller is the operator (--insecure)");
  }
  const bool tls = !o.tls_cert_file.empty() || !o.tls_key_file.empty();
  if (tls && (o.tls_cert_file.empty() || o.tls_key_file.empty())) return Error(EINVAL, "gateway: TLS needs both --tls-cert and --tls-key");
  std::string cert, key;
  if (tls) {
    STRATA_ASSIGN_OR_RETURN(cert, ReadFileToString(o.tls_cert_file));
    STRATA_ASSIGN_OR_RETURN(key, ReadFileToString(o.tls_key_file));
  }
  for (const auto& address : o.listen) {
    STRATA_ASSIGN_OR_RETURN(auto hp, ParseHostPort(address));
    if (!tls && !IsLoopbackHost(hp.first)) {
      if (!o.insecure) return Error(EINVAL, "gateway: --listen " + address + " is off loopback without TLS: give --tls-cert and --tls-key");
      if (warnings) warnings->push_back("--listen " + address + " is plain TCP off loopback (--insecure)");
    }
  }
  STRATA_ASSIGN_OR_RETURN(g->etcd_, EtcdClient::Create(o.cluster, std::chrono::seconds(1), o.etcd_ca));
  if (Status s = g->Refresh(); !s.ok()) return s.Annotate("gateway: read the cluster from etcd");
  Gateway* self = g.get();
  for (const auto& address : o.listen) {
    STRATA_ASSIGN_OR_RETURN(auto server, HttpServer::Listen({.tcp_address = address, .tls_cert_pem = cert, .tls_key_pem = key,
                                                             .limits = o.limits,
                                                             .handler = [self](const Request& r) { return self->Handle(r); },
                                                             .upload = [self](const Request& r, std::optional<Response>* refusal) {
                                                               return self->StartUpload(r, refusal);
                                                             }}));
    g->servers_.push_back(std::move(server));
  }
  g->watcher_ = std::thread([self] { self->Watch(); });
  return g;
}

Gateway::~Gateway() {
  servers_.clear();  // no handler runs past this
  {
    std::lock_guard lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (watcher_.joinable()) watcher_.join();
}

std::vector<std::string> Gateway::urls() const {
  std::vector<std::string> out;
  for (const auto& s : servers_) out.push_back(s->url());
  return out;
}

Status Gateway::ReloadTokens() { return auth_.Reload(); }

// --- the cluster's view -------------------------------------------------------

Status Gateway::Refresh() {
  auto kvs = etcd_->Prefix(kClusterPrefix);
  if (!kvs.ok()) {
    std::lock_guard lock(view_mu_);
    if (etcd_error_.empty()) STRATA_LOG(kWarn) << "gateway: " << kvs.status().ToString() << " (placing from the last view)";
    etcd_error_ = kvs.status().ToString();
    return kvs.status();
  }
  auto view = std::make_shared<View>();
  std::vector<NodeRecord> live;
  std::set<std::string> cordoned;
  for (const auto& kv : *kvs) {
    auto under = [&](const char* prefix) { return kv.key.starts_with(prefix) ? kv.key.substr(std::strlen(prefix)) : std::string(); };
    if (std::string name = under(kCordonPrefix); !name.empty()) {
      cordoned.insert(name);
      continue;
    }
    const bool is_live = kv.key.starts_with(kLivePrefix);
    std::string name = is_live ? under(kLivePrefix) : under(kNodesPrefix);
    if (name.empty()) continue;
    auto record = NodeRecord::FromJson(json::parse(kv.value, nullptr, false));
    if (!record.ok()) {
      STRATA_LOG(kWarn) << "gateway: " << kv.key << ": " << record.status().ToString();
      continue;
    }
    // The gateway's credential goes to this URL: a record that would send
    // it in the clear (or anywhere but https) is not followed.
    if (!options_.insecure && !record->url.starts_with("https://")) {
      if (is_live) STRATA_LOG(kWarn) << "gateway: node " << name << " registered " << record->url << ", not https: left out (--insecure allows it)";
      continue;
    }
    NodeState& state = (*view)[name];
    if (is_live) {
      state.record = *record;
      state.live = true;
      live.push_back(std::move(*record));
    } else if (!state.live) {
      state.record = std::move(*record);
    }
  }
  for (auto& [name, state] : *view) state.cordoned = cordoned.count(name) > 0;
  placer_.Update(live, cordoned);
  std::lock_guard lock(view_mu_);
  // A node that left etcd's records altogether stays known as lost.
  if (view_) {
    for (const auto& [name, old] : *view_) {
      if (!view->count(name)) (*view)[name] = NodeState{old.record, false, old.cordoned};
    }
  }
  if (!etcd_error_.empty()) STRATA_LOG(kInfo) << "gateway: etcd answers again";
  etcd_error_.clear();
  view_ = std::move(view);
  view_at_ = std::chrono::steady_clock::now();
  return OkStatus();
}

void Gateway::Watch() {
  std::unique_lock lock(stop_mu_);
  while (!stop_cv_.wait_for(lock, options_.poll, [&] { return stopping_; })) {
    lock.unlock();
    Refresh().IgnoreError();  // (logged; the last view stays)
    lock.lock();
  }
}

std::shared_ptr<const Gateway::View> Gateway::view() {
  std::lock_guard lock(view_mu_);
  return view_;
}

// --- requests -----------------------------------------------------------------

Response Gateway::Handle(const Request& req) {
  // Health answers without a token: load balancers and readiness probes
  // have none, and it says nothing a tenant's sandboxes would.
  if (req.method == "GET" && req.path == "/v1/health") return Json(Health());
  if (e2b::Claims(req)) return E2b(req);  // (gateway_e2b.cc)
  return Answer(
      req, [this](const Request& r) { return auth_.Authenticate(r); },
      [this](const Request& r, const Caller& caller) { return Route(r, caller); });
}

Forwarder::Call Gateway::CallFor(const Request& req, const Caller& caller, const NodeState& node) {
  Forwarder::Call call;
  call.node_url = node.record.url;
  call.method = req.method;
  call.target = Target(req);
  call.tenant = caller.scope();
  for (const char* name : {"accept", "content-type", "idempotency-key"}) {
    if (auto it = req.headers.find(name); it != req.headers.end()) call.headers.emplace_back(name, it->second);
  }
  call.body = req.body;
  if (req.connection_fd >= 0) {
    int fd = ::fcntl(req.connection_fd, F_DUPFD_CLOEXEC, 0);
    call.client_fd = std::shared_ptr<int>(new int(fd), [](int* p) {
      if (*p >= 0) ::close(*p);
      delete p;
    });
  }
  return call;
}

Result<Gateway::NodeState> Gateway::NodeOf(const std::string& id, std::optional<Response>* answer) {
  const std::string name = SandboxIdNode(id);
  auto v = view();
  auto it = name.empty() || !v ? View::const_iterator() : v->find(name);
  if (name.empty() || !v || it == v->end()) {
    *answer = Fail(Error(ENOENT, StrCat("sandbox ", Quote(id), ": no such sandbox (no node of this cluster made it)")));
    return Error(ENOENT, "no node");
  }
  if (!it->second.live) {
    ++lost_answers_;
    *answer = NodeLost(name, "node lost");
    return Error(EHOSTDOWN, "node lost");
  }
  return it->second;
}

Response Gateway::Route(const Request& req, const Caller& caller) {
  if (req.method == "GET" && req.path == "/metrics") return Metrics();
  if (req.method == "GET" && req.path == "/v1/nodes") {
    if (!caller.is_operator) return Fail(Error(EPERM, "nodes: only the cluster's operator lists them"));
    json nodes = json::array();
    for (const auto& [name, s] : *view()) {
      json n = s.record.ToJson();
      n["live"] = s.live;
      n["cordoned"] = s.cordoned;
      nodes.push_back(n);
    }
    return Json({{"nodes", nodes}, {"utilisation", placer_.MainUtilisation()}});
  }
  if (req.path == "/v1/sandboxes") {
    if (req.method == "POST") return Create(req, caller);
    if (req.method == "GET") return List(caller);
  }
  if (req.path == "/v1/warm" || req.path == "/v1/keys") {
    return Fail(Error(ENOTSUP, req.path + " is a node's: call the node (warm pools are kept per node)"));
  }
  const std::string prefix = "/v1/sandboxes/";
  if (!req.path.starts_with(prefix)) return Fail(Error(ENOENT, "no API " + req.method + " " + req.path));
  // A path is forwarded as it is: no "." or ".." segment may make it
  // another call on the node than the one routed here.
  for (const auto& part : Split(req.path, '/')) {
    if (part == "." || part == "..") return Fail(Error(EINVAL, "path " + Quote(req.path) + " has a dot segment"));
  }
  const std::string rest = req.path.substr(prefix.size());
  const std::string id = rest.substr(0, rest.find('/'));
  std::optional<Response> answer;
  auto node = NodeOf(id, &answer);
  if (!node.ok()) return *answer;
  ++forwarded_;
  auto out = forwarder_->Forward(CallFor(req, caller, *node));
  if (!out.error.ok()) {
    if (out.error.code() == ECANCELED) return Fail(out.error);  // (nobody hears it)
    ++unreachable_;
    return NodeLost(node->record.name, "node unreachable: " + out.error.ToString());
  }
  return FromNode(node->record.name, std::move(out.response));
}

std::unique_ptr<HttpServer::Upload> Gateway::StartUpload(const Request& req, std::optional<Response>* refusal) {
  if (e2b::Claims(req)) return E2bUpload(req, refusal);
  const std::string prefix = "/v1/sandboxes/";
  if (req.method != "PUT" || !req.path.starts_with(prefix) || !req.path.ends_with("/files")) return nullptr;
  auto caller = auth_.Authenticate(req);
  if (!caller.ok()) {
    *refusal = AuthRefusal(caller.status());
    return nullptr;
  }
  const std::string id = req.path.substr(prefix.size(), req.path.size() - prefix.size() - 6);
  auto node = NodeOf(id, refusal);
  if (!node.ok()) return nullptr;
  ++forwarded_;
  return forwarder_->ForwardUpload(CallFor(req, *caller, *node));
}

// --- create -------------------------------------------------------------------

Result<std::optional<std::string>> Gateway::NodeWithKey(const std::string& key, const Caller& caller) {
  auto v = view();
  // Each live node says yes (200), no (404), or nothing useful.
  std::vector<std::pair<std::string, std::future<int>>> asks;
  for (const auto& [name, state] : *v) {
    if (!state.live) continue;
    asks.emplace_back(name, std::async(std::launch::async, [this, state, key, &caller] {
      Request probe;
      probe.method = "GET";
      probe.path = "/v1/keys";
      probe.query["key"] = key;
      Forwarder::Call call = CallFor(probe, caller, state);
      call.timeout = kProbeTimeout;
      auto out = forwarder_->Forward(std::move(call));
      return out.error.ok() ? out.response.status : 0;
    }));
  }
  std::optional<std::string> found;
  std::vector<std::string> silent;
  for (auto& [name, ask] : asks) {
    const int status = ask.get();
    if (status == 200 && !found) found = name;
    if (status != 200 && status != 404) silent.push_back(name);
  }
  if (found) return found;
  // A node that could not say may hold the first attempt: placing the
  // retry elsewhere could make a second sandbox.
  if (!silent.empty()) {
    return Error(EAGAIN, StrCat("create: cannot tell whether an earlier attempt reached node ", Join(silent, ", "),
                                "; retry with the same Idempotency-Key"));
  }
  return found;
}

Response Gateway::Create(const Request& req, const Caller& caller) {
  json body = json::parse(req.body.empty() ? "{}" : req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) return Fail(Error(EINVAL, "request body is not a JSON object"));
  PlacementRequest want;
  want.backend = body.value("backend", kDefaultBackend);
  if (body.contains("labels")) {
    if (!body["labels"].is_object()) return Fail(Error(EINVAL, "create: labels must be an object of strings"));
    for (const auto& [k, v] : body["labels"].items()) {
      if (!v.is_string()) return Fail(Error(EINVAL, "create: label " + Quote(k) + " must be a string"));
      want.labels[k] = v.get<std::string>();
    }
  }
  if (body.contains("memory")) {
    if (body["memory"].is_string()) {
      auto m = ParseSize(body["memory"].get<std::string>());
      if (!m.ok()) return Fail(m.status().Annotate("create: memory"));
      want.memory = *m;
    } else if (body["memory"].is_number_unsigned()) {
      want.memory = body["memory"].get<uint64_t>();
    }
  }
  if (body.contains("count")) {
    if (!body["count"].is_number_integer() || body["count"].get<int64_t>() < 1) return Fail(Error(EINVAL, "create: count must be a whole number from 1"));
    want.count = static_cast<int>(std::min<int64_t>(body["count"].get<int64_t>(), 1000000));
  }
  return Place(req, caller, want);
}

Response Gateway::Place(const Request& req, const Caller& caller, const PlacementRequest& want) {
  ++creates_;
  // Every create reaches its node with a key, so the gateway's own retries
  // of one node never make two sandboxes.
  Request forwarded = req;
  auto key_it = req.headers.find("idempotency-key");
  const bool client_key = key_it != req.headers.end() && !key_it->second.empty();
  const std::string key = client_key ? key_it->second : RandomKey();
  forwarded.headers["idempotency-key"] = key;
  int attempt = 1;
  if (auto a = req.headers.find("x-strata-attempt"); a != req.headers.end()) attempt = std::atoi(a->second.c_str());

  auto v = view();
  const auto deadline = std::chrono::steady_clock::now() + options_.create_deadline;
  auto send = [&](const std::string& name) -> Forwarder::Outcome {
    auto it = v->find(name);
    if (it == v->end()) return {Error(ENOENT, "node " + name + " left the view"), false, {}};
    ++forwarded_;
    Forwarder::Call call = CallFor(forwarded, caller, it->second);
    call.timeout = std::max<Duration>(std::chrono::seconds(1), deadline - std::chrono::steady_clock::now());
    auto out = forwarder_->Forward(std::move(call));
    if (out.error.ok()) {
      out.response = FromNode(name, std::move(out.response));
      out.response.headers.emplace_back("X-Strata-Node", name);
    }
    return out;
  };
  // The same node until it answers: the request may have reached it, and
  // only its own key store knows whether it made the sandbox.
  auto stay = [&](const std::string& name, Forwarder::Outcome out) -> Response {
    while (!out.error.ok() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      out = send(name);
    }
    if (!out.error.ok()) {
      ++unreachable_;
      return NodeLost(name, StrCat("node lost while creating; retry with the same Idempotency-Key (", out.error.ToString(), ")"));
    }
    return std::move(out.response);
  };

  // A retry of a create that may have reached a node through another
  // gateway (one that died): that node answers it again.
  if (client_key && attempt > 1) {
    auto holder = NodeWithKey(key, caller);
    if (!holder.ok()) return Fail(holder.status());
    if (*holder) return stay(**holder, send(**holder));
  }
  std::set<std::string> tried;
  std::optional<Response> last_refusal;
  while (std::chrono::steady_clock::now() < deadline) {
    auto node = placer_.Place(want, tried);
    if (!node.ok()) {
      if (last_refusal) return *last_refusal;
      return Fail(node.status().Annotate("create"));
    }
    ++placements_;
    auto out = send(*node);
    if (!out.error.ok()) {
      if (out.reached) return stay(*node, std::move(out));
      placer_.Unplace(*node, want.count);  // never sent: another node may take it
      tried.insert(*node);
      ++unreachable_;
      continue;
    }
    const int status = out.response.status;
    // Refused, so nothing was made: the node is full or short of memory
    // (503), or the tenant is at its limit there (429; tenant limits are
    // per node, so another node may still have room for it).
    if (status == 503 || status == 429) {
      ++refusals_;
      placer_.Unplace(*node, want.count);
      tried.insert(*node);
      last_refusal = std::move(out.response);
      continue;
    }
    return std::move(out.response);
  }
  if (last_refusal) return *last_refusal;
  return Fail(Error(ETIMEDOUT, "create: no node took it within the gateway's deadline"));
}

// --- across nodes ---------------------------------------------------------------

Response Gateway::List(const Caller& caller) {
  auto v = view();
  std::vector<std::pair<std::string, std::future<Forwarder::Outcome>>> asks;
  for (const auto& [name, state] : *v) {
    if (!state.live) continue;
    asks.emplace_back(name, std::async(std::launch::async, [this, state, &caller] {
      Request list;
      list.method = "GET";
      list.path = "/v1/sandboxes";
      Forwarder::Call call = CallFor(list, caller, state);
      call.timeout = kFanOutTimeout;
      return forwarder_->Forward(std::move(call));
    }));
  }
  json all = json::array();
  std::vector<std::string> missing;
  for (const auto& [name, state] : *v) {
    if (!state.live) missing.push_back(name);
  }
  for (auto& [name, ask] : asks) {
    auto out = ask.get();
    std::optional<std::string> body = out.error.ok() && out.response.status == 200 ? WholeBody(out) : std::nullopt;
    json part = body ? json::parse(*body, nullptr, false) : json();
    if (!part.is_array()) {
      missing.push_back(name);
      continue;
    }
    for (auto& sb : part) {
      sb["node"] = name;
      all.push_back(std::move(sb));
    }
  }
  Response r = Json(all);
  if (!missing.empty()) r.headers.emplace_back("X-Strata-Missing-Nodes", Join(missing, ","));
  return r;
}

Response Gateway::Metrics() {
  auto v = view();
  std::string out;
  int live = 0, lost = 0, cordoned = 0;
  for (const auto& [name, s] : *v) {
    (s.live ? live : lost) += 1;
    cordoned += s.cordoned ? 1 : 0;
  }
  out += StrCat("# TYPE strata_gateway_nodes gauge\nstrata_gateway_nodes{state=\"live\"} ", live, "\nstrata_gateway_nodes{state=\"lost\"} ",
                lost, "\nstrata_gateway_nodes{state=\"cordoned\"} ", cordoned, "\n");
  out += StrCat("# TYPE strata_gateway_creates_total counter\nstrata_gateway_creates_total ", creates_.load(), "\n");
  out += StrCat("# TYPE strata_gateway_placements_total counter\nstrata_gateway_placements_total ", placements_.load(), "\n");
  out += StrCat("# TYPE strata_gateway_refusals_total counter\nstrata_gateway_refusals_total ", refusals_.load(), "\n");
  out += StrCat("# TYPE strata_gateway_unreachable_total counter\nstrata_gateway_unreachable_total ", unreachable_.load(), "\n");
  out += StrCat("# TYPE strata_gateway_forwarded_total counter\nstrata_gateway_forwarded_total ", forwarded_.load(), "\n");
  out += StrCat("# TYPE strata_gateway_main_utilisation gauge\nstrata_gateway_main_utilisation ", placer_.MainUtilisation(), "\n");
  std::vector<std::pair<std::string, std::future<Forwarder::Outcome>>> asks;
  for (const auto& [name, state] : *v) {
    if (!state.live) continue;
    asks.emplace_back(name, std::async(std::launch::async, [this, state] {
      Request m;
      m.method = "GET";
      m.path = "/metrics";
      Forwarder::Call call = CallFor(m, Caller{.is_operator = true}, state);
      call.timeout = kFanOutTimeout;
      return forwarder_->Forward(std::move(call));
    }));
  }
  std::set<std::string> comments;
  for (auto& [name, ask] : asks) {
    auto o = ask.get();
    if (!o.error.ok() || o.response.status != 200) continue;
    if (auto body = WholeBody(o)) AddNodeLabel(*body, name, &comments, &out);
  }
  Response r;
  r.content_type = "text/plain; version=0.0.4";
  r.body = std::move(out);
  return r;
}

json Gateway::Health() {
  auto v = view();
  int live = 0, lost = 0, cordoned = 0;
  for (const auto& [name, s] : *v) {
    (s.live ? live : lost) += 1;
    cordoned += s.cordoned ? 1 : 0;
  }
  std::lock_guard lock(view_mu_);
  const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - view_at_).count();
  return {{"ok", true},
          {"gateway", true},
          {"pid", ::getpid()},
          {"nodes", {{"live", live}, {"lost", lost}, {"cordoned", cordoned}}},
          {"utilisation", placer_.MainUtilisation()},
          {"etcd", {{"ok", etcd_error_.empty()}, {"error", etcd_error_}, {"view_age_ms", age}}}};
}

}  // namespace strata::launcher
