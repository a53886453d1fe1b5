// Chunk objects: raw or zstd, told apart by checking; corrupt is never data.
#include "cache/chunk_codec.h"

#include <gtest/gtest.h>

#include "tests/testing/test_util.h"

namespace strata::cache {
namespace {

using testing::RandomBytes;

// Compressible, but not trivially: text-like bytes.
std::string Text(size_t n, uint64_t seed) {
  std::string random = RandomBytes(n / 8 + 1, seed);
  std::string out;
  static const char* kWords[] = {"import ", "def ", "return ", "self", ".value", "(x)", "\n    ", "# note\n"};
  for (size_t i = 0; out.size() < n; ++i) out += kWords[static_cast<unsigned char>(random[i % random.size()]) % 8];
  out.resize(n);
  return out;
}

TEST(ChunkCodecTest, ParsesCompressionSettings) {
  ASSERT_OK_AND_ASSIGN(Compression none, ParseCompression("none"));
  EXPECT_FALSE(none.zstd);
  ASSERT_OK_AND_ASSIGN(Compression def, ParseCompression("zstd"));
  EXPECT_EQ(def, (Compression{true, 1}));
  ASSERT_OK_AND_ASSIGN(Compression nine, ParseCompression("zstd:9"));
  EXPECT_EQ(nine.ToString(), "zstd:9");
  for (const char* bad : {"", "gzip", "zstd:", "zstd:0", "zstd:20", "zstd:3x", "zstd:-1", "ZSTD"}) {
    auto c = ParseCompression(bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.status().code(), EINVAL);
    EXPECT_NE(c.status().message().find("zstd:LEVEL"), std::string::npos);
  }
}

TEST(ChunkCodecTest, CompressibleChunksRoundTripAsFramesUnderTheirRawName) {
  std::string raw = Text(1 << 20, 1);
  Digest128 id = HashBytes(raw);
  auto packed = CompressChunk(raw, Compression{});
  ASSERT_TRUE(packed.has_value());
  EXPECT_LT(packed->size(), raw.size() / 2);
  ASSERT_OK_AND_ASSIGN(DecodedChunk chunk, DecodeChunk(id, *packed, raw.size()));
  EXPECT_TRUE(chunk.compressed);
  EXPECT_EQ(chunk.bytes, raw);
  EXPECT_EQ(chunk.stored_size, packed->size());
  // Size unknown: still decoded.
  ASSERT_OK_AND_ASSIGN(DecodedChunk unsized, DecodeChunk(id, *packed));
  EXPECT_EQ(unsized.bytes, raw);
}

TEST(ChunkCodecTest, IncompressibleAndTinyChunksStayRaw) {
  EXPECT_FALSE(CompressChunk(RandomBytes(1 << 20, 2), Compression{}).has_value());
  EXPECT_FALSE(CompressChunk("short", Compression{}).has_value());
  EXPECT_FALSE(CompressChunk(Text(1 << 16, 3), Compression{false, 0}).has_value());
  std::string raw = RandomBytes(70000, 4);
  ASSERT_OK_AND_ASSIGN(DecodedChunk chunk, DecodeChunk(HashBytes(raw), raw, raw.size()));
  EXPECT_FALSE(chunk.compressed);
  EXPECT_EQ(chunk.bytes, raw);
}

TEST(ChunkCodecTest, ARawChunkThatLooksLikeAFrameIsStillItself) {
  // A chunk that is itself a zstd frame (a .zst file in a layer): stored
  // raw, its bytes decode to something else, and it must come back as is.
  std::string inner = Text(100000, 5);
  std::string raw = *CompressChunk(inner, Compression{});
  ASSERT_OK_AND_ASSIGN(DecodedChunk chunk, DecodeChunk(HashBytes(raw), raw, raw.size()));
  EXPECT_FALSE(chunk.compressed);
  EXPECT_EQ(chunk.bytes, raw);
  // And the same bytes, compressed again, decode to the frame.
  std::string twice = *CompressChunk(raw + raw, Compression{});
  ASSERT_OK_AND_ASSIGN(DecodedChunk again, DecodeChunk(HashBytes(raw + raw), twice));
  EXPECT_EQ(again.bytes, raw + raw);
}

TEST(ChunkCodecTest, AFlippedByteInAFrameIsCorruptNotData) {
  std::string raw = Text(1 << 18, 6);
  Digest128 id = HashBytes(raw);
  std::string packed = *CompressChunk(raw, Compression{});
  for (size_t at : {size_t{5}, packed.size() / 2, packed.size() - 1}) {
    std::string bad = packed;
    bad[at] ^= 0x20;
    auto chunk = DecodeChunk(id, bad, raw.size());
    ASSERT_FALSE(chunk.ok()) << at;
    EXPECT_EQ(chunk.status().code(), EBADMSG);
    EXPECT_NE(chunk.status().message().find(id.Hex()), std::string::npos);
  }
  // Truncated, or with bytes after the frame.
  EXPECT_EQ(DecodeChunk(id, packed.substr(0, packed.size() - 3)).status().code(), EBADMSG);
  EXPECT_EQ(DecodeChunk(id, packed + "x").status().code(), EBADMSG);
  // Raw bytes of the wrong chunk.
  EXPECT_EQ(DecodeChunk(id, RandomBytes(100, 7)).status().code(), EBADMSG);
}

TEST(ChunkCodecTest, TheManifestSizeIsEnforcedBeforeAllocating) {
  std::string raw = Text(1 << 20, 8);
  Digest128 id = HashBytes(raw);
  std::string packed = *CompressChunk(raw, Compression{});
  // A frame that claims more (or less) than the extent holds is refused.
  EXPECT_EQ(DecodeChunk(id, packed, 4096).status().code(), EBADMSG);
  EXPECT_EQ(DecodeChunk(id, packed, raw.size() + 1).status().code(), EBADMSG);
  // A raw object of the right name but the wrong size: the manifest disagrees.
  EXPECT_EQ(DecodeChunk(id, raw, raw.size() - 1).status().code(), EBADMSG);
}

}  // namespace
}  // namespace strata::cache
