// Digest128: the XXH3-128 content names of chunks, metadata images and
// layers. Printed as 32 lowercase hex digits in XXH128's canonical
// (big-endian) byte order, the same text `xxh128sum` prints.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace strata {

struct Digest128 {
  uint64_t high = 0;
  uint64_t low = 0;

  std::string Hex() const;
  // Parses 32 hex digits; nullopt for anything else.
  static std::optional<Digest128> FromHex(std::string_view hex);
  // Canonical big-endian bytes.
  void ToBytes(uint8_t out[16]) const;
  static Digest128 FromBytes(const uint8_t in[16]);

  friend bool operator==(const Digest128&, const Digest128&) = default;
  friend auto operator<=>(const Digest128&, const Digest128&) = default;
};

Digest128 HashBytes(std::span<const char> data);
inline Digest128 HashBytes(std::string_view data) {
  return HashBytes(std::span<const char>(data.data(), data.size()));
}
inline Digest128 HashBytes(const std::string& data) { return HashBytes(std::string_view(data)); }

// Incremental XXH3-128 for data that arrives in pieces.
class Hasher {
 public:
  Hasher();
  ~Hasher();
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void Update(std::span<const char> data);
  void Update(std::string_view data) { Update(std::span<const char>(data.data(), data.size())); }
  void Update(const std::string& data) { Update(std::string_view(data)); }
  Digest128 Finish() const;

 private:
  void* state_;  // XXH3_state_t, kept out of the header
};

struct Digest128Hash {
  size_t operator()(const Digest128& d) const { return static_cast<size_t>(d.low ^ (d.high * 0x9e3779b97f4a7c15ULL)); }
};

}  // namespace strata
