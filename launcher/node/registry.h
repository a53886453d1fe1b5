// The node daemon's registries (LMDB, database "sandboxes", a JSON record
// per key): the lasting one in the state directory keeps what outlives
// the machine (warm pools, "warm:<name>"), each commit synced; this
// boot's, in boot/<boot id>/, keeps the sandboxes, which die with the
// machine, so its commits are not synced and a later boot removes it
// unread. Thread-safe (LMDB serializes writers). docs/api.md, "State and
// restarts".
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/lmdb.h"
#include "common/status.h"

namespace strata::launcher {

class Registry {
 public:
  // Opens (creating) both in `state_dir` for the boot `boot_id`. Earlier
  // boots' registries are removed unread; the sandboxes an older daemon
  // kept in the lasting registry (before 2026-12-04) move to this boot's.
  static Result<std::unique_ptr<Registry>> Open(const std::string& state_dir, std::string_view boot_id);

  // Records moved from the lasting registry by Open.
  int moved() const { return moved_; }
  // No start in this boot has swept the uppers' snapshots yet (the marker
  // MarkSwept writes is missing).
  bool first_start_in_boot() const { return first_start_in_boot_; }
  Status MarkSwept();

  // Everything recorded: the lasting registry's records, then this boot's.
  // A record that is not JSON comes back as a discarded value.
  Result<std::vector<std::pair<std::string, nlohmann::json>>> All();

  // This boot's: a sandbox's record written, or forgotten. Durable against
  // a crash of the daemon when they return (in the page cache); against a
  // crash of the machine not at all, and they need not be.
  Status Record(const std::string& id, const nlohmann::json& record);
  Status Forget(const std::string& id);
  // Sets `fields` in a sandbox's record (ENOENT: none).
  Status Update(const std::string& id, const nlohmann::json& fields);
  // `id` recorded and `old_id` forgotten in one commit (a warm sandbox
  // taken by a create is the pool's or the create's, never both).
  Status Rename(const std::string& old_id, const std::string& id, const nlohmann::json& record);

  // The lasting one's: written (synced), or forgotten.
  Status RecordLasting(const std::string& key, const nlohmann::json& record);
  Status ForgetLasting(const std::string& key);

 private:
  Registry() = default;
  Status OpenBoot(const std::string& state_dir, std::string_view boot_id);

  LmdbEnv lasting_env_;
  MDB_dbi lasting_db_ = 0;
  LmdbEnv env_;
  MDB_dbi db_ = 0;
  std::string swept_marker_;
  bool first_start_in_boot_ = false;
  int moved_ = 0;
};

}  // namespace strata::launcher
