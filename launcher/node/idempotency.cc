// IdempotencyKeys over the registry's "keys" database.
#include "launcher/node/idempotency.h"

#include <ctime>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"

namespace strata::launcher {

using nlohmann::json;

Result<std::unique_ptr<IdempotencyKeys>> IdempotencyKeys::Open(const std::string& dir, Duration window) {
  STRATA_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  LmdbEnv::Options o;
  // Sparse: kept exec answers (their output up to 2 MiB) are what fill it.
  o.map_size = size_t{4} << 30;
  // (Not a write map: on a full disk a write into the map is a SIGBUS,
  // where a write(2) is an error this can answer.)
  o.flags = MDB_NOSYNC;
  STRATA_ASSIGN_OR_RETURN(LmdbEnv env, LmdbEnv::Open(dir, o));
  MDB_dbi db;
  {
    STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env, false));
    STRATA_ASSIGN_OR_RETURN(db, txn.OpenDb("keys", MDB_CREATE));
    STRATA_RETURN_IF_ERROR(txn.Commit());
  }
  return std::unique_ptr<IdempotencyKeys>(new IdempotencyKeys(std::move(env), db, window));
}

Status IdempotencyKeys::CheckKey(std::string_view key) {
  if (key.empty() || key.size() > 255) return Error(EINVAL, "Idempotency-Key must be 1-255 characters");
  for (char c : key) {
    if (c < 0x21 || c > 0x7e) return Error(EINVAL, "Idempotency-Key must be printable ASCII without spaces");
  }
  return OkStatus();
}

Result<IdempotencyKeys::Claim> IdempotencyKeys::Begin(const std::string& scope, const std::string& key,
                                                      const std::string& fingerprint, const json& note) {
  const std::string k = DbKey(scope, key);
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return !held_.count(k); });
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
  auto existing = txn.Get(db_, k);
  if (existing.ok()) {
    json record = json::parse(*existing, nullptr, false);
    if (record.is_object()) {
      Claim claim;
      if (record.value("fp", "") != fingerprint) {
        claim.kind = Claim::kMismatch;
      } else if (record.value("state", "") == "done") {
        claim.kind = Claim::kDone;
        claim.answer.status = record.value("status", 200);
        claim.answer.body = record.value("body", json::object());
      } else {
        // Running, but not in this process: its daemon died.
        held_.insert(k);
        claim.kind = Claim::kInterrupted;
        claim.note = record.value("note", json::object());
      }
      return claim;
    }
  } else if (existing.status().code() != ENOENT) {
    return existing.status().Annotate("idempotency key " + Quote(key));
  }
  json record = {{"fp", fingerprint}, {"state", "running"}, {"note", note}, {"at", static_cast<int64_t>(::time(nullptr))}};
  STRATA_RETURN_IF_ERROR(txn.Put(db_, k, record.dump(-1, ' ', false, json::error_handler_t::replace)).status());
  STRATA_RETURN_IF_ERROR(txn.Commit().Annotate("record idempotency key " + Quote(key)));
  held_.insert(k);
  Claim claim;
  claim.note = note;
  return claim;
}

Result<bool> IdempotencyKeys::Known(const std::string& scope, const std::string& key) {
  const std::string k = DbKey(scope, key);
  std::lock_guard lock(mu_);
  if (held_.count(k)) return true;
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, true));
  auto existing = txn.Get(db_, k);
  if (existing.ok()) return true;
  if (existing.status().code() == ENOENT) return false;
  return existing.status().Annotate("idempotency key " + Quote(key));
}

Status IdempotencyKeys::Finish(const std::string& scope, const std::string& key, const Answer& answer) {
  const std::string k = DbKey(scope, key);
  Status s;
  {
    std::lock_guard lock(mu_);
    auto txn = LmdbTxn::Begin(env_, false);
    if (!txn.ok()) {
      s = txn.status();
    } else {
      json record = json::object();
      if (auto old = txn->Get(db_, k); old.ok()) record = json::parse(*old, nullptr, false);
      if (!record.is_object()) record = json::object();
      record["state"] = "done";
      record["status"] = answer.status;
      record["body"] = answer.body;
      record["at"] = static_cast<int64_t>(::time(nullptr));
      record.erase("note");
      s = txn->Put(db_, k, record.dump(-1, ' ', false, json::error_handler_t::replace)).status();
      if (s.ok()) s = txn->Commit();
    }
    held_.erase(k);
  }
  cv_.notify_all();
  return s.Annotate("store the answer of idempotency key " + Quote(key));
}

void IdempotencyKeys::Release(const std::string& scope, const std::string& key) {
  const std::string k = DbKey(scope, key);
  {
    std::lock_guard lock(mu_);
    if (auto txn = LmdbTxn::Begin(env_, false); txn.ok()) {
      txn->Del(db_, k).status().IgnoreError();
      txn->Commit().IgnoreError();
    }
    held_.erase(k);
  }
  cv_.notify_all();
}

void IdempotencyKeys::Expire() {
  const int64_t cutoff = static_cast<int64_t>(::time(nullptr)) - std::chrono::duration_cast<std::chrono::seconds>(window_).count();
  std::lock_guard lock(mu_);
  std::vector<std::string> old;
  {
    auto txn = LmdbTxn::Begin(env_, true);
    if (!txn.ok()) return;
    auto cursor = LmdbCursor::Open(*txn, db_);
    if (!cursor.ok()) return;
    std::string_view k, v;
    while (true) {
      auto more = cursor->Next(&k, &v);
      if (!more.ok() || !*more) break;
      json record = json::parse(v, nullptr, false);
      if (held_.count(std::string(k))) continue;
      if (!record.is_object() || record.value("at", int64_t{0}) < cutoff) old.emplace_back(k);
    }
  }
  if (old.empty()) return;
  auto txn = LmdbTxn::Begin(env_, false);
  if (!txn.ok()) return;
  for (const auto& k : old) txn->Del(db_, k).status().IgnoreError();
  Status s = txn->Commit();
  if (!s.ok()) STRATA_LOG(kWarn) << "expire idempotency keys: " << s.ToString();
}

}  // namespace strata::launcher
