// The node API's wire: parsing requests, encoding answers, claiming keys.
#include "launcher/api/wire.h"

#include <poll.h>

#include <csignal>
#include <map>

#include "common/hash.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/units.h"
#include "launcher/protocol/protocol.h"
#include "launcher/sandbox/backend.h"

namespace strata::launcher::api {

using nlohmann::json;
using Response = HttpServer::Response;
using Request = HttpServer::Request;


std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

Response Json(const json& j, int status) {
  Response r;
  r.status = status;
  r.body = Dump(j);
  return r;
}

Response Fail(const Status& s) { return HttpServer::ErrorResponse(s); }

json ErrorJson(const Status& s) { return {{"error", s.ToString()}, {"errno", s.code()}}; }

Result<uint64_t> SizeField(const json& j, const char* name) {
  if (j[name].is_string()) return ParseSize(j[name].get<std::string>());
  return j[name].get<uint64_t>();
}

Result<SandboxSpec> ParseSpec(const json& j, const NodeConfig& node) {
  SandboxSpec spec;
  try {
    spec.layers = j.at("layers").get<std::vector<std::string>>();
    spec.store = j.value("store", "");
    spec.backend = j.value("backend", kDefaultBackend);
    if (!node.backends || !node.backends->Find(spec.backend).ok()) {
      return Error(EINVAL, StrCat("create: backend must be ", JoinOr(node.backends ? node.backends->Names() : std::vector<std::string>{}),
                                  ", not ", Quote(spec.backend)));
    }
    spec.runtime = j.value("runtime", "");
    auto runtime = RuntimeOf(**node.backends->Find(spec.backend), node, spec.runtime);
    if (!runtime.ok()) return runtime.status().Annotate("create");
    // The node's default is said by none: pools and their takes match
    // whether a create named it or not.
    if (*runtime == node.runtime) spec.runtime.clear();
    spec.limits.cpus = j.value("cpus", 0.0);
    spec.limits.pids = j.value("pids", int64_t{0});
    if (j.contains("memory")) {
      STRATA_ASSIGN_OR_RETURN(spec.limits.memory, SizeField(j, "memory"));
    }
    if (j.contains("disk")) {
      STRATA_ASSIGN_OR_RETURN(spec.disk, SizeField(j, "disk"));
    }
    if (j.contains("network")) {
      auto policy = NetPolicy::FromJson(j["network"]);
      if (!policy.ok()) return policy.status().Annotate("create");
      spec.network = *policy;
    }
    spec.env = j.value("env", std::vector<std::string>{});
    spec.workdir = j.value("workdir", "/");
    if (j.contains("files")) {
      STRATA_ASSIGN_OR_RETURN(spec.files, ParseFileRules(j["files"], "create: files"));
    }
    spec.kill_leftovers = j.value("kill_leftovers", false);
    if (j.contains("ttl") && !j["ttl"].is_null()) {
      if (j["ttl"].is_string()) {
        STRATA_ASSIGN_OR_RETURN(Duration d, ParseDuration(j["ttl"].get<std::string>()));
        spec.ttl_seconds = std::chrono::duration_cast<std::chrono::seconds>(d).count();
      } else {
        const double ttl = j["ttl"].get<double>();
        if (!(ttl >= 0 && ttl <= kMaxTtlSeconds)) return Error(EINVAL, StrCat("create: ttl must be 0 to ", kMaxTtlSeconds, " seconds"));
        spec.ttl_seconds = static_cast<int64_t>(ttl);
      }
      if (spec.ttl_seconds < 0 || spec.ttl_seconds > kMaxTtlSeconds) {
        return Error(EINVAL, StrCat("create: ttl must be 0 to ", kMaxTtlSeconds, " seconds"));
      }
    }
    if (j.contains("lifetime") && !j["lifetime"].is_null()) {
      STRATA_ASSIGN_OR_RETURN(spec.deadline_ms, DeadlineField(j["lifetime"], "create: lifetime"));
    }
    if (j.contains("labels") && !j["labels"].is_null()) {
      STRATA_ASSIGN_OR_RETURN(spec.labels, ParseLabels(j["labels"], "create: labels"));
    }
  } catch (const json::exception& e) {
    return Error(EINVAL, StrCat("create: ", e.what()));
  }
  if (spec.layers.empty()) return Error(EINVAL, "create: layers must name at least one layer");
  return spec;
}

Result<int64_t> DeadlineField(const json& j, const char* what) {
  if (!j.is_number() || !(j.get<double>() >= 0 && j.get<double>() <= kMaxTtlSeconds)) {
    return Error(EINVAL, StrCat(what, " must be 0 to ", kMaxTtlSeconds, " seconds"));
  }
  const double seconds = j.get<double>();
  if (seconds == 0) return int64_t{0};
  const int64_t now = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::system_clock::now().time_since_epoch()).count();
  return now + static_cast<int64_t>(seconds * 1000);
}

Result<std::map<std::string, std::string>> ParseLabels(const json& j, const char* what) {
  if (!j.is_object()) return Error(EINVAL, StrCat(what, " must be an object of strings"));
  if (j.size() > kMaxLabels) return Error(EINVAL, StrCat(what, ": at most ", kMaxLabels, " labels"));
  std::map<std::string, std::string> labels;
  for (const auto& [k, v] : j.items()) {
    if (!v.is_string()) return Error(EINVAL, StrCat(what, ": label ", Quote(k), " is not a string"));
    if (k.empty() || k.size() > kMaxLabelBytes || v.get<std::string>().size() > kMaxLabelBytes) {
      return Error(EINVAL, StrCat(what, ": label ", Quote(k.substr(0, 64)), ": names and values are at most ", kMaxLabelBytes, " bytes, names not empty"));
    }
    labels[k] = v.get<std::string>();
  }
  return labels;
}

Result<ExecRequest> ParseExec(const json& j) {
  ExecRequest r;
  try {
    r.argv = j.at("argv").get<std::vector<std::string>>();
    r.env = j.value("env", std::vector<std::string>{});
    r.cwd = j.value("cwd", "");
    if (j.contains("timeout")) {
      if (j["timeout"].is_string()) {
        STRATA_ASSIGN_OR_RETURN(r.timeout, ParseDuration(j["timeout"].get<std::string>()));
      } else {
        const double seconds = j["timeout"].get<double>();
        if (!(seconds >= 0 && seconds <= kMaxTimeoutSeconds)) {
          return Error(EINVAL, StrCat("exec: timeout must be 0 (none) to ", kMaxTimeoutSeconds, " seconds"));
        }
        r.timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
      }
    }
    uint64_t cap = j.value("output_cap", uint64_t{1} << 20);
    if (cap > kMaxOutputCap) return Error(EINVAL, StrCat("exec: output_cap is at most ", kMaxOutputCap, " bytes"));
    r.stdout_cap = r.stderr_cap = cap;
    if (j.contains("kill_leftovers") && !j["kill_leftovers"].is_null()) r.kill_leftovers = j["kill_leftovers"].get<bool>();
    if (j.contains("files")) {
      STRATA_ASSIGN_OR_RETURN(r.files, ParseFileRules(j["files"], "exec: files"));
    }
    const std::string role = j.value("role", "agent");
    if (role != "agent" && role != "grader") return Error(EINVAL, "exec: role must be agent or grader, not " + Quote(role));
    r.grader = role == "grader";
    if (j.contains("stdin")) {
      auto in = Base64Decode(j["stdin"].get<std::string>());
      if (!in) return Error(EINVAL, "exec: stdin is not base64");
      r.stdin_data = std::move(*in);
    }
  } catch (const json::exception& e) {
    return Error(EINVAL, StrCat("exec: ", e.what()));
  }
  if (r.argv.empty()) return Error(EINVAL, "exec: argv is empty");
  for (const auto& a : r.argv) {
    if (a.find('\0') != std::string::npos) return Error(EINVAL, "exec: an argument holds a NUL byte");
  }
  return r;
}

// A signal by number or name ("TERM", "SIGKILL").
Result<int> ParseSignal(const json& j) {
  if (j.is_number_integer()) {
    int n = j.get<int>();
    if (n > 0 && n < 65) return n;
  } else if (j.is_string()) {
    std::string name = j.get<std::string>();
    if (name.starts_with("SIG")) name = name.substr(3);
    static const std::map<std::string, int> kNames = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
                                                      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"CONT", SIGCONT},
                                                      {"STOP", SIGSTOP}};
    if (auto it = kNames.find(name); it != kNames.end()) return it->second;
  }
  return Error(EINVAL, "signal must be a number (1-64) or a name such as TERM or KILL");
}

// A path in a sandbox for the file calls: absolute, no NUL, no "..".
Status CheckSandboxPath(const std::string& path) {
  if (path.empty() || path[0] != '/') return Error(EINVAL, "files: ?path=/absolute/path is required");
  if (path.size() > 4096) return Error(EINVAL, "files: path is longer than 4096 bytes");
  if (path.find('\0') != std::string::npos) return Error(EINVAL, "files: path holds a NUL byte");
  for (const auto& part : Split(path, '/')) {
    if (part == "..") return Error(EINVAL, "files: path " + Quote(path) + " has a \"..\" component");
  }
  return OkStatus();
}


bool ClientGone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, HangupEvents(fd), 0};
  return ::poll(&p, 1, 0) == 1 && HungUp(p);
}

std::string Fingerprint(const Request& req, json body) {
  body.erase("stream");  // how the answer is delivered is not the request
  return HashBytes(StrCat(req.method, " ", req.path, "\n", Dump(body))).Hex();
}


// The sandbox was there when the exec began (CheckExec): a "no such
// file" or "permission denied" now is about the command (a missing
// program), a bad request rather than a missing sandbox.
// (The errno stays what it was.)
Response CommandFail(const Status& s) {
  Response r = Fail(s);
  if (s.code() == ENOENT || s.code() == EACCES || s.code() == ENOEXEC) r.status = 400;
  return r;
}

std::optional<Response> ClaimKey(IdempotencyKeys& keys, const Request& req, const std::string& scope, const json& body,
                                 const json& note, KeyGuard& guard, KeyClaim* out) {
  const auto header = req.headers.find("idempotency-key");
  if (header == req.headers.end() || header->second.empty()) return std::nullopt;
  out->key = header->second;
  if (Status s = IdempotencyKeys::CheckKey(out->key); !s.ok()) return Fail(s);
  auto claim = keys.Begin(scope, out->key, Fingerprint(req, body), note);
  if (!claim.ok()) {
    // The key store failed (full, a disk error): the call is served as if
    // it had no key rather than refused; a retry may then repeat it.
    STRATA_LOG(kWarn) << "idempotency key " << Quote(out->key) << " not kept: " << claim.status().ToString();
    out->key.clear();
    return std::nullopt;
  }
  if (claim->kind == IdempotencyKeys::Claim::kMismatch) {
    Response r = Fail(Error(EINVAL, "Idempotency-Key " + Quote(out->key) + " was used for a different request"));
    r.status = 422;
    return r;
  }
  out->kind = claim->kind;
  out->answer = std::move(claim->answer);
  out->note = std::move(claim->note);
  if (claim->kind != IdempotencyKeys::Claim::kDone) guard.Hold(keys, scope, out->key);
  return std::nullopt;
}


std::string EncodePiece(ExecFormat f, int stream, std::string_view bytes) {
  if (f == ExecFormat::kFrames) return EncodeFrame(stream == 1 ? Frame::kStdout : Frame::kStderr, bytes);
  return Dump({{stream == 1 ? "stdout" : "stderr", Base64Encode(bytes)}}) + "\n";
}

// The exec's ending: `answer` is the exit report (plus stdout/stderr) or
// an error object.
std::string EncodeEnd(ExecFormat f, const json& answer) {
  const bool error = answer.contains("error");
  if (f == ExecFormat::kFrames) {
    json report = answer;
    report.erase("stdout");
    report.erase("stderr");
    return EncodeFrame(error ? Frame::kError : Frame::kExit, Dump(report));
  }
  if (error) return Dump(answer) + "\n";
  json report = answer;
  report.erase("stdout");
  report.erase("stderr");
  return Dump({{"exit", report}}) + "\n";
}

const char* ContentType(ExecFormat f) {
  return f == ExecFormat::kFrames ? "application/vnd.strata.frames" : "application/x-ndjson";
}

}  // namespace strata::launcher::api
