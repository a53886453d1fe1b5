#include "common/lmdb.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/testing/test_util.h"

namespace strata {
namespace {

using testing::MakeTempDir;

// Every entry of `db`, in the cursor's order.
std::vector<std::pair<std::string, std::string>> All(const LmdbEnv& env, MDB_dbi db) {
  std::vector<std::pair<std::string, std::string>> out;
  auto txn = LmdbTxn::Begin(env, true);
  EXPECT_TRUE(txn.ok()) << txn.status().ToString();
  if (!txn.ok()) return out;
  auto cursor = LmdbCursor::Open(*txn, db);
  EXPECT_TRUE(cursor.ok()) << cursor.status().ToString();
  if (!cursor.ok()) return out;
  LmdbCursor moved = std::move(*cursor);  // a moved cursor goes on where it was
  std::string_view k, v;
  for (;;) {
    auto more = moved.Next(&k, &v);
    EXPECT_TRUE(more.ok()) << more.status().ToString();
    if (!more.ok() || !*more) break;
    out.emplace_back(k, v);
  }
  // At the end it stays at the end.
  auto again = moved.Next(&k, &v);
  EXPECT_TRUE(again.ok() && !*again);
  return out;
}

TEST(LmdbTest, ACursorWalksEveryEntryInKeyOrderOnce) {
  TempDir dir = MakeTempDir();
  ASSERT_OK_AND_ASSIGN(LmdbEnv env, LmdbEnv::Open(dir.path(), {.map_size = size_t{16} << 20}));
  MDB_dbi db;
  {
    ASSERT_OK_AND_ASSIGN(LmdbTxn txn, LmdbTxn::Begin(env, false));
    ASSERT_OK_AND_ASSIGN(db, txn.OpenDb("t", MDB_CREATE));
    ASSERT_OK(txn.Commit());
  }
  EXPECT_TRUE(All(env, db).empty());
  {
    ASSERT_OK_AND_ASSIGN(LmdbTxn txn, LmdbTxn::Begin(env, false));
    for (const char* key : {"b", "c", "a"}) ASSERT_OK(txn.Put(db, key, std::string("v") + key).status());
    ASSERT_OK(txn.Commit());
  }
  std::vector<std::pair<std::string, std::string>> want = {{"a", "va"}, {"b", "vb"}, {"c", "vc"}};
  EXPECT_EQ(All(env, db), want);
}

}  // namespace
}  // namespace strata
