// The node API's other calls on one sandbox: destroy, snapshot, and file
// uploads.
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

// --- destroy and snapshot ----------------------------------------------------

Response LauncherServer::Destroy(const Request& req, const std::string& id, const Caller& caller) {
  KeyGuard guard;
  KeyClaim claim;
  if (auto reply = ClaimKey(manager_.keys(), req, caller.scope(), json::object(), json::object(), guard, &claim)) return *reply;
  const std::string& key = claim.key;
  if (claim.kind == IdempotencyKeys::Claim::kDone) return Json(claim.answer.body, claim.answer.status);
  const bool interrupted = claim.kind == IdempotencyKeys::Claim::kInterrupted;
  Status s = CheckOwner(id, caller);
  if (s.code() == ENOENT && interrupted) s = OkStatus();  // the dead daemon's destroy finished, or recovery did
  else if (s.ok()) s = manager_.Destroy(id);
  if (!key.empty()) {
    IdempotencyKeys& keys = guard.Settle();
    if (!s.ok() || !keys.Finish(caller.scope(), key, {200, json::object()}).ok()) keys.Release(caller.scope(), key);
  }
  return s.ok() ? Json(json::object()) : Fail(s);
}

Response LauncherServer::Snapshot(const Request& req, const std::string& id, const json& body, const Caller& caller) {
  std::vector<std::string> excludes;
  try {
    excludes = body.value("exclude", std::vector<std::string>{});
  } catch (const json::exception& e) {
    return Fail(Error(EINVAL, StrCat("snapshot: exclude: ", e.what())));
  }
  if (!body.contains("tag") || !body["tag"].is_string()) return Fail(Error(EINVAL, "snapshot: tag (NAME:VERSION) is required"));
  // A tenant publishes only under names its publish patterns allow (none
  // by default): moving a tag others use would change their sandboxes.
  if (caller.tenant && !PublishAllowed(caller.tenant->limits, body["tag"].get<std::string>())) {
    return Fail(Error(EPERM, StrCat("snapshot: tenant ", caller.scope(), " may not publish ", Quote(body["tag"].get<std::string>()))));
  }
  KeyGuard guard;
  KeyClaim claim;
  if (auto reply = ClaimKey(manager_.keys(), req, caller.scope(), body, json::object(), guard, &claim)) return *reply;
  const std::string& key = claim.key;
  if (claim.kind == IdempotencyKeys::Claim::kDone) return Json(claim.answer.body, claim.answer.status);
  if (body.contains("include_denied") && !body["include_denied"].is_boolean()) {
    return Fail(Error(EINVAL, "snapshot: include_denied must be true or false"));
  }
  auto r = manager_.Snapshot(id, body["tag"].get<std::string>(), std::move(excludes), body.value("include_denied", false));
  if (!key.empty()) {
    IdempotencyKeys& keys = guard.Settle();
    if (!r.ok() || !keys.Finish(caller.scope(), key, {201, *r}).ok()) keys.Release(caller.scope(), key);
  }
  return r.ok() ? Json(*r, 201) : Fail(r.status());
}

// --- uploads -----------------------------------------------------------------

namespace {

class FileUpload : public HttpServer::Upload {
 public:
  explicit FileUpload(std::unique_ptr<AgentClient::PutStream> stream) : stream_(std::move(stream)) {}
  Status Write(std::string_view piece) override { return stream_->Write(piece); }
  Response Finish() override {
    Status s = stream_->Finish();
    stream_.reset();
    return s.ok() ? Json(json::object()) : Fail(s);
  }
  void Abort() override { stream_.reset(); }  // the agent drops its temporary file

 private:
  std::unique_ptr<AgentClient::PutStream> stream_;
};

}  // namespace

std::unique_ptr<HttpServer::Upload> LauncherServer::StartUpload(const Request& req, std::optional<Response>* refusal) {
  if (auto p = plane(); p && p->claims(req)) return p->upload ? p->upload(req, refusal) : nullptr;
  const std::string prefix = "/v1/sandboxes/";
  if (req.method != "PUT" || !req.path.starts_with(prefix) || !req.path.ends_with("/files")) return nullptr;
  const std::string id = req.path.substr(prefix.size(), req.path.size() - prefix.size() - 6);
  auto refuse = [&](const Status& s) -> std::unique_ptr<HttpServer::Upload> {
    *refusal = Fail(s);
    return nullptr;
  };
  auto caller = auth_.Authenticate(req);
  if (!caller.ok()) {
    *refusal = AuthRefusal(caller.status());
    return nullptr;
  }
  if (id.empty() || id.find('/') != std::string::npos) return refuse(Error(ENOENT, "no API PUT " + req.path));
  if (Status s = CheckOwner(id, *caller); !s.ok()) return refuse(s);
  if (Status s = manager_.CheckExec(id); !s.ok()) return refuse(s);  // a frozen agent would never answer
  manager_.Touch(id);
  auto path = req.query.find("path");
  const std::string p = path == req.query.end() ? "" : path->second;
  if (Status s = CheckSandboxPath(p); !s.ok()) return refuse(s);
  uint32_t mode = 0644;
  if (auto m = req.query.find("mode"); m != req.query.end()) {
    char* end = nullptr;
    unsigned long v = std::strtoul(m->second.c_str(), &end, 8);
    if (m->second.empty() || *end || v > 07777) return refuse(Error(EINVAL, "files: mode must be octal, at most 7777"));
    mode = static_cast<uint32_t>(v);
  }
  if (auto f = req.query.find("format"); f != req.query.end() && f->second == "tar") {
    auto agent = manager_.AgentOf(id, "put a tree");
    if (!agent.ok()) return refuse(agent.status());
    auto tree = agent->BeginPutTree(p);
    if (!tree.ok()) return refuse(tree.status());
    (*tree)->Keep(manager_.Hold(id));
    auto upload = TarUpload(std::move(*tree));
    if (!upload.ok()) return refuse(upload.status());
    return std::move(*upload);
  } else if (f != req.query.end() && f->second != "file") {
    return refuse(Error(EINVAL, "files: format is file or tar"));
  }
  auto stream = manager_.BeginPut(id, p, mode);
  if (!stream.ok()) return refuse(stream.status());
  (*stream)->Keep(manager_.Hold(id));
  return std::make_unique<FileUpload>(std::move(*stream));
}

}  // namespace strata::launcher
