// LauncherClient over the daemon's unix socket.
#include "launcher/api/client.h"

#include <unistd.h>

#include "cache/http_client.h"
#include "common/strings.h"

namespace strata::launcher {

using nlohmann::json;

LauncherClient::LauncherClient(DaemonAddress address) : address_(std::move(address)) {
  cache::HttpOptions o;
  const std::string& url = address_.url;
  if (url.starts_with("http://") || url.starts_with("https://")) {
    base_ = url;
    while (base_.size() > 8 && base_.back() == '/') base_.pop_back();
  } else {
    socket_path_ = url.starts_with("unix://") ? url.substr(7) : url;
    base_ = "http://launcher";
    o.unix_socket = socket_path_;
  }
  o.ca_file = address_.ca_file;
  o.attempts = 1;
  o.connect_timeout = std::chrono::seconds(2);
  o.attempt_timeout = std::chrono::hours(24);  // an exec runs as long as its command
  o.deadline = std::chrono::hours(24);
  http_ = std::make_unique<cache::HttpClient>("launcher daemon " + (socket_path_.empty() ? base_ : socket_path_), o);
}

LauncherClient::LauncherClient(std::string socket_path, std::string token)
    : LauncherClient(DaemonAddress{"unix://" + socket_path, std::move(token), ""}) {}

LauncherClient::~LauncherClient() = default;
LauncherClient::LauncherClient(LauncherClient&&) noexcept = default;
LauncherClient& LauncherClient::operator=(LauncherClient&&) noexcept = default;

Result<HttpAnswer> LauncherClient::Raw(const std::string& method, const std::string& path, std::string_view body,
                                       const std::vector<std::string>& headers,
                                       const std::function<bool(std::string_view)>& sink) {
  cache::HttpRequest r;
  r.method = method;
  r.url = base_ + path;
  r.body = body;
  r.sink = sink;
  r.any_status = true;
  r.headers = headers;
  if (!address_.token.empty()) r.headers.push_back("Authorization: Bearer " + address_.token);
  STRATA_ASSIGN_OR_RETURN(cache::HttpResponse response, http_->Perform(r, method + " " + path));
  return HttpAnswer{response.status, std::move(response.body), std::move(response.headers)};
}

Result<std::string> LauncherClient::Call(const std::string& method, const std::string& path, std::string_view body,
                                         const std::function<bool(std::string_view)>& sink) {
  STRATA_ASSIGN_OR_RETURN(HttpAnswer answer, Raw(method, path, body, {}, sink));
  if (answer.status / 100 != 2) {
    json j = json::parse(answer.body, nullptr, false);
    std::string message = j.is_object() && j.contains("error") ? j["error"].get<std::string>()
                                                                : StrCat("launcher daemon: ", method, " ", path, ": HTTP ", answer.status);
    int code = j.is_object() && j.contains("errno") && j["errno"].is_number_integer() ? j["errno"].get<int>() : EIO;
    return Error(code, message);
  }
  return std::move(answer.body);
}

// Any HTTP answer counts (a 401 too): the caller's next call then says
// what is wrong, instead of "no daemon".
bool LauncherClient::Alive() {
  if (!socket_path_.empty() && ::access(socket_path_.c_str(), F_OK) != 0) return false;
  auto r = Raw("GET", "/v1/health", "");
  return r.ok() && r->status > 0;
}

namespace {
Result<json> ParseJson(const std::string& text) {
  json j = json::parse(text.empty() ? "{}" : text, nullptr, false);
  if (j.is_discarded()) return Error(EPROTO, "launcher daemon: answer is not JSON");
  return j;
}
}  // namespace

Result<json> LauncherClient::Create(const json& spec) {
  STRATA_ASSIGN_OR_RETURN(std::string body, Call("POST", "/v1/sandboxes", spec.dump()));
  return ParseJson(body);
}

Result<ExecResult> LauncherClient::Exec(const std::string& id, const json& request, const OutputSink& sink) {
  std::string buffer;
  std::optional<ExecResult> result;
  Status error;
  json req = request;
  req["stream"] = true;
  std::string text = req.dump();
  auto on_data = [&](std::string_view piece) {
    buffer.append(piece);
    size_t at = 0;
    while (true) {
      Frame type;
      std::string_view payload;
      auto used = DecodeFrame(std::string_view(buffer).substr(at), &type, &payload);
      if (!used.ok()) {
        error = used.status();
        return false;
      }
      if (*used == 0) break;
      at += *used;
      if (type == Frame::kStdout) sink(1, payload);
      else if (type == Frame::kStderr) sink(2, payload);
      else if (type == Frame::kError) error = ParseErrorFrame(payload);
      else if (type == Frame::kExit) {
        auto r = ParseExitFrame(payload);
        if (r.ok()) result = *r;
        else error = r.status();
      }
    }
    buffer.erase(0, at);
    return true;
  };
  Status call = Call("POST", "/v1/sandboxes/" + id + "/exec", text, on_data).status();
  if (!error.ok()) return error;
  STRATA_RETURN_IF_ERROR(call);
  if (!result) return Error(EPROTO, "exec " + id + ": the daemon's answer ended without an exit report");
  return *result;
}

Status LauncherClient::Put(const std::string& id, const std::string& path, std::string_view data, uint32_t mode) {
  char m[16];
  std::snprintf(m, sizeof m, "%o", mode);
  return Call("PUT", StrCat("/v1/sandboxes/", id, "/files?path=", cache::EncodeUrlComponent(path), "&mode=", m), data).status();
}

Result<std::string> LauncherClient::Get(const std::string& id, const std::string& path) {
  return Call("GET", StrCat("/v1/sandboxes/", id, "/files?path=", cache::EncodeUrlComponent(path)), "");
}

Result<json> LauncherClient::Network(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(std::string body, Call("GET", "/v1/sandboxes/" + id + "/network", ""));
  return ParseJson(body);
}

Result<json> LauncherClient::Usage(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(std::string body, Call("GET", "/v1/sandboxes/" + id + "/usage", ""));
  return ParseJson(body);
}

Result<json> LauncherClient::SetNetwork(const std::string& id, const json& policy) {
  STRATA_ASSIGN_OR_RETURN(std::string body, Call("PUT", "/v1/sandboxes/" + id + "/network", policy.dump()));
  return ParseJson(body);
}

Status LauncherClient::Pause(const std::string& id) { return Call("POST", "/v1/sandboxes/" + id + "/pause", "{}").status(); }
Status LauncherClient::Resume(const std::string& id) { return Call("POST", "/v1/sandboxes/" + id + "/resume", "{}").status(); }

Result<json> LauncherClient::Snapshot(const std::string& id, const std::string& tag, bool include_denied) {
  json req = {{"tag", tag}};
  if (include_denied) req["include_denied"] = true;
  STRATA_ASSIGN_OR_RETURN(std::string body, Call("POST", "/v1/sandboxes/" + id + "/snapshot", req.dump()));
  return ParseJson(body);
}

Status LauncherClient::Destroy(const std::string& id) { return Call("DELETE", "/v1/sandboxes/" + id, "").status(); }

Result<json> LauncherClient::Info(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(std::string body, Call("GET", "/v1/sandboxes/" + id, ""));
  return ParseJson(body);
}

Result<json> LauncherClient::List() {
  STRATA_ASSIGN_OR_RETURN(std::string body, Call("GET", "/v1/sandboxes", ""));
  return ParseJson(body);
}

Result<json> LauncherClient::SetWarmPool(const json& spec, int size) {
  json body = spec;
  body["size"] = size;
  STRATA_ASSIGN_OR_RETURN(std::string answer, Call("POST", "/v1/warm", body.dump()));
  return ParseJson(answer);
}

Result<json> LauncherClient::WarmPools() {
  STRATA_ASSIGN_OR_RETURN(std::string body, Call("GET", "/v1/warm", ""));
  STRATA_ASSIGN_OR_RETURN(json j, ParseJson(body));
  return j.value("pools", json::array());
}

Result<json> LauncherClient::Templates() {
  STRATA_ASSIGN_OR_RETURN(std::string body, Call("GET", "/v1/templates", ""));
  return ParseJson(body);
}

Result<json> LauncherClient::SetTemplate(const std::string& name, const json& spec) {
  STRATA_ASSIGN_OR_RETURN(std::string body, Call("PUT", "/v1/templates/" + name, spec.dump()));
  return ParseJson(body);
}

Status LauncherClient::RemoveTemplate(const std::string& name) {
  return Call("DELETE", "/v1/templates/" + name, "").status();
}

Result<std::string> LauncherClient::Metrics() { return Call("GET", "/metrics", ""); }

}  // namespace strata::launcher
