// The node daemon's registries.
#include "launcher/node/registry.h"

#include <dirent.h>
#include <unistd.h>

#include "common/fs.h"
#include "common/log.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

Result<std::pair<LmdbEnv, MDB_dbi>> OpenEnv(const std::string& path, unsigned flags) {
  LmdbEnv::Options o;
  o.map_size = size_t{256} << 20;
  o.flags = flags;
  STRATA_ASSIGN_OR_RETURN(LmdbEnv env, LmdbEnv::Open(path, o));
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env, false));
  STRATA_ASSIGN_OR_RETURN(MDB_dbi db, txn.OpenDb("sandboxes", MDB_CREATE));
  STRATA_RETURN_IF_ERROR(txn.Commit());
  return std::pair<LmdbEnv, MDB_dbi>(std::move(env), db);
}

}  // namespace

Result<std::unique_ptr<Registry>> Registry::Open(const std::string& state_dir, std::string_view boot_id) {
  std::unique_ptr<Registry> r(new Registry());
  STRATA_RETURN_IF_ERROR(MakeDirs(state_dir, 0700));
  // One sync per commit, not two (the meta page's waits for the next
  // commit): a machine crash may undo the last commit, never corrupt it.
  STRATA_ASSIGN_OR_RETURN(auto lasting, OpenEnv(state_dir, MDB_NOMETASYNC));
  r->lasting_env_ = std::move(lasting.first);
  r->lasting_db_ = lasting.second;
  STRATA_RETURN_IF_ERROR(r->OpenBoot(state_dir, boot_id).Annotate("open this boot's registry in " + state_dir));
  return r;
}

Status Registry::OpenBoot(const std::string& state_dir, std::string_view boot_id) {
  const std::string boot(boot_id);
  if (boot.empty() || boot.find('/') != std::string::npos || boot == "." || boot == "..") {
    return Error(ENOENT, "no boot id (/proc/sys/kernel/random/boot_id)");
  }
  const std::string boots = JoinPath(state_dir, "boot");
  STRATA_RETURN_IF_ERROR(MakeDirs(boots, 0700));
  // An earlier boot's, unread: its sandboxes died with it (what they left
  // on disk, their uppers, is swept as unrecorded), and its unsynced
  // commits may have been cut anywhere.
  if (DIR* dir = ::opendir(boots.c_str())) {
    std::vector<std::string> old;
    while (dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name != "." && name != ".." && name != boot) old.push_back(name);
    }
    ::closedir(dir);
    for (const auto& name : old) {
      STRATA_LOG(kInfo) << "removing the registry of an earlier boot (" << name << ")";
      // Unread either way: what is left of it only takes space.
      if (Status s = RemoveTree(JoinPath(boots, name)); !s.ok()) STRATA_LOG(kWarn) << "remove the registry of an earlier boot: " << s.ToString();
    }
  }
  const std::string path = JoinPath(boots, boot);
  // Until a start in this boot has swept the uppers' snapshots (a start
  // that died before it leaves the next one to do it).
  swept_marker_ = JoinPath(path, "swept");
  first_start_in_boot_ = ::access(swept_marker_.c_str(), F_OK) != 0;
  STRATA_RETURN_IF_ERROR(MakeDirs(path, 0700));
  // Not synced: a crash of the daemon loses nothing (its writes are in the
  // page cache), and a crash of the machine ends every sandbox recorded here.
  STRATA_ASSIGN_OR_RETURN(auto current, OpenEnv(path, MDB_NOSYNC));
  env_ = std::move(current.first);
  db_ = current.second;
  // A daemon before 2026-12-04 kept its sandboxes in the lasting registry:
  // they move here, whether they still run or not: recovery decides. This
  // boot's copy is committed first, then the lasting one lets go of them; a
  // crash between leaves both, and the next start moves them again. (Not
  // synced: a crash of the machine ends them and this boot's registry.)
  std::vector<std::pair<std::string, std::string>> moving;
  {
    STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(lasting_env_, true));
    STRATA_ASSIGN_OR_RETURN(LmdbCursor cursor, LmdbCursor::Open(txn, lasting_db_));
    std::string_view k, v;
    while (true) {
      STRATA_ASSIGN_OR_RETURN(bool more, cursor.Next(&k, &v));
      if (!more) break;
      if (!k.starts_with("warm:")) moving.emplace_back(std::string(k), std::string(v));
    }
  }
  if (moving.empty()) return OkStatus();
  {
    STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
    for (const auto& [k, v] : moving) STRATA_RETURN_IF_ERROR(txn.Put(db_, k, v).status());
    STRATA_RETURN_IF_ERROR(txn.Commit());
  }
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(lasting_env_, false));
  for (const auto& [k, v] : moving) STRATA_RETURN_IF_ERROR(txn.Del(lasting_db_, k).status());
  STRATA_RETURN_IF_ERROR(txn.Commit());
  moved_ = static_cast<int>(moving.size());
  return OkStatus();
}

Status Registry::MarkSwept() {
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(swept_marker_, "", /*durable=*/false));
  first_start_in_boot_ = false;
  return OkStatus();
}

Result<std::vector<std::pair<std::string, json>>> Registry::All() {
  std::vector<std::pair<std::string, json>> records;
  for (auto [env, db] : {std::pair{&lasting_env_, lasting_db_}, std::pair{&env_, db_}}) {
    STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(*env, true));
    STRATA_ASSIGN_OR_RETURN(LmdbCursor cursor, LmdbCursor::Open(txn, db));
    std::string_view k, v;
    while (true) {
      STRATA_ASSIGN_OR_RETURN(bool more, cursor.Next(&k, &v));
      if (!more) break;
      records.emplace_back(std::string(k), json::parse(v, nullptr, false));
    }
  }
  return records;
}

Status Registry::Record(const std::string& id, const json& record) {
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
  STRATA_RETURN_IF_ERROR(txn.Put(db_, id, record.dump()).status());
  return txn.Commit();
}

Status Registry::Update(const std::string& id, const json& fields) {
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
  STRATA_ASSIGN_OR_RETURN(std::string_view v, txn.Get(db_, id));
  json record = json::parse(v, nullptr, false);
  if (!record.is_object()) return Error(EINVAL, "the record of " + id + " is not JSON");
  record.update(fields);
  STRATA_RETURN_IF_ERROR(txn.Put(db_, id, record.dump()).status());
  return txn.Commit();
}

Status Registry::Forget(const std::string& id) {
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
  STRATA_RETURN_IF_ERROR(txn.Del(db_, id).status());
  return txn.Commit();
}

Status Registry::Rename(const std::string& old_id, const std::string& id, const json& record) {
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(env_, false));
  STRATA_RETURN_IF_ERROR(txn.Put(db_, id, record.dump()).status());
  STRATA_RETURN_IF_ERROR(txn.Del(db_, old_id).status());
  return txn.Commit();
}

Status Registry::RecordLasting(const std::string& key, const json& record) {
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(lasting_env_, false));
  STRATA_RETURN_IF_ERROR(txn.Put(lasting_db_, key, record.dump()).status());
  return txn.Commit();
}

Status Registry::ForgetLasting(const std::string& key) {
  STRATA_ASSIGN_OR_RETURN(LmdbTxn txn, LmdbTxn::Begin(lasting_env_, false));
  STRATA_RETURN_IF_ERROR(txn.Del(lasting_db_, key).status());
  return txn.Commit();
}

}  // namespace strata::launcher
