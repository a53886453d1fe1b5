// The node API's create: one sandbox or a bulk of them, admitted, with an
// Idempotency-Key replayed.
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

// Most sandboxes one bulk create makes, and how many it makes at once.
constexpr int kMaxBulk = 1000;
constexpr int kBulkParallel = 8;

}  // namespace

// --- create ------------------------------------------------------------------

Response LauncherServer::Create(const Request& req, const json& body, const Caller& caller) {
  auto spec = ParseSpec(body, manager_.node());
  if (!spec.ok()) return Fail(spec.status());
  const bool bulk = body.contains("count");
  int count = 1;
  if (bulk) {
    if (!body["count"].is_number_integer() || body["count"].get<int64_t>() < 1 || body["count"].get<int64_t>() > kMaxBulk) {
      return Fail(Error(EINVAL, StrCat("create: count must be a whole number from 1 to ", kMaxBulk)));
    }
    count = body["count"].get<int>();
  }
  // What a tenant may ask for.
  if (caller.tenant) {
    const auto& limits = caller.tenant->limits;
    if (spec->network.mode == NetMode::kHost && !limits.net_host) {
      return Fail(Error(EPERM, StrCat("create: tenant ", caller.scope(), " may not use the host's network")));
    }
    if (!spec->store.empty()) {
      bool allowed = std::find(options_.stores.begin(), options_.stores.end(), spec->store) != options_.stores.end() ||
                     std::find(limits.stores.begin(), limits.stores.end(), spec->store) != limits.stores.end();
      if (!allowed) {
        return Fail(Error(EPERM, StrCat("create: tenant ", caller.scope(), " may not use store ", Quote(spec->store),
                                        " (only the daemon's --store list and its own)")));
      }
    }
    for (const auto& layer : spec->layers) {
      if (!LayerAllowed(limits, layer)) {
        return Fail(Error(EPERM, StrCat("create: tenant ", caller.scope(), " may not use layer ", Quote(layer))));
      }
    }
  }
  if (spec->store.empty() && !options_.stores.empty()) spec->store = options_.stores[0];

  std::vector<std::string> ids(static_cast<size_t>(count));
  for (auto& id : ids) id = NewSandboxId(manager_.node().name);
  KeyGuard guard;
  KeyClaim claim;
  if (auto reply = ClaimKey(manager_.keys(), req, caller.scope(), body, {{"ids", ids}}, guard, &claim)) return *reply;
  const std::string& key = claim.key;
  if (claim.kind == IdempotencyKeys::Claim::kDone) return Json(claim.answer.body, claim.answer.status);
  if (claim.kind == IdempotencyKeys::Claim::kInterrupted) {
    // The same ids again: those the dead daemon made (and this one
    // re-adopted) are answered as they are, the others are made now.
    auto old = claim.note.value("ids", std::vector<std::string>{});
    if (old.size() == ids.size()) ids = old;
  }

  struct Outcome {
    std::optional<json> info;
    Status error;
  };
  std::vector<Outcome> outcomes(ids.size());
  auto make = [&](size_t i) {
    if (manager_.Exists(ids[i])) {  // made by an interrupted first attempt
      auto info = manager_.Info(ids[i]);
      if (info.ok()) outcomes[i].info = *info;
      else outcomes[i].error = info.status();
      return;
    }
    // A create a ready warm sandbox serves commits nothing new: the pool's
    // count has it already.
    if (Status a = Admit(caller, manager_.WarmReadyFor(*spec) ? 0 : MemoryCommit(manager_.node(), *spec)); !a.ok()) {
      outcomes[i].error = a;
      return;
    }
    SandboxSpec one = *spec;
    one.id = ids[i];
    auto info = manager_.Create(std::move(one), caller.scope());
    Admitted(caller, MemoryCommit(manager_.node(), *spec));
    if (info.ok()) outcomes[i].info = std::move(*info);
    else outcomes[i].error = info.status();
  };
  if (ids.size() == 1) {
    make(0);
  } else {
    std::atomic<size_t> next{0};
    std::vector<std::thread> workers;
    for (int w = 0; w < std::min<int>(kBulkParallel, count); ++w) {
      workers.emplace_back([&] {
        for (size_t i; (i = next++) < ids.size();) make(i);
      });
    }
    for (auto& t : workers) t.join();
  }

  json created = json::array(), failures = json::array();
  Status first_error;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    if (outcomes[i].info) {
      created.push_back(*outcomes[i].info);
    } else {
      json f = ErrorJson(outcomes[i].error);
      f["index"] = i;
      failures.push_back(f);
      if (first_error.ok()) first_error = outcomes[i].error;
    }
  }
  Response r;
  if (!bulk) {
    r = created.empty() ? Fail(first_error) : Json(created[0], 201);
  } else {
    json answer = {{"sandboxes", created}, {"failures", failures}};
    int status = 201;
    if (created.empty()) {
      answer.update(ErrorJson(first_error));
      status = HttpServer::HttpStatusFor(first_error.code());
    }
    r = Json(answer, status);
  }
  if (!key.empty()) {
    // Nothing made: a retry tries again. Otherwise the retry gets this.
    IdempotencyKeys& keys = guard.Settle();
    if (created.empty() || !keys.Finish(caller.scope(), key, {r.status, json::parse(r.body)}).ok()) keys.Release(caller.scope(), key);
  }
  return r;
}

}  // namespace strata::launcher
