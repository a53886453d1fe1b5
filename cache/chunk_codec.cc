// Chunk objects: raw bytes or one zstd frame, told apart by checking.
#include "cache/chunk_codec.h"

#include <zstd.h>

#include <cstring>

#include "common/strings.h"

namespace strata::cache {
namespace {

constexpr unsigned char kZstdMagic[4] = {0x28, 0xB5, 0x2F, 0xFD};  // ZSTD_MAGICNUMBER, little-endian

struct CCtxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DCtxDeleter {
  void operator()(ZSTD_DCtx* d) const { ZSTD_freeDCtx(d); }
};

ZSTD_CCtx* ThreadCCtx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CCtxDeleter> ctx(ZSTD_createCCtx());
  return ctx.get();
}
ZSTD_DCtx* ThreadDCtx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DCtxDeleter> ctx(ZSTD_createDCtx());
  return ctx.get();
}

bool HasZstdMagic(std::string_view s) { return s.size() >= 4 && std::memcmp(s.data(), kZstdMagic, 4) == 0; }

// The frame's content, when `stored` is exactly one zstd frame that says
// how much it holds (ours always do): `want` bytes, or when `want` is 0 at
// most kMaxChunkObject.
std::optional<std::string> Unzstd(std::string_view stored, uint64_t want) {
  unsigned long long size = ZSTD_getFrameContentSize(stored.data(), stored.size());
  if (size == ZSTD_CONTENTSIZE_UNKNOWN || size == ZSTD_CONTENTSIZE_ERROR) return std::nullopt;
  if (want ? size != want : size > kMaxChunkObject) return std::nullopt;
  size_t frame = ZSTD_findFrameCompressedSize(stored.data(), stored.size());
  if (ZSTD_isError(frame) || frame != stored.size()) return std::nullopt;
  std::string out(static_cast<size_t>(size), '\0');
  size_t n = ZSTD_decompressDCtx(ThreadDCtx(), out.data(), out.size(), stored.data(), stored.size());
  if (ZSTD_isError(n) || n != out.size()) return std::nullopt;
  return out;
}

}  // namespace

std::string Compression::ToString() const { return zstd ? StrCat("zstd:", level) : "none"; }

Result<Compression> ParseCompression(std::string_view text) {
  if (text == "none") return Compression{false, 0};
  if (text == "zstd") return Compression{};
  if (text.starts_with("zstd:")) {
    std::string_view level = text.substr(5);
    int v = 0;
    bool digits = !level.empty() && level.size() <= 2;
    for (char c : level) {
      if (c < '0' || c > '9') digits = false;
      else v = v * 10 + (c - '0');
    }
    if (digits && v >= 1 && v <= 19) return Compression{true, v};
  }
  return Error(EINVAL, StrCat("compression ", Quote(text), ": expected none, zstd or zstd:LEVEL with LEVEL 1-19"));
}

std::optional<std::string> CompressChunk(std::string_view raw, const Compression& compression) {
  if (!compression.zstd || raw.size() < 64) return std::nullopt;
  std::string out(ZSTD_compressBound(raw.size()), '\0');
  size_t n = ZSTD_compressCCtx(ThreadCCtx(), out.data(), out.size(), raw.data(), raw.size(), compression.level);
  if (ZSTD_isError(n) || n > raw.size() - raw.size() / 32) return std::nullopt;
  out.resize(n);
  return out;
}

Result<DecodedChunk> DecodeChunk(const Digest128& id, std::string stored, uint64_t size) {
  DecodedChunk chunk;
  chunk.stored_size = stored.size();
  if (HasZstdMagic(stored)) {
    if (auto raw = Unzstd(stored, size); raw && HashBytes(*raw) == id) {
      chunk.bytes = std::move(*raw);
      chunk.compressed = true;
      return chunk;
    }
  }
  Digest128 actual = HashBytes(stored);
  if (actual != id) {
    return Error(EBADMSG, StrCat("chunk ", id.Hex(), " is corrupt: its ", stored.size(), " stored bytes hash to ",
                                 actual.Hex(), HasZstdMagic(stored) ? " and do not decode to it as zstd" : "",
                                 "; bytes discarded"));
  }
  if (size && stored.size() != size) {
    return Error(EBADMSG, StrCat("chunk ", id.Hex(), " holds ", stored.size(), " bytes, its manifest says ", size));
  }
  chunk.bytes = std::move(stored);
  return chunk;
}

Result<DecodedChunk> GetChunk(ObjectStore& store, const Digest128& id, uint64_t size) {
  auto data = store.Get(ChunkKey(id));
  if (!data.ok()) return std::move(data).status().Annotate(StrCat("fetch chunk ", id.Hex(), " from ", store.url()));
  auto chunk = DecodeChunk(id, std::move(*data), size);
  if (!chunk.ok()) return std::move(chunk).status().Annotate(StrCat("fetch from ", store.url()));
  return chunk;
}

}  // namespace strata::cache
