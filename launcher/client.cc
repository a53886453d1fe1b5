// LauncherClient over the daemon's unix socket.
#include "launcher/client.h"

#include <unistd.h>

#include "cache/http_client.h"
#include "common/strings.h"

namespace strata::launcher {

using nlohmann::json;

LauncherClient::LauncherClient(std::string socket_path, std::string token)
    : socket_path_(std::move(socket_path)), token_(std::move(token)) {
  cache::HttpOptions o;
  o.unix_socket = socket_path_;
  o.attempts = 1;
  o.connect_timeout = std::chrono::seconds(2);
  o.attempt_timeout = std::chrono::hours(24);  // an exec runs as long as its command
  o.deadline = std::chrono::hours(24);
  http_ = std::make_unique<cache::HttpClient>("launcher daemon " + socket_path_, o);
}

LauncherClient::~LauncherClient() = default;

Result<std::string> LauncherClient::Call(const std::string& method, const std::string& path, std::string_view body,
                                         const std::function<bool(std::string_view)>& sink) {
  cache::HttpRequest r;
  r.method = method;
  r.url = "http://launcher" + path;
  r.body = body;
  r.sink = sink;
  r.any_status = true;
  if (!token_.empty()) r.headers.push_back("Authorization: Bearer " + token_);
  STRATA_ASSIGN_OR_RETURN(cache::HttpResponse response, http_->Perform(r, method + " " + path));
  if (response.status / 100 != 2) {
    json j = json::parse(response.body, nullptr, false);
    std::string message = j.is_object() && j.contains("error") ? j["error"].get<std::string>() : response.status_line;
    int code = j.is_object() && j.contains("errno") && j["errno"].is_number_integer() ? j["errno"].get<int>() : EIO;
    return Error(code, message);
  }
  return response.body;
}

bool LauncherClient::Alive() { return ::access(socket_path_.c_str(), F_OK) == 0 && Call("GET", "/v1/health", "").ok(); }

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

Status LauncherClient::Pause(const std::string& id) { return Call("POST", "/v1/sandboxes/" + id + "/pause", "{}").status(); }
Status LauncherClient::Resume(const std::string& id) { return Call("POST", "/v1/sandboxes/" + id + "/resume", "{}").status(); }

Result<json> LauncherClient::Snapshot(const std::string& id, const std::string& tag) {
  STRATA_ASSIGN_OR_RETURN(std::string body, Call("POST", "/v1/sandboxes/" + id + "/snapshot", json{{"tag", tag}}.dump()));
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

Result<std::string> LauncherClient::Metrics() { return Call("GET", "/metrics", ""); }

}  // namespace strata::launcher
