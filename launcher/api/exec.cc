// The node API's execs: a command streamed or collected, detached execs
// started, attached to, asked after and signalled.
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "launcher/api/server.h"
#include "launcher/api/tar_bridge.h"
#include "launcher/api/wire.h"
#include "launcher/protocol/protocol.h"

namespace strata::launcher {

using nlohmann::json;
using Response = HttpServer::Response;
using Request = HttpServer::Request;
using namespace api;  // (the wire: parsing, answers, keys)

namespace {

// An idempotent exec's kept answer holds its output only up to this much
// (both streams); past it the answer is kept without it.
constexpr size_t kMaxKeptOutput = size_t{2} << 20;

}  // namespace

// --- exec --------------------------------------------------------------------

Response LauncherServer::Exec(const Request& req, const std::string& id, const json& body, const Caller& caller) {
  auto exec = ParseExec(body);
  if (!exec.ok()) return Fail(exec.status());
  if (body.value("detach", false)) return Detach(req, id, body, std::move(*exec), caller);
  ExecFormat format = ExecFormat::kJson;
  if (auto a = req.headers.find("accept"); a != req.headers.end() && a->second.find("application/x-ndjson") != std::string::npos) {
    format = ExecFormat::kNdjson;
  } else if (body.value("stream", true)) {
    format = ExecFormat::kFrames;
  }
  const std::string scope = caller.scope();
  KeyGuard guard;
  KeyClaim claim;
  if (auto reply = ClaimKey(manager_.keys(), req, scope, body, json::object(), guard, &claim)) return *reply;
  const std::string key = claim.key;
  guard.Disarm();  // the run below settles the key, however the exec ends
  {
    if (claim.kind == IdempotencyKeys::Claim::kDone) {  // the first answer again
      const json& answer = claim.answer.body;
      if (format == ExecFormat::kJson) return Json(answer, claim.answer.status);
      Response r;
      r.content_type = ContentType(format);
      for (int stream : {1, 2}) {
        auto bytes = Base64Decode(answer.value(stream == 1 ? "stdout" : "stderr", ""));
        if (bytes && !bytes->empty()) r.body += EncodePiece(format, stream, *bytes);
      }
      r.body += EncodeEnd(format, answer);
      return r;
    }
    // (An interrupted exec's command died with the daemon's connection to
    // its agent: it runs again.)
  }
  if (Status s = manager_.CheckExec(id); !s.ok()) {
    if (!key.empty()) manager_.keys().Release(scope, key);
    return Fail(s);
  }
  // A client that goes away abandons its command (the agent kills it). A
  // copy of the connection's descriptor: valid as long as the exec runs,
  // whatever the server does with its own.
  auto watch = std::make_shared<UniqueFd>(req.connection_fd >= 0 ? ::fcntl(req.connection_fd, F_DUPFD_CLOEXEC, 0) : -1);
  exec->cancel_fd = watch->get();
  // Runs the command; `emit` gets each encoded piece (false: the client is
  // gone). Returns the answer, and settles the idempotency key.
  auto run = [this, id, key, scope, format, watch](ExecRequest request, const std::function<bool(std::string_view)>& emit) {
    std::string out, err;
    bool gone = false;
    bool dropped = false;  // a keyed streamed answer past what a kept answer holds
    auto result = manager_.Exec(id, std::move(request), [&](int stream, std::string_view b) {
      if (format == ExecFormat::kJson) {
        (stream == 1 ? out : err).append(b);  // the answer itself (bounded by output_cap)
        return;
      }
      if (!key.empty() && !dropped) {
        if (out.size() + err.size() + b.size() > kMaxKeptOutput) {
          dropped = true;
          std::string().swap(out);
          std::string().swap(err);
        } else {
          (stream == 1 ? out : err).append(b);
        }
      }
      if (!emit(EncodePiece(format, stream, b))) gone = true;
    });
    json answer;
    if (result.ok()) {
      answer = ExecResultJson(*result);
      answer["stdout"] = Base64Encode(out);
      answer["stderr"] = Base64Encode(err);
    } else {
      answer = ErrorJson(result.status());
    }
    gone |= ClientGone(watch->get());
    if (!key.empty()) {
      // Only a command that ran to its end, for a client still there, is
      // an answer to keep; otherwise a retry runs it again. Its output is
      // kept only up to kMaxKeptOutput.
      const bool too_big = dropped || out.size() + err.size() > kMaxKeptOutput;
      json kept = json::object();
      for (const auto& [k, v] : answer.items()) {
        if (!too_big || (k != "stdout" && k != "stderr")) kept[k] = v;
      }
      if (too_big) kept["output_not_kept"] = true;
      if (!result.ok() || gone || !manager_.keys().Finish(scope, key, {200, kept}).ok()) manager_.keys().Release(scope, key);
    }
    return std::make_pair(result.status(), answer);
  };
  if (format == ExecFormat::kJson) {
    auto [status, answer] = run(std::move(*exec), nullptr);
    return status.ok() ? Json(answer) : CommandFail(status);
  }
  // Streamed as the command writes (stdout, stderr, then exit or error),
  // so a client sees output before the command ends.
  Response r;
  r.content_type = ContentType(format);
  r.stream = [run, format, request = std::move(*exec)](const HttpServer::StreamWriter& write) mutable {
    auto [status, answer] = run(std::move(request), write);
    write(EncodeEnd(format, answer));
  };
  return r;
}

// --- detached execs ----------------------------------------------------------

Response LauncherServer::Detach(const Request& req, const std::string& id, const json& body, ExecRequest exec,
                                const Caller& caller) {
  std::string exec_id = "ex-" + NewSandboxId().substr(3);
  KeyGuard guard;
  KeyClaim claim;
  if (auto reply = ClaimKey(manager_.keys(), req, caller.scope(), body, {{"exec_id", exec_id}}, guard, &claim)) return *reply;
  const std::string& key = claim.key;
  if (claim.kind == IdempotencyKeys::Claim::kDone) return Json(claim.answer.body, claim.answer.status);
  {
    if (claim.kind == IdempotencyKeys::Claim::kInterrupted) {
      // The dead daemon may have started it: the agent still has it then.
      exec_id = claim.note.value("exec_id", exec_id);
      if (auto status = manager_.ExecStatus(id, exec_id, Duration{0}); status.ok()) {
        json answer = {{"exec_id", exec_id}, {"sandbox", id}, {"state", (*status)["state"]}};
        guard.Settle().Finish(caller.scope(), key, {201, answer}).IgnoreError();
        return Json(answer, 201);
      }
    }
  }
  auto started = manager_.StartDetached(id, std::move(exec), exec_id);
  if (!key.empty()) {
    IdempotencyKeys& keys = guard.Settle();
    json answer = started.ok() ? json{{"exec_id", *started}, {"sandbox", id}, {"state", "running"}} : json();
    if (!started.ok() || !keys.Finish(caller.scope(), key, {201, answer}).ok()) keys.Release(caller.scope(), key);
  }
  if (!started.ok()) return CommandFail(started.status());
  return Json({{"exec_id", *started}, {"sandbox", id}, {"state", "running"}}, 201);
}

Response LauncherServer::Execs(const Request& req, const std::string& id, const std::string& verb, const json& body) {
  if (verb == "execs") {
    if (req.method != "GET") return Fail(Error(ENOENT, "no API " + req.method + " " + req.path));
    auto list = manager_.ListExecs(id);
    return list.ok() ? Json((*list)["execs"]) : Fail(list.status());
  }
  std::string rest = verb.substr(6);  // after "execs/"
  const std::string eid = rest.substr(0, rest.find('/'));
  const std::string what = rest.size() > eid.size() ? rest.substr(eid.size() + 1) : "";
  auto query = [&](const char* name) -> std::optional<std::string> {
    auto it = req.query.find(name);
    if (it == req.query.end()) return std::nullopt;
    return it->second;
  };
  auto number = [&](const char* name, uint64_t fallback) -> Result<uint64_t> {
    auto v = query(name);
    if (!v) return fallback;
    char* end = nullptr;
    uint64_t n = std::strtoull(v->c_str(), &end, 10);
    if (v->empty() || *end) return Error(EINVAL, StrCat(name, " must be a whole number"));
    return n;
  };
  if (what.empty() && req.method == "GET") {
    auto status = manager_.ExecStatus(id, eid, Duration{0});
    return status.ok() ? Json(*status) : Fail(status.status());
  }
  if (what == "wait" && req.method == "POST") {
    if (Status s = manager_.CheckExec(id); !s.ok()) return Fail(s);
    double seconds = 30;
    if (auto t = query("timeout")) {
      char* end = nullptr;
      seconds = std::strtod(t->c_str(), &end);
      if (t->empty() || *end || !(seconds >= 0 && seconds <= 3600)) return Fail(Error(EINVAL, "wait: timeout is 0-3600 seconds"));
    }
    auto status = manager_.ExecStatus(id, eid, std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
    manager_.Touch(id);
    return status.ok() ? Json(*status) : Fail(status.status());
  }
  if (what == "signal" && req.method == "POST") {
    auto sig = ParseSignal(body.value("signal", json("TERM")));
    if (!sig.ok()) return Fail(sig.status());
    Status s = manager_.SignalExec(id, eid, *sig);
    return s.ok() ? Json(json::object()) : Fail(s);
  }
  if (what == "output" && req.method == "GET") {
    auto offset = number("offset", 0);
    if (!offset.ok()) return Fail(offset.status());
    auto out_off = number("stdout_offset", *offset), err_off = number("stderr_offset", *offset);
    if (!out_off.ok()) return Fail(out_off.status());
    if (!err_off.ok()) return Fail(err_off.status());
    const bool follow = query("follow").value_or("true") != "false";
    // Refused before the stream starts when there is no such command.
    if (auto status = manager_.ExecStatus(id, eid, Duration{0}); !status.ok()) return Fail(status.status());
    ExecFormat format = ExecFormat::kFrames;
    if (auto a = req.headers.find("accept"); a != req.headers.end() && a->second.find("application/x-ndjson") != std::string::npos) {
      format = ExecFormat::kNdjson;
    }
    auto watch = std::make_shared<UniqueFd>(req.connection_fd >= 0 ? ::fcntl(req.connection_fd, F_DUPFD_CLOEXEC, 0) : -1);
    Response r;
    r.content_type = ContentType(format);
    r.stream = [this, id, eid, format, watch, o = *out_off, e = *err_off, follow](const HttpServer::StreamWriter& write) {
      auto ended = manager_.Attach(id, eid, o, e, follow, [&](int stream, std::string_view b) { write(EncodePiece(format, stream, b)); },
                                   watch->get());
      manager_.Touch(id);
      if (!ended.ok()) {
        if (ended.status().code() != ECANCELED) write(EncodeEnd(format, ErrorJson(ended.status())));
        return;
      }
      if (*ended) {
        write(EncodeEnd(format, ExecResultJson(**ended)));
      } else if (format == ExecFormat::kNdjson) {
        write(Dump({{"state", "running"}}) + "\n");
      }
    };
    return r;
  }
  return Fail(Error(ENOENT, "no API " + req.method + " " + req.path));
}

}  // namespace strata::launcher
