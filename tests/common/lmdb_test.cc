#include "common/lmdb.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "common/strings.h"
#include "tests/testing/test_util.h"

namespace strata {
namespace {

using testing::MakeTempDir;

// Every entry of `db`, in the cursor's order; the cursor is moved after its
// first entry, and asked once more at the end.
std::vector<std::pair<std::string, std::string>> All(const LmdbEnv& env, MDB_dbi db) {
  std::vector<std::pair<std::string, std::string>> out;
  auto txn = LmdbTxn::Begin(env, true);
  EXPECT_TRUE(txn.ok()) << txn.status().ToString();
  if (!txn.ok()) return out;
  auto opened = LmdbCursor::Open(*txn, db);
  EXPECT_TRUE(opened.ok()) << opened.status().ToString();
  if (!opened.ok()) return out;
  std::string_view k, v;
  auto first = opened->Next(&k, &v);
  EXPECT_TRUE(first.ok()) << first.status().ToString();
  if (!first.ok() || !*first) return out;
  out.emplace_back(k, v);
  LmdbCursor cursor = std::move(*opened);  // goes on where it was
  for (;;) {
    auto more = cursor.Next(&k, &v);
    EXPECT_TRUE(more.ok()) << more.status().ToString();
    if (!more.ok() || !*more) break;
    out.emplace_back(k, v);
  }
  auto again = cursor.Next(&k, &v);  // at the end it stays at the end
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
  // Enough entries for many pages, put in an order that is not the keys'.
  std::vector<std::pair<std::string, std::string>> want;
  for (int i = 0; i < 2000; ++i) {
    want.emplace_back(StrCat("key", 100000 + i), std::string(100, static_cast<char>('a' + i % 26)));
  }
  {
    ASSERT_OK_AND_ASSIGN(LmdbTxn txn, LmdbTxn::Begin(env, false));
    for (size_t i = 0; i < want.size(); ++i) {
      const auto& [k, v] = want[(i * 7) % want.size()];  // 7 and 2000 are coprime: each once
      ASSERT_OK(txn.Put(db, k, v).status());
    }
    ASSERT_OK(txn.Commit());
  }
  EXPECT_EQ(All(env, db), want);
}

}  // namespace
}  // namespace strata
