#include "common/hash.h"

#include <gtest/gtest.h>

#include "common/strings.h"

namespace strata {
namespace {

TEST(HashTest, MatchesXxh128sumOfKnownInput) {
  // `printf abc | xxh128sum` prints 06b05ab6733a618578af5f94892f3950.
  EXPECT_EQ(HashBytes(std::string_view("abc")).Hex(), "06b05ab6733a618578af5f94892f3950");
  // Empty input: 99aa06d3014798d86001c324468d497f.
  EXPECT_EQ(HashBytes(std::string_view("")).Hex(), "99aa06d3014798d86001c324468d497f");
}

TEST(HashTest, IncrementalEqualsOneShot) {
  std::string data(100000, 'x');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  Hasher h;
  h.Update(std::string_view(data).substr(0, 12345));
  h.Update(std::string_view(data).substr(12345));
  EXPECT_EQ(h.Finish(), HashBytes(data));
}

TEST(HashTest, HexRoundTrip) {
  Digest128 d = HashBytes(std::string_view("strata"));
  auto back = Digest128::FromHex(d.Hex());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(*back, d);
  EXPECT_FALSE(Digest128::FromHex("xyz").has_value());
  EXPECT_FALSE(Digest128::FromHex(std::string(32, 'g')).has_value());
}

TEST(StringsTest, Helpers) {
  EXPECT_EQ(StrCat("a", 1, '/', std::string("b"), 2u), "a1/b2");
  EXPECT_EQ(Split("a//b", '/'), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(Quote("plain"), "plain");
  EXPECT_EQ(Quote("two words"), "\"two words\"");
  EXPECT_EQ(Quote(std::string_view("\x01", 1)), "\"\\x01\"");
  for (std::string raw : {std::string(""), std::string("f"), std::string("fo"), std::string("foo"), std::string("\xff\x00\x10", 3)}) {
    auto back = Base64Decode(Base64Encode(raw));
    ASSERT_TRUE(back.has_value());
    EXPECT_EQ(*back, raw);
  }
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_FALSE(Base64Decode("Zm9").has_value());
  EXPECT_FALSE(Base64Decode("Z=9v").has_value());
}

TEST(StringsTest, IsUtf8) {
  EXPECT_TRUE(IsUtf8(""));
  EXPECT_TRUE(IsUtf8("plain/name.txt"));
  EXPECT_TRUE(IsUtf8("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x90\x8d"));  // é € and a snake
  EXPECT_FALSE(IsUtf8("\xff"));
  EXPECT_FALSE(IsUtf8("a\xc3"));              // cut short
  EXPECT_FALSE(IsUtf8("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(IsUtf8("\xed\xa0\x80"));      // a surrogate
  EXPECT_FALSE(IsUtf8("\xf4\x90\x80\x80"));  // past U+10FFFF
  EXPECT_FALSE(IsUtf8("\xc3("));
}

}  // namespace
}  // namespace strata
