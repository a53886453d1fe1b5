// SHA-256 through GnuTLS (dlopen), random bytes through getrandom(2).
#include "common/crypto.h"

#include <gnutls/crypto.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "common/dynlib.h"
#include "common/strings.h"

namespace strata {

namespace {

struct GnutlsApi {
  Status status;
  decltype(&gnutls_hash_fast) hash_fast = nullptr;
};

const GnutlsApi& Gnutls() {
  static const GnutlsApi api = [] {
    GnutlsApi a;
    auto lib = DynamicLibrary::Open(STRATA_GNUTLS_SONAME, "libgnutls30");
    if (!lib.ok()) {
      a.status = lib.status();
      return a;
    }
    a.status = lib->Resolve(a.hash_fast, "gnutls_hash_fast");
    return a;
  }();
  return api;
}

}  // namespace

Result<std::string> Sha256Hex(std::string_view data) {
  STRATA_RETURN_IF_ERROR(Gnutls().status.Annotate("sha256"));
  uint8_t out[32];
  if (Gnutls().hash_fast(GNUTLS_DIG_SHA256, data.data(), data.size(), out) < 0) return Error(EIO, "sha256: GnuTLS failed");
  return HexEncode(out);
}

Result<std::string> RandomBytes(size_t n) {
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError(errno, "getrandom");
    got += static_cast<size_t>(r);
  }
  return out;
}

bool ConstantTimeEqual(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace strata
