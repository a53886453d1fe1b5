#include "launcher/e2b/plane.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <ctime>
#include <thread>
#include <functional>
#include <condition_variable>

#include <google/protobuf/descriptor.h>

#include "common/crypto.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "launcher/api/wire.h"
#include "launcher/e2b/connect.h"
#include "launcher/e2b/gunzip.h"
#include "launcher/e2b/filesystem.pb.h"
#include "launcher/e2b/process.pb.h"
#include "launcher/e2b/routes.h"
#include "launcher/sandbox/ids.h"

namespace strata::launcher::e2b {

using nlohmann::json;
using Request = HttpServer::Request;
using Response = HttpServer::Response;

namespace {

// Label names the plane keeps for itself (a caller's metadata may not use them).
constexpr const char* kTemplateLabel = "e2b.template";
constexpr const char* kReservedPrefix = "e2b.";
// The most sandboxes one list page holds.
constexpr size_t kMaxPage = 1000;

using api::Dump;

// (E2B's answers are /v1's JSON answers.)
Response RestJson(const json& j, int status = 200) { return api::Json(j, status); }

Response NoContent() {
  Response r;
  r.status = 204;
  r.content_type.clear();
  return r;
}

std::string Rfc3339(double unix_seconds) {
  const time_t t = static_cast<time_t>(unix_seconds);
  struct tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Percent-decoding (a list's metadata filter is a query inside the query).
std::string UrlDecode(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i] == '+' ? ' ' : s[i]);
    }
  }
  return out;
}

bool IsSafeName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-'; });
}

ExecRequest::TerminalSize TerminalSizeOf(const process::PTY& pty) {
  return {static_cast<uint16_t>(std::clamp<uint32_t>(pty.size().cols(), 1, 10000)),
          static_cast<uint16_t>(std::clamp<uint32_t>(pty.size().rows(), 1, 10000))};
}

process::ProcessEvent::EndEvent EndOf(const ExecResult& r) {
  process::ProcessEvent::EndEvent end;
  end.set_exited(r.signal == 0);
  if (r.signal != 0) {
    end.set_exit_code(-1);
    end.set_status(StrCat("signal: ", strsignal(r.signal)));
    end.set_error(end.status());
  } else {
    end.set_exit_code(r.exit_code);
    end.set_status(StrCat("exit status ", r.exit_code));
    if (r.exit_code != 0) end.set_error(end.status());
  }
  return end;
}

}  // namespace

// --- templates ---------------------------------------------------------------

json Template::ToJson(const std::string& name) const {
  json j = {{"name", name}, {"layers", layers}};
  if (!backend.empty()) j["backend"] = backend;
  if (memory) j["memory"] = memory;
  if (cpus > 0) j["cpus"] = cpus;
  return j;
}

Result<Template> Template::FromJson(const json& j) {
  Template t;
  try {
    t.layers = j.at("layers").get<std::vector<std::string>>();
    t.backend = j.value("backend", "");
    t.memory = j.value("memory", uint64_t{0});
    t.cpus = j.value("cpus", 0.0);
  } catch (const json::exception& e) {
    return Error(EINVAL, StrCat("template: ", e.what()));
  }
  if (t.layers.empty()) return Error(EINVAL, "template: layers must name at least one layer");
  return t;
}

Result<std::unique_ptr<Plane>> Plane::Open(LauncherServer& server, const std::string& state_dir) {
  std::unique_ptr<Plane> p(new Plane(server));
  p->templates_file_ = JoinPath(state_dir, "templates.json");
  if (auto text = ReadFileToString(p->templates_file_); text.ok()) {
    json all = json::parse(*text, nullptr, false);
    if (!all.is_object()) return Error(EINVAL, "read templates " + p->templates_file_ + ": not a JSON object");
    for (const auto& [name, j] : all.items()) {
      auto t = Template::FromJson(j);
      if (!t.ok()) return t.status().Annotate("read templates " + p->templates_file_ + ": " + name);
      p->templates_[name] = std::move(*t);
    }
  } else if (text.status().code() != ENOENT) {
    return text.status().Annotate("read templates");
  }
  const std::string secret_file = JoinPath(state_dir, "e2b-secret");
  if (auto s = ReadFileToString(secret_file); s.ok() && s->size() >= 32) {
    p->secret_ = *s;
  } else {
    STRATA_ASSIGN_OR_RETURN(std::string bytes, RandomBytes(32));
    p->secret_ = HexEncode(std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    STRATA_RETURN_IF_ERROR(WriteFileAtomic(secret_file, p->secret_, /*durable=*/true, 0600).Annotate("write the E2B secret"));
  }
  Plane* self = p.get();
  server.SetPlane(std::make_shared<LauncherServer::Plane>(LauncherServer::Plane{
      .claims = [](const Request& r) { return e2b::Claims(r); },
      .handle = [self](const Request& r) { return self->Handle(r); },
      .upload = [self](const Request& r, std::optional<Response>* refusal) { return self->StartUpload(r, refusal); }}));
  return p;
}

Plane::~Plane() = default;

std::string Plane::AccessToken(const std::string& id) const {
  // A keyed hash: the node's secret, then the id (ids are [a-z0-9-], so no
  // extension of one is another's).
  auto h = Sha256Hex(secret_ + "/" + id);
  return h.ok() ? *h : "";
}

std::optional<Template> Plane::FindTemplate(const std::string& name) {
  std::lock_guard lock(mu_);
  auto it = templates_.find(name);
  if (it == templates_.end()) return std::nullopt;
  return it->second;
}

Status Plane::SaveTemplates() {
  json all = json::object();
  for (const auto& [name, t] : templates_) {
    json j = t.ToJson(name);
    j.erase("name");
    all[name] = j;
  }
  return WriteFileAtomic(templates_file_, all.dump(2) + "\n", /*durable=*/true).Annotate("write templates");
}

// --- the front ---------------------------------------------------------------

Response Plane::Handle(const Request& request) {
  if (!IsControlPath(request.path)) return Envd(request);
  // The control plane's key is a strata token, in X-API-KEY (or /v1's own
  // Authorization, or none on the node's unix socket).
  Request authed = request;
  if (auto key = request.headers.find("x-api-key"); key != request.headers.end() && !request.headers.count("authorization")) {
    authed.headers["authorization"] = "Bearer " + key->second;
  }
  try {
    auto caller = server_.Authenticate(authed);
    if (!caller.ok()) {
      Response r = RestError(caller.status().code() == EPERM ? 403 : 401, caller.status().message());
      if (r.status == 401) r.headers.emplace_back("WWW-Authenticate", "Bearer");
      return r;
    }
    if (request.path.starts_with("/v1/templates") || request.path.starts_with("/templates") ||
        request.path.starts_with("/v2/templates") || request.path.starts_with("/v3/templates")) {
      return Templates(request, *caller);
    }
    return Control(request, *caller);
  } catch (const json::exception& e) {
    return RestError(400, StrCat(request.method, " ", request.path, ": ", e.what()));
  } catch (const std::exception& e) {
    return RestError(500, StrCat(request.method, " ", request.path, ": ", e.what()));
  }
}

Result<json> Plane::V1(const std::string& method, const std::string& path, const json& body, const Caller& caller,
                       int* status, const std::string& idempotency_key) {
  Request r;
  r.method = method;
  r.path = path;
  r.headers["content-type"] = "application/json";
  if (!idempotency_key.empty()) r.headers["idempotency-key"] = idempotency_key;
  if (!body.is_null()) r.body = Dump(body);
  Response answer = server_.Call(r, caller);
  if (status) *status = answer.status;
  json j = answer.body.empty() ? json::object() : json::parse(answer.body, nullptr, false);
  if (answer.status >= 300) {
    const int err = j.is_object() ? j.value("errno", EIO) : EIO;
    return Error(err, j.is_object() ? j.value("error", answer.body) : answer.body);
  }
  return j;
}

json Plane::Describe(const json& info, bool detail) const {
  const std::string id = info.value("id", "");
  json labels = info.value("labels", json::object());
  const std::string tmpl = labels.is_object() ? labels.value(kTemplateLabel, "") : "";
  json metadata = json::object();
  for (const auto& [k, v] : labels.items()) {
    if (!k.starts_with(kReservedPrefix)) metadata[k] = v;
  }
  json j = {{"sandboxID", id}, {"templateID", tmpl}, {"clientID", "strata"}, {"envdVersion", kEnvdVersion}};
  if (!detail) {
    j["envdAccessToken"] = AccessToken(id);
    j["domain"] = nullptr;
    j["trafficAccessToken"] = nullptr;
    return j;
  }
  const double created = info.value("created", 0.0);
  j["alias"] = tmpl;
  j["metadata"] = metadata;
  j["startedAt"] = Rfc3339(created);
  j["endAt"] = info.contains("deadline") ? json(Rfc3339(info["deadline"].get<double>())) : json(nullptr);
  j["state"] = info.value("state", "running") == "paused" ? "paused" : "running";
  const json limits = info.value("limits", json::object());
  const double cpus = limits.value("cpus", 0.0);
  j["cpuCount"] = cpus > 0 ? static_cast<int>(std::ceil(cpus)) : static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  j["memoryMB"] = limits.value("memory", uint64_t{0}) >> 20;
  j["diskSizeMB"] = limits.value("disk", uint64_t{0}) >> 20;
  j["envdAccessToken"] = AccessToken(id);
  j["domain"] = nullptr;
  j["volumeMounts"] = json::array();
  const std::string mode = info.value("network", json::object()).value("mode", "none");
  j["allowInternetAccess"] = mode == "open" || mode == "host";
  return j;
}

// --- the control plane -------------------------------------------------------

Response Plane::Control(const Request& req, const Caller& caller) {
  const json body = req.body.empty() ? json::object() : json::parse(req.body);
  if (!body.is_object()) return RestError(400, req.method + " " + req.path + ": the body is not a JSON object");
  if ((req.path == "/sandboxes" || req.path == "/v2/sandboxes") && req.method == "POST") return Create(req, body, caller);
  if ((req.path == "/sandboxes" || req.path == "/v2/sandboxes") && req.method == "GET") return List(req, caller, req.path == "/v2/sandboxes");
  if (req.path == "/sandboxes/metrics" && req.method == "GET") return Metrics(req, caller);
  if (req.path == "/snapshots") return RestError(501, "snapshots: not served yet by strata's E2B plane (use /v1 snapshot)");
  // /sandboxes/ID[/verb] and /v2/sandboxes/ID/connect
  const size_t skip = req.path.starts_with("/v2/") ? 14 : 11;
  if (req.path.size() <= skip) return RestError(404, "no API " + req.method + " " + req.path);
  std::string rest = req.path.substr(skip);
  const std::string id = rest.substr(0, rest.find('/'));
  const std::string verb = rest.size() > id.size() ? rest.substr(id.size() + 1) : "";
  if (id.empty()) return RestError(404, "no API " + req.method + " " + req.path);
  if (Status s = server_.CheckOwner(id, caller); !s.ok()) return RestError(404, "sandbox " + id + " not found");
  const std::string v1 = "/v1/sandboxes/" + id;
  auto timeout_of = [&](const char* field, int64_t fallback) -> Result<int64_t> {
    if (!body.contains(field)) return fallback;
    if (!body[field].is_number_integer() || body[field].get<int64_t>() < 0) {
      return Error(EINVAL, StrCat(req.path, ": ", field, " must be a whole number of seconds"));
    }
    return body[field].get<int64_t>();
  };
  if (verb.empty() && req.method == "GET") {
    auto info = V1("GET", v1, nullptr, caller);
    return info.ok() ? RestJson(Describe(*info, true)) : RestError(info.status());
  }
  if (verb.empty() && req.method == "DELETE") {
    auto r = V1("DELETE", v1, nullptr, caller);
    return r.ok() ? NoContent() : RestError(r.status());
  }
  if (verb == "timeout" && req.method == "POST") {
    auto t = timeout_of("timeout", -1);
    if (!t.ok() || *t < 0) return RestError(400, "timeout: give {\"timeout\": seconds}");
    auto r = V1("POST", v1 + "/lifetime", {{"seconds", std::max<int64_t>(*t, 1)}}, caller);
    return r.ok() ? NoContent() : RestError(r.status());
  }
  if (verb == "refreshes" && req.method == "POST") {
    auto t = timeout_of("duration", 60);
    if (!t.ok()) return RestError(t.status());
    auto info = V1("GET", v1, nullptr, caller);
    if (!info.ok()) return RestError(info.status());
    // Refreshing never shortens the time left.
    const double left = info->contains("deadline") ? (*info)["deadline"].get<double>() - NowSeconds() : 0;
    if (left >= static_cast<double>(*t)) return NoContent();
    auto r = V1("POST", v1 + "/lifetime", {{"seconds", std::max<int64_t>(*t, 1)}}, caller);
    return r.ok() ? NoContent() : RestError(r.status());
  }
  if (verb == "pause" && req.method == "POST") {
    auto info = V1("GET", v1, nullptr, caller);
    if (!info.ok()) return RestError(info.status());
    if (info->value("state", "") == "paused") return RestError(409, "sandbox " + id + " is paused already");
    auto r = V1("POST", v1 + "/pause", json::object(), caller);
    return r.ok() ? NoContent() : RestError(r.status());
  }
  if ((verb == "connect" || verb == "resume") && req.method == "POST") return Connect(id, body, caller);
  if (verb == "metrics" && req.method == "GET") {
    // One metric, now: the node samples a sandbox when asked, and keeps no
    // history (an interval that ends before now has none).
    auto bound = [&](const char* name) -> std::optional<double> {
      auto it = req.query.find(name);
      if (it == req.query.end() || it->second.empty()) return std::nullopt;
      return std::strtod(it->second.c_str(), nullptr);
    };
    auto m = Metric(id, caller);
    if (!m.ok()) return RestError(m.status());
    const double at = (*m)["timestampUnix"].get<double>();
    json out = json::array();
    const auto start = bound("start"), end = bound("end");
    if ((!start || *start <= at + 1) && (!end || at <= *end + 1)) out.push_back(std::move(*m));
    return RestJson(out);
  }
  if (verb == "logs" || verb == "snapshots" || verb == "fork" || verb == "network") {
    return RestError(501, StrCat(req.method, " ", req.path, ": not served yet by strata's E2B plane"));
  }
  return RestError(404, "no API " + req.method + " " + req.path);
}

Result<json> Plane::Metric(const std::string& id, const Caller& caller) {
  STRATA_ASSIGN_OR_RETURN(json u, V1("GET", "/v1/sandboxes/" + id + "/usage", nullptr, caller));
  const double now = u.value("time", NowSeconds());
  const json cpu = u.value("cpu", json::object()), memory = u.value("memory", json::object()), disk = u.value("disk", json::object());
  const double cpus = cpu.value("limit", 0.0);
  const int count = cpus > 0 ? static_cast<int>(std::ceil(cpus)) : static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  const double used = cpu.value("seconds", 0.0);
  double pct = 0;
  {
    std::lock_guard lock(mu_);
    auto [it, fresh] = cpu_seen_.try_emplace(id, CpuSample{u.value("created", now), 0});
    const double wall = now - it->second.time;
    if (wall > 0) pct = std::clamp((used - it->second.seconds) / wall / count * 100, 0.0, 100.0);
    it->second = {now, used};
    if (cpu_seen_.size() > cpu_sweep_at_) {
      // Those of sandboxes that are gone go; the next sweep waits until the
      // table doubles, so many live ones never make every call sweep.
      std::erase_if(cpu_seen_, [&](const auto& kv) { return !server_.manager().Exists(kv.first); });
      cpu_sweep_at_ = std::max<size_t>(4096, 2 * cpu_seen_.size());
    }
  }
  uint64_t mem_total = memory.value("limit", uint64_t{0});
  if (mem_total == 0) mem_total = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return json{{"timestamp", Rfc3339(now)},
              {"timestampUnix", static_cast<int64_t>(now)},
              {"cpuCount", count},
              {"cpuUsedPct", pct},
              {"memUsed", memory.value("used", uint64_t{0})},
              {"memTotal", mem_total},
              {"memCache", memory.value("cache", uint64_t{0})},
              {"diskUsed", disk.value("used", uint64_t{0})},
              {"diskTotal", disk.value("limit", uint64_t{0})}};
}

Response Plane::Metrics(const Request& req, const Caller& caller) {
  auto ids = req.query.find("sandbox_ids");
  if (ids == req.query.end() || ids->second.empty()) return RestError(400, "sandboxes metrics: give ?sandbox_ids=ID,ID,...");
  std::vector<std::string> wanted;
  for (const auto& id : Split(ids->second, ',')) {
    if (!id.empty() && std::find(wanted.begin(), wanted.end(), id) == wanted.end()) wanted.push_back(id);
  }
  if (wanted.size() > 100) return RestError(400, StrCat("sandboxes metrics: ", wanted.size(), " sandboxes asked for, at most 100"));
  json out = json::object();
  for (const auto& id : wanted) {
    // (One the caller may not see, or that is not here, is left out.)
    if (!IsSandboxId(id) || !server_.CheckOwner(id, caller).ok()) continue;
    if (auto m = Metric(id, caller); m.ok()) out[id] = std::move(*m);
  }
  return RestJson({{"sandboxes", std::move(out)}});
}

Response Plane::Create(const Request& req, const json& body, const Caller& caller) {
  const std::string name = body.value("templateID", "base");
  const auto found = FindTemplate(name);
  if (!found) return RestError(404, "template " + Quote(name) + " not found (launcher template set " + name + " --layer ...)");
  const Template& t = *found;
  json create = {{"layers", t.layers}};
  if (!t.backend.empty()) create["backend"] = t.backend;
  if (t.memory) create["memory"] = t.memory;
  if (t.cpus > 0) create["cpus"] = t.cpus;
  int64_t timeout = kDefaultTimeoutSeconds;
  if (body.contains("timeout")) {
    if (!body["timeout"].is_number_integer() || body["timeout"].get<int64_t>() < 1) {
      return RestError(400, "create: timeout must be a whole number of seconds, at least 1");
    }
    timeout = body["timeout"].get<int64_t>();
  }
  create["lifetime"] = timeout;
  json labels = json::object();
  if (body.contains("metadata") && !body["metadata"].is_null()) {
    if (!body["metadata"].is_object()) return RestError(400, "create: metadata must be an object of strings");
    for (const auto& [k, v] : body["metadata"].items()) {
      if (k.starts_with(kReservedPrefix)) return RestError(400, "create: metadata names starting \"e2b.\" are strata's");
      labels[k] = v;
    }
  }
  labels[kTemplateLabel] = name;
  create["labels"] = labels;
  if (body.contains("envVars") && !body["envVars"].is_null()) {
    if (!body["envVars"].is_object()) return RestError(400, "create: envVars must be an object of strings");
    json env = json::array();
    for (const auto& [k, v] : body["envVars"].items()) {
      if (!v.is_string() || k.empty() || k.find('=') != std::string::npos) {
        return RestError(400, "create: envVars: " + Quote(k) + " is not a name with a string value");
      }
      env.push_back(k + "=" + v.get<std::string>());
    }
    create["env"] = env;
  }
  // Networks: no internet access is strata's default; an allow list (the
  // network's allowOut) opens those names only; allow_internet_access
  // true with no list opens it.
  const json network = body.value("network", json::object());
  for (const char* field : {"denyOut", "rules", "egressProxy", "allowPublicTraffic", "maskRequestHost"}) {
    if (network.is_object() && network.contains(field) && !network[field].is_null()) {
      return RestError(400, StrCat("create: network.", field, " is not served by strata (an allowOut list is)"));
    }
  }
  if (network.is_object() && network.contains("allowOut") && network["allowOut"].is_array() && !network["allowOut"].empty()) {
    create["network"] = {{"mode", "allow"}, {"allow", network["allowOut"]}};
  } else if (body.value("allow_internet_access", false) == true) {
    create["network"] = "open";
  }
  int status = 0;
  // (A create retried with its Idempotency-Key, by a client or a gateway,
  // answers the sandbox the first attempt made.)
  auto made = V1("POST", "/v1/sandboxes", create, caller, &status, Header(req, "idempotency-key"));
  if (!made.ok()) {
    Response r = RestError(status >= 400 ? status : 500, made.status().message());
    if (status == 429 || status == 503) r.headers.emplace_back("Retry-After", "1");
    return r;
  }
  return RestJson(Describe(*made, false), 201);
}

Response Plane::Connect(const std::string& id, const json& body, const Caller& caller) {
  int64_t timeout = 0;
  if (body.contains("timeout") && !body["timeout"].is_null()) {
    if (!body["timeout"].is_number_integer() || body["timeout"].get<int64_t>() < 1 ||
        body["timeout"].get<int64_t>() > 10 * 365 * 24 * 3600) {
      return RestError(400, "connect: timeout must be a whole number of seconds, at least 1");
    }
    timeout = body["timeout"].get<int64_t>();
  }
  const std::string v1 = "/v1/sandboxes/" + id;
  auto info = V1("GET", v1, nullptr, caller);
  if (!info.ok()) return RestError(404, "sandbox " + id + " not found");
  int status = 200;
  const double left = info->contains("deadline") ? (*info)["deadline"].get<double>() - NowSeconds() : 0;
  if (info->value("state", "") == "paused") {
    auto r = V1("POST", v1 + "/resume", json::object(), caller);
    if (!r.ok()) return RestError(r.status());
    status = 201;
    // A resumed sandbox runs for its timeout again (the default if none is given).
    if (timeout == 0) timeout = kDefaultTimeoutSeconds;
    if (left > static_cast<double>(timeout)) timeout = 0;
  } else if (left >= static_cast<double>(timeout)) {
    timeout = 0;  // (a connect only lengthens a running sandbox's time)
  }
  if (timeout > 0) {
    auto r = V1("POST", v1 + "/lifetime", {{"seconds", timeout}}, caller);
    if (!r.ok()) return RestError(r.status());
  }
  return RestJson(Describe(*info, false), status);
}

Response Plane::List(const Request& req, const Caller& caller, bool v2) {
  auto all = V1("GET", "/v1/sandboxes", nullptr, caller);
  if (!all.ok()) return RestError(all.status());
  auto query = [&](const char* name) -> std::string {
    auto it = req.query.find(name);
    return it == req.query.end() ? "" : it->second;
  };
  // metadata=k%3Dv%26k2%3Dv2 (the query's value is itself a query), state=running,paused
  std::map<std::string, std::string> want;
  for (const auto& pair : Split(query("metadata"), '&')) {
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    want[UrlDecode(pair.substr(0, eq))] = eq == std::string::npos ? "" : UrlDecode(pair.substr(eq + 1));
  }
  std::vector<std::string> states;
  for (const auto& s : Split(query("state"), ',')) {
    if (!s.empty()) states.push_back(s);
  }
  size_t limit = kMaxPage;
  if (!query("limit").empty()) limit = std::clamp<size_t>(std::strtoull(query("limit").c_str(), nullptr, 10), 1, kMaxPage);
  const std::string after = query("nextToken");
  std::vector<json> rows;
  for (const auto& info : *all) {
    json d = Describe(info, true);
    if (!states.empty() && std::find(states.begin(), states.end(), d["state"].get<std::string>()) == states.end()) continue;
    if (!v2 && d["state"] != "running") continue;  // (the older list shows running ones)
    bool match = true;
    for (const auto& [k, v] : want) match = match && d["metadata"].value(k, json()) == json(v);
    if (!match) continue;
    d.erase("envdAccessToken");
    rows.push_back(std::move(d));
  }
  std::sort(rows.begin(), rows.end(), [](const json& a, const json& b) { return a["sandboxID"] < b["sandboxID"]; });
  json page = json::array();
  std::string next;
  for (auto& row : rows) {
    if (!after.empty() && row["sandboxID"].get<std::string>() <= after) continue;
    if (page.size() == limit) {
      next = page.back()["sandboxID"].get<std::string>();
      break;
    }
    page.push_back(std::move(row));
  }
  Response r = RestJson(page);
  if (!next.empty()) r.headers.emplace_back("X-Next-Token", next);
  return r;
}

Response Plane::Templates(const Request& req, const Caller& caller) {
  const bool ours = req.path.starts_with("/v1/templates");
  const std::string rest = ours ? req.path.substr(13) : req.path.starts_with("/templates") ? req.path.substr(10) : req.path.substr(13);
  const std::string name = rest.starts_with("/") ? rest.substr(1) : rest;
  if (req.method == "GET" && name.empty()) {
    std::lock_guard lock(mu_);
    json list = json::array();
    for (const auto& [n, t] : templates_) {
      if (ours) {
        list.push_back(t.ToJson(n));
      } else {
        list.push_back({{"templateID", n}, {"buildID", n}, {"aliases", {n}}, {"public", false}, {"buildStatus", "ready"},
                        {"cpuCount", t.cpus > 0 ? static_cast<int>(std::ceil(t.cpus)) : 1}, {"memoryMB", t.memory >> 20},
                        {"diskSizeMB", 0}, {"envdVersion", kEnvdVersion}, {"createdAt", Rfc3339(0)}, {"updatedAt", Rfc3339(0)},
                        {"createdBy", nullptr}, {"lastSpawnedAt", nullptr}, {"spawnCount", 0}, {"buildCount", 1}});
      }
    }
    return RestJson(list);
  }
  if (!ours) {
    return RestError(400, "templates are built with strata's own tools, not E2B's build API: make layers with "
                          "`layerctl build` or `packdiff`, then name them with `launcher template set NAME --layer TAG ...`");
  }
  if (name.empty() || name.find('/') != std::string::npos) return RestError(404, "no API " + req.method + " " + req.path);
  if (req.method == "GET") {
    std::lock_guard lock(mu_);
    auto it = templates_.find(name);
    if (it == templates_.end()) return RestError(404, "template " + Quote(name) + " not found");
    return RestJson(it->second.ToJson(name));
  }
  if (!caller.is_operator) return RestError(403, "templates are the operator's to change");
  if (req.method == "PUT") {
    auto t = Template::FromJson(json::parse(req.body.empty() ? "{}" : req.body));
    if (!t.ok()) return RestError(t.status());
    if (!IsSafeName(name)) return RestError(400, "template name " + Quote(name) + ": letters, digits, '.', '_', '-'");
    std::lock_guard lock(mu_);
    auto old = templates_;
    templates_[name] = *t;
    if (Status s = SaveTemplates(); !s.ok()) {
      templates_ = std::move(old);
      return RestError(s);
    }
    return RestJson(t->ToJson(name));
  }
  if (req.method == "DELETE") {
    std::lock_guard lock(mu_);
    auto it = templates_.find(name);
    if (it == templates_.end()) return RestError(404, "template " + Quote(name) + " not found");
    auto old = templates_;
    templates_.erase(it);
    if (Status s = SaveTemplates(); !s.ok()) {
      templates_ = std::move(old);
      return RestError(s);
    }
    return NoContent();
  }
  return RestError(404, "no API " + req.method + " " + req.path);
}

// --- the data plane ----------------------------------------------------------

Result<std::string> Plane::EnvdSandbox(const Request& r) const {
  const std::string id = EnvdSandboxId(r);
  if (id.empty()) return Error(ENOENT, "envd: no E2b-Sandbox-Id header and no sandbox in the Host");
  const std::string token = Header(r, "x-access-token");
  if (token.empty()) return Error(EACCES, "sandbox " + Quote(id) + ": envd calls need its access token (X-Access-Token)");
  // A wrong token is answered as a missing sandbox: whether another
  // tenant's exists is not the caller's to learn.
  if (!IsSandboxId(id) || !ConstantTimeEqual(token, AccessToken(id)) || !server_.manager().Live(id)) {
    return Error(ENOENT, "sandbox " + Quote(id) + " not found");
  }
  return id;
}

Response Plane::Envd(const Request& request) {
  const bool rpc = request.path.starts_with("/process.") || request.path.starts_with("/filesystem.");
  auto rpc_error = [&](Code code, const std::string& message) { return ErrorFor(request, code, message); };
  auto id = EnvdSandbox(request);
  if (!id.ok()) {
    const int status = id.status().code() == EACCES ? 401 : 502;  // (E2B's proxy: 502 for a sandbox that is not there)
    if (rpc) return rpc_error(status == 401 ? Code::kUnauthenticated : Code::kNotFound, id.status().message());
    return RestError(status, id.status().message());
  }
  try {
    if (request.path == "/health" && request.method == "GET") return NoContent();
    // A paused sandbox's agent is frozen: refused at once, never waited on.
    if (Status s = server_.manager().CheckExec(*id); !s.ok()) {
      return rpc ? rpc_error(Code::kFailedPrecondition, s.message()) : RestError(409, s.message());
    }
    if (rpc) return Rpc(request, *id);
    server_.manager().Touch(*id);
    if (request.path == "/envs" && request.method == "GET") return RestJson(json::object());
    if (request.path == "/files" && request.method == "GET") return GetFile(request, *id);
    return RestError(404, "envd: no API " + request.method + " " + request.path);
  } catch (const std::exception& e) {
    return rpc ? rpc_error(Code::kInternal, e.what()) : RestError(500, e.what());
  }
}

Response Plane::GetFile(const Request& request, const std::string& id) {
  auto q = request.query.find("path");
  auto path = EnvdPath(q == request.query.end() ? "" : q->second, EnvdUser(request));
  if (!path.ok()) return RestError(400, "files: " + path.status().message());
  auto agent = server_.manager().AgentOf(id, "read a file");
  if (!agent.ok()) return RestError(agent.status());
  auto file = agent->OpenGet(*path);
  if (!file.ok()) return RestError(file.status());
  Response r;
  r.content_type = "application/octet-stream";
  r.stream = [file = std::shared_ptr<AgentClient::GetStream>(std::move(*file)), hold = server_.manager().Hold(id)](
                 const HttpServer::StreamWriter& write) {
    std::string piece;
    while (true) {
      auto more = file->Next(&piece);
      if (!more.ok()) throw std::runtime_error(more.status().ToString());  // (a cut body, never a short clean one)
      if (!*more || !write(piece)) return;
    }
  };
  return r;
}

namespace {

// POST /files: a form whose file parts are named by their destination
// (or one body to ?path=), each written through the agent as it arrives.
//
// A body to ?path= sent with Content-Encoding: gzip is decoded as it
// arrives; one that is damaged or cut short is refused (400) and its file
// is not written (the agent's temporary file goes, the old file stays).
class FilesUpload : public HttpServer::Upload {
 public:
  FilesUpload(SandboxManager& manager, std::string id, std::string user, std::string path, bool form, bool gzip)
      : manager_(manager), id_(std::move(id)), user_(std::move(user)), path_(std::move(path)), form_(form),
        hold_(manager.Hold(id_)) {
    if (gzip) gunzip_.emplace();
  }
  bool form() const override { return form_; }
  Status WritePart(const FormPiece& piece) override {
    // A part starts at offset 0 (libmicrohttpd may hand over its first
    // bytes in two pieces at offset 0, an empty one and the rest).
    const std::string name = piece.filename.empty() ? path_ : std::string(piece.filename);
    if (piece.offset == 0 && !(open_ && part_bytes_ == 0 && name == part_name_)) {
      STRATA_RETURN_IF_ERROR(Close());
      open_ = true;
      part_name_ = name;
      part_bytes_ = 0;
      if (!piece.filename.empty()) STRATA_RETURN_IF_ERROR(Open(name));  // (a field that is not a file is dropped)
    }
    part_bytes_ += piece.data.size();
    if (!stream_) return OkStatus();
    return stream_->Write(piece.data);
  }
  Status Write(std::string_view piece) override {
    if (!stream_) STRATA_RETURN_IF_ERROR(Open(path_));
    if (!gunzip_) return stream_->Write(piece);
    return gunzip_->Feed(piece, [&](std::string_view plain) { return stream_->Write(plain); }).Annotate("files: write " + current_);
  }
  Response Finish() override {
    // (An empty body to ?path= is an empty file.)
    Status s = !form_ && !stream_ ? Open(path_) : OkStatus();
    if (s.ok() && gunzip_) s = gunzip_->Finish().Annotate("files: write " + current_);
    if (!s.ok()) {
      stream_.reset();  // (never put in place)
      return RestError(s);
    }
    s = Close();
    if (!s.ok()) return RestError(s);
    return RestJson(written_);
  }
  void Abort() override { stream_.reset(); }
  Response Refused(const Status& s) override { return RestError(s); }

 private:
  Status Open(const std::string& name) {
    auto path = EnvdPath(name, user_);
    if (!path.ok()) return path.status().Annotate("files: write");
    STRATA_ASSIGN_OR_RETURN(stream_, manager_.BeginPut(id_, *path, 0644, user_ == "root" ? "" : user_));
    current_ = *path;
    return OkStatus();
  }
  Status Close() {
    open_ = false;
    if (!stream_) return OkStatus();
    auto stream = std::move(stream_);
    STRATA_RETURN_IF_ERROR(stream->Finish());
    const size_t slash = current_.rfind('/');
    written_.push_back({{"name", current_.substr(slash + 1)}, {"type", "file"}, {"path", current_}});
    return OkStatus();
  }
  SandboxManager& manager_;
  std::string id_, user_, path_;
  bool form_;
  std::shared_ptr<void> hold_;
  std::unique_ptr<AgentClient::PutStream> stream_;
  std::string current_;
  bool open_ = false;  // a form part under way
  std::string part_name_;
  uint64_t part_bytes_ = 0;
  json written_ = json::array();
  std::optional<Gunzip> gunzip_;
};

}  // namespace

std::unique_ptr<HttpServer::Upload> Plane::StartUpload(const Request& request, std::optional<Response>* refusal) {
  if (request.path != "/files" || request.method != "POST" || IsControlPath(request.path)) return nullptr;
  auto id = EnvdSandbox(request);
  if (!id.ok()) {
    *refusal = RestError(id.status().code() == EACCES ? 401 : 502, id.status().message());
    return nullptr;
  }
  if (Status s = server_.manager().CheckExec(*id); !s.ok()) {
    *refusal = RestError(s);
    return nullptr;
  }
  server_.manager().Touch(*id);
  const bool form = MediaType(request) == "multipart/form-data";
  auto q = request.query.find("path");
  const std::string path = q == request.query.end() ? "" : q->second;
  if (!form && path.empty()) {
    *refusal = RestError(400, "files: a body that is not a form needs ?path=");
    return nullptr;
  }
  std::string encoding = Header(request, "content-encoding");
  std::transform(encoding.begin(), encoding.end(), encoding.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool gzip = encoding == "gzip" || encoding == "x-gzip";
  if (!encoding.empty() && encoding != "identity" && !(gzip && !form)) {
    *refusal = RestError(415, StrCat("files: content encoding ", Quote(Header(request, "content-encoding")), " is not served",
                                     form ? " for a form (send one file to ?path= to gzip it)" : " (gzip and identity are)"));
    return nullptr;
  }
  return std::make_unique<FilesUpload>(server_.manager(), *id, EnvdUser(request), path, form, gzip);
}

// --- Connect services --------------------------------------------------------

namespace {

// An exec of the sandbox by the pid E2B knows it by.
Result<json> ExecOfPid(SandboxManager& manager, const std::string& id, uint32_t pid) {
  STRATA_ASSIGN_OR_RETURN(json list, manager.ListExecs(id));
  for (const auto& e : list.value("execs", json::array())) {
    if (e.value("pid", 0u) == pid && e.value("state", "") == "running") return e;
  }
  return Error(ENOENT, StrCat("process ", pid, " not found"));
}

Result<json> ExecOf(SandboxManager& manager, const std::string& id, const process::ProcessSelector& selector) {
  if (selector.has_tag()) {
    STRATA_ASSIGN_OR_RETURN(json list, manager.ListExecs(id));
    for (const auto& e : list.value("execs", json::array())) {
      if (e.value("id", "") == "e2b-tag-" + selector.tag() && e.value("state", "") == "running") return e;
    }
    return Error(ENOENT, "process with tag " + Quote(selector.tag()) + " not found");
  }
  return ExecOfPid(manager, id, selector.pid());
}

// An agent's entry (protocol.h, kFs) as envd's EntryInfo.
void EntryOf(const json& e, filesystem::EntryInfo* out) {
  out->set_name(e.value("name", ""));
  out->set_path(e.value("path", ""));
  const std::string type = e.value("type", "");
  out->set_type(type == "dir" ? filesystem::FILE_TYPE_DIRECTORY
                : type == "symlink" ? filesystem::FILE_TYPE_SYMLINK : filesystem::FILE_TYPE_FILE);
  out->set_size(e.value("size", int64_t{0}));
  out->set_mode(e.value("mode", 0u));
  out->set_permissions(e.value("permissions", ""));
  out->set_owner(e.value("owner", ""));
  out->set_group(e.value("group", ""));
  const int64_t ns = e.value("mtime_ns", int64_t{0});
  out->mutable_modified_time()->set_seconds(ns / 1000000000);
  out->mutable_modified_time()->set_nanos(static_cast<int32_t>(ns % 1000000000));
  if (e.contains("target")) out->set_symlink_target(e.value("target", ""));
}

}  // namespace

Response Plane::Rpc(const Request& request, const std::string& id) {
  auto call = ParseCall(request);
  if (!call.ok()) return ErrorFor(request, CodeOf(call.status()), call.status().message());
  SandboxManager& manager = server_.manager();
  manager.Touch(id);
  const std::string name = call->service + "/" + call->method;
  // A failure, framed as the call is (a streamed one's before it streams: a stream of its end alone).
  auto fail = [&](const Status& s) { return ErrorFor(request, CodeOf(s), s.message()); };
  if (name == "process.Process/Start" || name == "process.Process/Connect") {
    if (!call->streaming) return ErrorReply(Code::kInvalidArgument, name + " is a streaming call (application/connect+json)");
    std::string eid;
    uint32_t pid = 0;
    uint64_t out_offset = 0, err_offset = 0;
    bool pty = false;  // its output is a terminal's
    if (call->method == "Start") {
      process::StartRequest in;
      if (Status s = Decode(*call, 0, &in); !s.ok()) return fail(s);
      if (in.process().cmd().empty()) return fail(Error(EINVAL, "process: cmd is empty"));
      ExecRequest exec;
      exec.argv.push_back(in.process().cmd());
      for (const auto& a : in.process().args()) exec.argv.push_back(a);
      for (const auto& [k, v] : in.process().envs()) exec.env.push_back(k + "=" + v);
      // As the user asked for, else "user" (or root in an image without
      // that account), in its home unless a cwd is given.
      exec.user = EnvdUser(request);
      exec.user_optional = Header(request, "authorization").empty();
      exec.cwd = in.process().has_cwd() ? in.process().cwd() : "~";
      exec.open_stdin = in.has_stdin() && in.stdin();
      exec.merge_env = true;  // (envs go over the sandbox's envVars)
      exec.stdout_cap = exec.stderr_cap = uint64_t{16} << 20;
      if (in.has_pty()) {
        exec.pty = TerminalSizeOf(in.pty());
        pty = true;
      }
      std::string want = in.has_tag() ? "e2b-tag-" + in.tag() : "e2b-" + NewSandboxId().substr(3);
      auto started = manager.StartDetached(id, std::move(exec), want, &pid);
      if (!started.ok()) return fail(started.status());
      eid = *started;
    } else {
      process::ConnectRequest in;
      if (Status s = Decode(*call, 0, &in); !s.ok()) return fail(s);
      auto e = ExecOf(manager, id, in.process());
      if (!e.ok()) return fail(e.status());
      eid = e->value("id", "");
      pid = e->value("pid", 0u);
      out_offset = e->value("stdout_bytes", uint64_t{0});
      err_offset = e->value("stderr_bytes", uint64_t{0});
      pty = e->value("pty", false);
    }
    if (pid == 0) {  // (an agent before protocol 6: what it started is not left running unseen)
      if (call->method == "Start") manager.SignalExec(id, eid, SIGKILL).IgnoreError();
      return fail(Error(ENOTSUP, "process: sandbox " + id + "'s agent is older than protocol 6 (no pids)"));
    }
    auto watch = CallerConnection(request);
    // Keepalive events as often as the client asks (seconds), so a quiet
    // command's stream never looks dead to it.
    const int64_t keepalive = KeepAliveInterval(request);
    Response r;
    r.content_type = StreamContentType(*call);
    r.stream = [this, id, eid, pid, out_offset, err_offset, pty, watch, keepalive, c = *call](const HttpServer::StreamWriter& write) {
      SandboxManager& m = server_.manager();
      auto event = [&](const process::ProcessEvent& e) {
        process::StartResponse answer;  // (StartResponse and ConnectResponse are one shape)
        *answer.mutable_event() = e;
        return write(StreamMessage(c, answer));
      };
      process::ProcessEvent start;
      start.mutable_start()->set_pid(pid);
      if (!event(start)) return;
      KeepAlive ticking(keepalive, [&] {
        process::ProcessEvent alive;
        alive.mutable_keepalive();
        event(alive);
      });
      auto ended = m.Attach(id, eid, out_offset, err_offset, /*follow=*/true, [&](int stream, std::string_view bytes) {
        process::ProcessEvent data;
        if (pty) data.mutable_data()->set_pty(std::string(bytes));
        else if (stream == 1) data.mutable_data()->set_stdout(std::string(bytes));
        else data.mutable_data()->set_stderr(std::string(bytes));
        event(data);
      }, watch->get());
      m.Touch(id);
      ticking.Stop();
      if (!ended.ok()) {
        if (ended.status().code() != ECANCELED) write(StreamEnd(ended.status()));
        return;
      }
      if (*ended) {
        process::ProcessEvent end;
        *end.mutable_end() = EndOf(**ended);
        event(end);
      }
      write(StreamEnd());
    };
    return r;
  }
  if (name == "process.Process/SendInput" || name == "process.Process/CloseStdin" || name == "process.Process/StreamInput") {
    // (All three end in the agent's ExecInput: bytes for the command's stdin, or its end.)
    if (call->streaming != (call->method == "StreamInput")) {
      return fail(Error(EINVAL, name + (call->streaming ? " is not a streaming call" : " is a streaming call (application/connect+json)")));
    }
    process::ProcessSelector selector;
    std::vector<std::string> pieces;
    bool close = false;
    if (call->method == "SendInput") {
      process::SendInputRequest in;
      if (Status s = Decode(*call, 0, &in); !s.ok()) return fail(s);
      selector = in.process();
      pieces.push_back(in.input().has_pty() ? in.input().pty() : in.input().stdin());
    } else if (call->method == "CloseStdin") {
      process::CloseStdinRequest in;
      if (Status s = Decode(*call, 0, &in); !s.ok()) return fail(s);
      selector = in.process();
      close = true;
    } else {
      bool started = false;
      for (size_t i = 0; i < call->messages.size(); ++i) {
        process::StreamInputRequest in;
        if (Status s = Decode(*call, i, &in); !s.ok()) return fail(s);
        if (in.has_start()) {
          selector = in.start().process();
          started = true;
        } else if (in.has_data()) {
          pieces.push_back(in.data().input().has_pty() ? in.data().input().pty() : in.data().input().stdin());
        }
      }
      if (!started) return fail(Error(EINVAL, "process: StreamInput must start with a start event naming the process"));
    }
    auto e = ExecOf(manager, id, selector);
    if (!e.ok()) return fail(e.status());
    auto agent = manager.AgentOf(id, "send input");
    if (!agent.ok()) return fail(agent.status());
    const std::string eid = e->value("id", "");
    for (const auto& piece : pieces) {
      if (Status s = agent->ExecInput(eid, piece, false); !s.ok()) return fail(s);
    }
    if (close) {
      if (Status s = agent->ExecInput(eid, "", true); !s.ok()) return fail(s);
    }
    if (call->method == "SendInput") return UnaryReply(*call, process::SendInputResponse());
    if (call->method == "CloseStdin") return UnaryReply(*call, process::CloseStdinResponse());
    Response r;  // (client streaming: its one answer in a stream)
    r.content_type = StreamContentType(*call);
    r.body = StreamMessage(*call, process::StreamInputResponse()) + StreamEnd();
    return r;
  }
  if (call->service == "filesystem.Filesystem" && (call->method == "WatchDir" || call->method == "CreateWatcher" ||
                                                   call->method == "GetWatcherEvents" || call->method == "RemoveWatcher")) {
    return Watch(request, *call, id);  // (watch.cc)
  }
  if (call->streaming) return fail(Error(ENOSYS, "envd: " + name + " is not a streaming call strata serves"));
  if (name == "process.Process/List") {
    auto list = manager.ListExecs(id);
    if (!list.ok()) return ErrorReply(list.status());
    process::ListResponse out;
    for (const auto& e : list->value("execs", json::array())) {
      if (e.value("state", "") != "running" || !e.contains("pid")) continue;
      auto* p = out.add_processes();
      p->set_pid(e.value("pid", 0u));
      const auto argv = e.value("argv", std::vector<std::string>{});
      if (!argv.empty()) p->mutable_config()->set_cmd(argv[0]);
      for (size_t i = 1; i < argv.size(); ++i) p->mutable_config()->add_args(argv[i]);
      const std::string eid = e.value("id", "");
      if (eid.starts_with("e2b-tag-")) p->set_tag(eid.substr(8));
    }
    return UnaryReply(*call, out);
  }
  if (name == "process.Process/Update") {
    process::UpdateRequest in;
    if (Status s = Decode(*call, 0, &in); !s.ok()) return ErrorReply(s);
    auto e = ExecOf(manager, id, in.process());
    if (!e.ok()) return ErrorReply(e.status());
    if (in.has_pty()) {
      if (!e->value("pty", false)) return ErrorReply(Error(EINVAL, StrCat("process ", e->value("pid", 0u), " has no pty to resize")));
      auto agent = manager.AgentOf(id, "resize a terminal");
      if (!agent.ok()) return ErrorReply(agent.status());
      if (Status s = agent->ResizeExec(e->value("id", ""), TerminalSizeOf(in.pty())); !s.ok()) return ErrorReply(s);
    }
    return UnaryReply(*call, process::UpdateResponse());
  }
  if (name == "process.Process/SendSignal") {
    process::SendSignalRequest in;
    if (Status s = Decode(*call, 0, &in); !s.ok()) return ErrorReply(s);
    auto e = ExecOf(manager, id, in.process());
    if (!e.ok()) return ErrorReply(e.status());
    const int sig = in.signal() == process::SIGNAL_SIGKILL ? SIGKILL : SIGTERM;
    if (Status s = manager.SignalExec(id, e->value("id", ""), sig); !s.ok()) return ErrorReply(s);
    return UnaryReply(*call, process::SendSignalResponse());
  }
  if (call->service == "filesystem.Filesystem" &&
      (call->method == "Stat" || call->method == "ListDir" || call->method == "MakeDir" || call->method == "Move" ||
       call->method == "Remove")) {
    const std::string user = EnvdUser(request);
    auto agent = manager.AgentOf(id, "use its files");
    if (!agent.ok()) return ErrorReply(agent.status());
    auto path_of = [&](const std::string& p) -> Result<std::string> {
      auto r = EnvdPath(p, user);
      if (!r.ok()) return r.status().Annotate("filesystem: " + call->method);
      return r;
    };
    auto fs = [&](json op) -> Result<json> { return agent->Fs(op); };
    if (call->method == "Stat" || call->method == "MakeDir" || call->method == "Remove") {
      filesystem::StatRequest in;  // (the three requests are one shape: a path)
      if (Status s = Decode(*call, 0, &in); !s.ok()) return ErrorReply(s);
      auto path = path_of(in.path());
      if (!path.ok()) return ErrorReply(path.status());
      const char* op = call->method == "Stat" ? "stat" : call->method == "MakeDir" ? "mkdir" : "remove";
      auto r = fs({{"op", op}, {"path", *path}, {"user", user}});
      if (!r.ok()) return ErrorReply(r.status());
      if (call->method == "Remove") return UnaryReply(*call, filesystem::RemoveResponse());
      filesystem::StatResponse out;  // (StatResponse and MakeDirResponse are one shape)
      EntryOf(r->value("entry", json::object()), out.mutable_entry());
      return UnaryReply(*call, out);
    }
    if (call->method == "ListDir") {
      filesystem::ListDirRequest in;
      if (Status s = Decode(*call, 0, &in); !s.ok()) return ErrorReply(s);
      auto path = path_of(in.path());
      if (!path.ok()) return ErrorReply(path.status());
      auto r = fs({{"op", "list"}, {"path", *path}, {"depth", std::max(in.depth(), 1u)}});
      if (!r.ok()) return ErrorReply(r.status());
      filesystem::ListDirResponse out;
      for (const auto& e : r->value("entries", json::array())) EntryOf(e, out.add_entries());
      return UnaryReply(*call, out);
    }
    filesystem::MoveRequest in;
    if (Status s = Decode(*call, 0, &in); !s.ok()) return ErrorReply(s);
    auto from = path_of(in.source());
    if (!from.ok()) return ErrorReply(from.status());
    auto to = path_of(in.destination());
    if (!to.ok()) return ErrorReply(to.status());
    auto r = fs({{"op", "move"}, {"path", *from}, {"to", *to}, {"user", user}});
    if (!r.ok()) return ErrorReply(r.status());
    filesystem::MoveResponse out;
    EntryOf(r->value("entry", json::object()), out.mutable_entry());
    return UnaryReply(*call, out);
  }
  if (call->service == "process.Process" || call->service == "filesystem.Filesystem") {
    const auto* service = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(call->service);
    const bool known = service && service->FindMethodByName(call->method) != nullptr;
    if (known) return ErrorReply(Code::kUnimplemented, "envd: " + name + " is not served yet by strata");
  }
  return ErrorReply(Code::kNotFound, "envd: no method " + name);
}

}  // namespace strata::launcher::e2b
