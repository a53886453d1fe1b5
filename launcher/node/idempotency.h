// Idempotency keys: a request retried with the same Idempotency-Key (per
// tenant) gets the first one's answer, or waits for it while it runs,
// instead of doing the work twice. Keys live in the daemon's registry
// (LMDB), written before the work starts, so they hold across a restart;
// a finished key is kept for a window after its call ended. Thread-safe.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "common/lmdb.h"
#include "common/units.h"

namespace strata::launcher {

class IdempotencyKeys {
 public:
  // How long a finished key's answer is kept.
  static constexpr auto kDefaultWindow = std::chrono::hours(24);

  // Opens (creating) the keys' own LMDB environment in `dir`. Its commits
  // are not synced: a key must outlive the daemon process (kill -9, an
  // upgrade), which the page cache ensures, not the node; after a node
  // crash the sandboxes the keys speak of are gone too. That keeps a key
  // to two unsynced writes instead of two fsyncs per call.
  static Result<std::unique_ptr<IdempotencyKeys>> Open(const std::string& dir, Duration window = kDefaultWindow);

  struct Answer {
    int status = 200;
    nlohmann::json body;
  };

  struct Claim {
    enum Kind {
      kOwner,        // the caller does the work, then Finish() or Release()
      kDone,         // `answer` is the first call's answer
      kInterrupted,  // an earlier daemon started the work and died; the caller
                     // owns the key now, and `note` is what that one wrote
                     // down before it started (e.g. the ids it meant to make)
      kMismatch,     // the key was used for a different request
    };
    Kind kind = kOwner;
    Answer answer;
    nlohmann::json note;
  };

  // A key is 1-255 printable ASCII characters.
  static Status CheckKey(std::string_view key);

  // Claims `key` in `scope` (the tenant; "" for the operator) for a request
  // whose method, path and body hash to `fingerprint`. Waits while another
  // caller holds the key. `note` is stored with a new claim.
  Result<Claim> Begin(const std::string& scope, const std::string& key, const std::string& fingerprint,
                      const nlohmann::json& note);
  // Stores the answer (durably) and wakes the callers waiting for it.
  Status Finish(const std::string& scope, const std::string& key, const Answer& answer);
  // Forgets the key (the work did not happen or was abandoned): a retry
  // does it again.
  void Release(const std::string& scope, const std::string& key);
  // Whether `key` was claimed in `scope` and not released: its work runs
  // (here or in a daemon that died) or its answer is kept.
  Result<bool> Known(const std::string& scope, const std::string& key);
  // Deletes keys whose call ended more than the window ago.
  void Expire();

 private:
  IdempotencyKeys(LmdbEnv env, MDB_dbi db, Duration window) : env_(std::move(env)), db_(db), window_(window) {}
  static std::string DbKey(const std::string& scope, const std::string& key) { return scope + "\n" + key; }

  LmdbEnv env_;
  MDB_dbi db_;
  Duration window_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::set<std::string> held_;  // keys whose work runs in this process
};

}  // namespace strata::launcher
