// The little cryptography the daemons need, from GnuTLS (loaded on first
// use, like libmicrohttpd, which brings it anyway) and the kernel: SHA-256
// for API token hashes, random bytes for new tokens, and a comparison that
// takes the same time whatever the bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata {

// SHA-256 of `data`, lowercase hex (64 characters).
Result<std::string> Sha256Hex(std::string_view data);

// `n` bytes from the kernel's CSPRNG (getrandom(2)).
Result<std::string> RandomBytes(size_t n);

// Whether a == b, in time that depends only on their lengths.
bool ConstantTimeEqual(std::string_view a, std::string_view b);

}  // namespace strata
