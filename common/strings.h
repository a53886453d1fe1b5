// Small string helpers: concatenation, hex, splitting.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace strata {

namespace internal {
inline void AppendPiece(std::string& out, std::string_view s) { out.append(s); }
inline void AppendPiece(std::string& out, const char* s) { out.append(s); }
inline void AppendPiece(std::string& out, const std::string& s) { out.append(s); }
inline void AppendPiece(std::string& out, char c) { out.push_back(c); }
template <typename T>
  requires std::is_arithmetic_v<T>
void AppendPiece(std::string& out, T v) {
  out.append(std::to_string(v));
}
}  // namespace internal

// Concatenates strings, characters and numbers: StrCat("read ", path, " at ", off).
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (internal::AppendPiece(out, args), ...);
  return out;
}

std::string HexEncode(std::span<const uint8_t> bytes);
// Decodes lowercase or uppercase hex; nullopt on odd length or a non-hex digit.
std::optional<std::vector<uint8_t>> HexDecode(std::string_view hex);

// RFC 4648 base64 with padding. Decode returns nullopt on bad input.
std::string Base64Encode(std::string_view in);
std::optional<std::string> Base64Decode(std::string_view in);

// Splits on `sep`; empty pieces are kept.
std::vector<std::string> Split(std::string_view s, char sep);
std::string Join(const std::vector<std::string>& parts, std::string_view sep);
// "a, b or c" (for messages naming the choices there are).
std::string JoinOr(const std::vector<std::string>& parts);

// "1.5 MiB", "312 B".
std::string FormatBytes(uint64_t bytes);

// Quotes a string for messages when it holds spaces or odd bytes.
std::string Quote(std::string_view s);

// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code
// points past U+10FFFF). File names need not be; JSON strings must.
bool IsUtf8(std::string_view s);

}  // namespace strata
