// XXH3-128 digests.
#include "common/hash.h"

#include <xxhash.h>

#include <cstring>

#include "common/strings.h"

namespace strata {

void Digest128::ToBytes(uint8_t out[16]) const {
  XXH128_hash_t h{low, high};
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  std::memcpy(out, c.digest, 16);
}

Digest128 Digest128::FromBytes(const uint8_t in[16]) {
  XXH128_canonical_t c;
  std::memcpy(c.digest, in, 16);
  XXH128_hash_t h = XXH128_hashFromCanonical(&c);
  return Digest128{h.high64, h.low64};
}

std::string Digest128::Hex() const {
  uint8_t bytes[16];
  ToBytes(bytes);
  return HexEncode(bytes);
}

std::optional<Digest128> Digest128::FromHex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  uint64_t half[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    char c = hex[i];
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (v < 0) return std::nullopt;
    half[i / 16] = half[i / 16] << 4 | static_cast<uint64_t>(v);
  }
  return Digest128{half[0], half[1]};
}

Digest128 HashBytes(std::span<const char> data) {
  XXH128_hash_t h = XXH3_128bits(data.data(), data.size());
  return Digest128{h.high64, h.low64};
}

Hasher::Hasher() : state_(XXH3_createState()) { XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_)); }
Hasher::~Hasher() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Hasher::Update(std::span<const char> data) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data.data(), data.size());
}

Digest128 Hasher::Finish() const {
  XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  return Digest128{h.high64, h.low64};
}

}  // namespace strata
