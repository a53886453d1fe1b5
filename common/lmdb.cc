// LMDB owners.
#include "common/lmdb.h"

#include "common/strings.h"

namespace strata {

Status LmdbError(int rc, std::string_view what) {
  int code = rc > 0 ? rc : EIO;  // LMDB's own codes are negative
  if (rc == MDB_MAP_FULL) code = ENOSPC;
  if (rc == MDB_NOTFOUND) code = ENOENT;
  return Error(code, StrCat(what, ": ", mdb_strerror(rc)));
}

Result<LmdbEnv> LmdbEnv::Open(const std::string& dir, const Options& options) {
  LmdbEnv env;
  int rc = mdb_env_create(&env.env_);
  if (rc != 0) return LmdbError(rc, "create LMDB environment");
  if ((rc = mdb_env_set_mapsize(env.env_, options.map_size)) != 0) return LmdbError(rc, "set LMDB map size");
  if ((rc = mdb_env_set_maxdbs(env.env_, options.max_dbs)) != 0) return LmdbError(rc, "set LMDB max dbs");
  if ((rc = mdb_env_set_maxreaders(env.env_, options.max_readers)) != 0) return LmdbError(rc, "set LMDB max readers");
  if ((rc = mdb_env_open(env.env_, dir.c_str(), options.flags | MDB_NOTLS, 0644)) != 0) {
    return LmdbError(rc, StrCat("open LMDB index ", dir));
  }
  return env;
}

LmdbEnv& LmdbEnv::operator=(LmdbEnv&& other) noexcept {
  if (this != &other) {
    if (env_) mdb_env_close(env_);
    env_ = std::exchange(other.env_, nullptr);
  }
  return *this;
}

LmdbEnv::~LmdbEnv() {
  if (env_) mdb_env_close(env_);
}

Status LmdbEnv::Sync() {
  int rc = mdb_env_sync(env_, 1);
  return rc == 0 ? OkStatus() : LmdbError(rc, "sync LMDB index");
}

Result<LmdbTxn> LmdbTxn::Begin(const LmdbEnv& env, bool read_only) {
  MDB_txn* txn = nullptr;
  int rc = mdb_txn_begin(env.get(), nullptr, read_only ? MDB_RDONLY : 0, &txn);
  if (rc != 0) return LmdbError(rc, read_only ? "begin LMDB read transaction" : "begin LMDB write transaction");
  return LmdbTxn(txn);
}

LmdbTxn& LmdbTxn::operator=(LmdbTxn&& other) noexcept {
  if (this != &other) {
    Abort();
    txn_ = std::exchange(other.txn_, nullptr);
  }
  return *this;
}

Status LmdbTxn::Commit() {
  int rc = mdb_txn_commit(std::exchange(txn_, nullptr));
  return rc == 0 ? OkStatus() : LmdbError(rc, "commit LMDB transaction");
}

void LmdbTxn::Abort() {
  if (txn_) mdb_txn_abort(std::exchange(txn_, nullptr));
}

Result<MDB_dbi> LmdbTxn::OpenDb(const char* name, unsigned flags) {
  MDB_dbi dbi;
  int rc = mdb_dbi_open(txn_, name, flags, &dbi);
  if (rc != 0) return LmdbError(rc, StrCat("open LMDB database ", name));
  return dbi;
}

Result<std::string_view> LmdbTxn::Get(MDB_dbi dbi, std::string_view key) const {
  MDB_val k = ToVal(key), v;
  int rc = mdb_get(txn_, dbi, &k, &v);
  if (rc != 0) return LmdbError(rc, "LMDB get");
  return FromVal(v);
}

Result<bool> LmdbTxn::Put(MDB_dbi dbi, std::string_view key, std::string_view value, unsigned flags) {
  MDB_val k = ToVal(key), v = ToVal(value);
  int rc = mdb_put(txn_, dbi, &k, &v, flags);
  if (rc == MDB_KEYEXIST) return false;
  if (rc != 0) return LmdbError(rc, "LMDB put");
  return true;
}

Result<bool> LmdbTxn::Del(MDB_dbi dbi, std::string_view key) {
  MDB_val k = ToVal(key);
  int rc = mdb_del(txn_, dbi, &k, nullptr);
  if (rc == MDB_NOTFOUND) return false;
  if (rc != 0) return LmdbError(rc, "LMDB delete");
  return true;
}

Result<LmdbCursor> LmdbCursor::Open(const LmdbTxn& txn, MDB_dbi dbi) {
  MDB_cursor* c = nullptr;
  int rc = mdb_cursor_open(txn.get(), dbi, &c);
  if (rc != 0) return LmdbError(rc, "open LMDB cursor");
  return LmdbCursor(c);
}

LmdbCursor::~LmdbCursor() {
  if (cursor_) mdb_cursor_close(cursor_);
}

Result<bool> LmdbCursor::Next(std::string_view* key, std::string_view* value) {
  MDB_val k, v;
  int rc = mdb_cursor_get(cursor_, &k, &v, MDB_NEXT);
  if (rc == MDB_NOTFOUND) return false;
  if (rc != 0) return LmdbError(rc, "LMDB cursor");
  *key = FromVal(k);
  *value = FromVal(v);
  return true;
}

}  // namespace strata
