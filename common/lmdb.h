// Owners for LMDB environments and transactions. A transaction that is not
// committed is aborted when its owner goes away, so an early return never
// leaves the writer lock held.
#pragma once

#include <lmdb.h>

#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace strata {

// An error for LMDB result `rc`: "<what>: <mdb_strerror>".
Status LmdbError(int rc, std::string_view what);

inline MDB_val ToVal(std::string_view s) { return MDB_val{s.size(), const_cast<char*>(s.data())}; }
inline std::string_view FromVal(const MDB_val& v) { return {static_cast<const char*>(v.mv_data), v.mv_size}; }

class LmdbEnv {
 public:
  struct Options {
    size_t map_size = size_t{1} << 30;
    unsigned max_dbs = 8;
    unsigned max_readers = 1024;
    unsigned flags = 0;  // MDB_NOSYNC etc.; MDB_NOTLS is always added
  };
  // Opens (creating if needed) the environment in directory `dir`.
  static Result<LmdbEnv> Open(const std::string& dir, const Options& options);

  LmdbEnv() = default;
  LmdbEnv(LmdbEnv&& other) noexcept : env_(std::exchange(other.env_, nullptr)) {}
  LmdbEnv& operator=(LmdbEnv&& other) noexcept;
  LmdbEnv(const LmdbEnv&) = delete;
  LmdbEnv& operator=(const LmdbEnv&) = delete;
  ~LmdbEnv();

  MDB_env* get() const { return env_; }
  Status Sync();

 private:
  MDB_env* env_ = nullptr;
};

class LmdbTxn {
 public:
  static Result<LmdbTxn> Begin(const LmdbEnv& env, bool read_only);

  LmdbTxn(LmdbTxn&& other) noexcept : txn_(std::exchange(other.txn_, nullptr)) {}
  LmdbTxn& operator=(LmdbTxn&& other) noexcept;
  LmdbTxn(const LmdbTxn&) = delete;
  LmdbTxn& operator=(const LmdbTxn&) = delete;
  ~LmdbTxn() { Abort(); }

  MDB_txn* get() const { return txn_; }
  Status Commit();
  void Abort();

  // Opens (with MDB_CREATE in write transactions) the named database.
  Result<MDB_dbi> OpenDb(const char* name, unsigned flags = 0);
  // The value under `key`, or ENOENT.
  Result<std::string_view> Get(MDB_dbi dbi, std::string_view key) const;
  // Returns false (and writes nothing) when MDB_NOOVERWRITE is given and the key exists.
  Result<bool> Put(MDB_dbi dbi, std::string_view key, std::string_view value, unsigned flags = 0);
  // Returns false when the key was absent.
  Result<bool> Del(MDB_dbi dbi, std::string_view key);

 private:
  explicit LmdbTxn(MDB_txn* txn) : txn_(txn) {}
  MDB_txn* txn_ = nullptr;
};

class LmdbCursor {
 public:
  static Result<LmdbCursor> Open(const LmdbTxn& txn, MDB_dbi dbi);
  LmdbCursor(LmdbCursor&& other) noexcept : cursor_(std::exchange(other.cursor_, nullptr)) {}
  LmdbCursor(const LmdbCursor&) = delete;
  LmdbCursor& operator=(const LmdbCursor&) = delete;
  LmdbCursor& operator=(LmdbCursor&&) = delete;
  ~LmdbCursor();

  // The next entry in key order, the first on the first call (LMDB's
  // MDB_NEXT on a cursor not yet placed); false at the end.
  Result<bool> Next(std::string_view* key, std::string_view* value);

 private:
  explicit LmdbCursor(MDB_cursor* c) : cursor_(c) {}
  MDB_cursor* cursor_ = nullptr;
};

}  // namespace strata
