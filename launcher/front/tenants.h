// Tenants of the node API: the tokens file (one line per tenant: its name,
// the SHA-256 of its token, its limits), authentication of a bearer token
// in constant time, and the per-tenant creation rate. docs/api.md
// ("Tenants and tokens") describes the file.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::launcher {

// The header a gateway's call names its caller's tenant in (lowercase, as
// HttpServer gives request headers).
inline constexpr const char* kTenantHeader = "x-strata-tenant";


struct TenantLimits {
  int64_t max_sandboxes = 0;        // at once; 0: no limit
  double creates_per_second = 0;    // sustained; bursts of up to max(1, rate); 0: no limit
  std::vector<std::string> stores;  // store URLs it may use besides the daemon's --store list
  std::vector<std::string> layers;  // fnmatch patterns of layer names it may use; empty: any
  bool net_host = false;            // may ask for --net host
  // Tag names it may publish snapshots under (fnmatch on NAME of
  // NAME:VERSION); empty: it may not publish. Kept apart from `layers`:
  // using a shared tag is not moving it.
  std::vector<std::string> publish;
  // A cluster gateway's credential, not a tenant: its calls act for the
  // tenant its X-Strata-Tenant header names (or, without one, for the
  // operator whose call the gateway passes on). docs/api.md, "Gateways".
  bool gateway = false;
};

struct Tenant {
  std::string name;
  std::string token_sha256;  // lowercase hex
  TenantLimits limits;
};

// "NAME sha256:HEX [max_sandboxes=N] [creates_per_s=R] [stores=URL,...]
// [layers=PATTERN,...] [publish=PATTERN,...] [net_host=yes] [gateway=yes]"; '#' starts a
// comment line.
Result<Tenant> ParseTenantLine(std::string_view line);
std::string FormatTenantLine(const Tenant& tenant);

// Reads a tokens file. It must be a regular file that neither group nor
// others may read or write (else EACCES: the daemon refuses it).
Result<std::vector<Tenant>> LoadTokensFile(const std::string& path);
// Reads today's replaced --token-file (its first line is the token itself)
// as the one tenant "default", without limits.
Result<std::vector<Tenant>> LoadLegacyTokenFile(const std::string& path);

// A new random token ("st_" and 64 hex digits).
Result<std::string> NewToken();

// `launcher token new` and `revoke`: rewrite the file atomically, 0600
// (created when missing). Adding a name that exists is EEXIST; revoking one
// that does not is ENOENT.
Status AddTenant(const std::string& path, const Tenant& tenant);
Status RevokeTenant(const std::string& path, const std::string& name);

// The tenants the daemon knows now; Replace() swaps in a reread file
// without touching callers in flight. Thread-safe.
class TenantTable {
 public:
  void Replace(std::vector<Tenant> tenants);
  // The tenant whose token this is, or nullptr. Hashes the token and
  // compares it with every tenant's hash, all of them, in constant time.
  std::shared_ptr<const Tenant> Authenticate(std::string_view token) const;
  size_t size() const;
  // The tenant of an "Authorization: Bearer <token>" header's token (the
  // header's value, nullptr when there is none): ENOKEY without a bearer
  // token, EKEYREJECTED for one no tenant has; `who` starts the message.
  Result<std::shared_ptr<const Tenant>> FromAuthorization(const std::string* header, std::string_view who) const;
  // The tenant of that name, or nullptr.
  std::shared_ptr<const Tenant> Find(std::string_view name) const;

  // Takes `n` creations from the tenant's rate budget; returns how many it
  // got (0..n). Rate state is kept by name across Replace().
  int TakeCreations(const Tenant& tenant, int n);

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const Tenant>> tenants_;
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point last;
    bool started = false;
  };
  std::map<std::string, Bucket> buckets_;
};

// Whether a layer REF ("name:version", "name@digest", or a digest) is one
// the limits allow: by its name against the patterns; a bare digest only
// when there are no patterns (it names no name to check).
bool LayerAllowed(const TenantLimits& limits, const std::string& ref);
// Whether a snapshot tag ("NAME:VERSION") is one the tenant may publish.
bool PublishAllowed(const TenantLimits& limits, const std::string& tag);

}  // namespace strata::launcher
