// Catalog: manifests, tags, stacks, access lists and leases in a store.
#include "cache/catalog.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <tuple>
#include <cstring>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/strings.h"

namespace strata::cache {

using nlohmann::json;

std::string LayerRef::ToString() const { return is_digest() ? digest.Hex() : name + ":" + version; }

Status ValidateTagPart(std::string_view what, std::string_view value) {
  bool ok = !value.empty() && value.size() <= 128 && value.front() != '.' && value.front() != '-';
  for (char c : value) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) ok = false;
  }
  if (!ok) {
    return Error(EINVAL, StrCat(what, " ", Quote(value), ": use 1-128 of A-Z a-z 0-9 . _ - (not starting with . or -)"));
  }
  return OkStatus();
}

Result<LayerRef> ParseTag(std::string_view text) {
  size_t colon = text.find(':');
  if (colon == std::string_view::npos) {
    return Error(EINVAL, StrCat("tag ", Quote(text), ": expected NAME:VERSION"));
  }
  LayerRef ref;
  ref.name = std::string(text.substr(0, colon));
  ref.version = std::string(text.substr(colon + 1));
  STRATA_RETURN_IF_ERROR(ValidateTagPart("layer name", ref.name));
  STRATA_RETURN_IF_ERROR(ValidateTagPart("layer version", ref.version));
  return ref;
}

Result<LayerRef> ParseRef(std::string_view text) {
  if (text.find(':') == std::string_view::npos) {
    auto d = Digest128::FromHex(text);
    if (!d) return Error(EINVAL, StrCat("layer ", Quote(text), ": expected NAME:VERSION or a 32-hex-digit digest"));
    LayerRef ref;
    ref.digest = *d;
    return ref;
  }
  return ParseTag(text);
}

std::string Catalog::ManifestKey(const Digest128& digest) { return "layers/" + digest.Hex() + ".json"; }
std::string Catalog::AccessKey(const Digest128& digest) { return "layers/" + digest.Hex() + ".access"; }
std::string Catalog::TagKey(std::string_view name, std::string_view version) {
  return StrCat("tags/", name, "/", version);
}
std::string Catalog::LeaseKey(std::string_view node, const Digest128& digest) {
  return StrCat("leases/", node, "/", digest.Hex());
}

Result<Digest128> Catalog::Resolve(const LayerRef& ref) const {
  if (!ref.is_digest()) {
    STRATA_ASSIGN_OR_RETURN(TagRecord tag, GetTag(ref.name, ref.version));
    return tag.digest;
  }
  STRATA_ASSIGN_OR_RETURN(bool exists, HasManifest(ref.digest));
  if (!exists) return Error(ENOENT, StrCat("layer ", ref.digest.Hex(), ": no such layer in ", store_->url()));
  return ref.digest;
}

Result<Digest128> Catalog::Resolve(std::string_view text) const {
  STRATA_ASSIGN_OR_RETURN(LayerRef ref, ParseRef(text));
  return Resolve(ref);
}

Result<Manifest> Catalog::GetManifest(const Digest128& digest, std::string* text_out) const {
  auto text = store_->Get(ManifestKey(digest));
  if (!text.ok()) {
    if (text.status().code() == ENOENT) {
      return Error(ENOENT, StrCat("layer ", digest.Hex(), ": no manifest in ", store_->url()));
    }
    return text.status().Annotate(StrCat("read manifest of layer ", digest.Hex()));
  }
  if (HashBytes(*text) != digest) {
    return Error(EBADMSG, StrCat("layer ", digest.Hex(), ": manifest in ", store_->url(), " does not hash to its name"));
  }
  auto manifest = Manifest::FromJson(*text);
  if (!manifest.ok()) return manifest.status().Annotate(StrCat("layer ", digest.Hex()));
  if (text_out) *text_out = std::move(*text);
  return manifest;
}

namespace {

// Parsed manifests by digest: weak entries for those someone holds, and a
// short queue of the last ones asked for, which keeps them alive too.
struct ManifestMemo {
  std::mutex mu;
  std::unordered_map<Digest128, std::weak_ptr<const Manifest>, Digest128Hash> known;
  std::deque<std::shared_ptr<const Manifest>> recent;
};

ManifestMemo& Memo() {
  static ManifestMemo* memo = new ManifestMemo;  // never destroyed: used from any thread until exit
  return *memo;
}

}  // namespace

Result<std::shared_ptr<const Manifest>> Catalog::SharedManifest(const Digest128& digest) const {
  ManifestMemo& memo = Memo();
  {
    std::lock_guard lock(memo.mu);
    if (auto it = memo.known.find(digest); it != memo.known.end()) {
      if (auto m = it->second.lock()) return m;
    }
  }
  // Parsed outside the lock; two threads may both parse a new one.
  STRATA_ASSIGN_OR_RETURN(Manifest parsed, GetManifest(digest));
  auto m = std::make_shared<const Manifest>(std::move(parsed));
  std::lock_guard lock(memo.mu);
  auto& slot = memo.known[digest];
  if (auto held = slot.lock()) return held;
  slot = m;
  memo.recent.push_back(m);
  if (memo.recent.size() > kManifestsKept) memo.recent.pop_front();
  // Forget the entries nobody holds any more.
  if (memo.known.size() > 4 * kManifestsKept) std::erase_if(memo.known, [](const auto& e) { return e.second.expired(); });
  return m;
}

Result<bool> Catalog::HasManifest(const Digest128& digest) const { return store_->Exists(ManifestKey(digest)); }

Result<Digest128> Catalog::PutManifest(const Manifest& manifest) const {
  STRATA_RETURN_IF_ERROR(manifest.Validate());
  std::string text = manifest.ToJson();
  Digest128 digest = HashBytes(text);
  STRATA_RETURN_IF_ERROR(store_->Put(ManifestKey(digest), text));
  return digest;
}

namespace {

Result<TagRecord> ParseTagRecord(std::string_view name, std::string_view version, std::string_view text) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("digest") || !j["digest"].is_string()) {
    return Error(EINVAL, StrCat("tag ", name, ":", version, ": record is not valid JSON with a digest"));
  }
  auto digest = Digest128::FromHex(j["digest"].get<std::string>());
  if (!digest) return Error(EINVAL, StrCat("tag ", name, ":", version, ": digest is not 32 hex digits"));
  TagRecord r;
  r.name = std::string(name);
  r.version = std::string(version);
  r.digest = *digest;
  r.created = j.value("created", "");
  r.by = j.value("by", "");
  return r;
}

}  // namespace

Result<TagRecord> Catalog::GetTag(std::string_view name, std::string_view version) const {
  STRATA_RETURN_IF_ERROR(ValidateTagPart("layer name", name));
  STRATA_RETURN_IF_ERROR(ValidateTagPart("layer version", version));
  auto text = store_->Get(TagKey(name, version));
  if (!text.ok()) {
    if (text.status().code() == ENOENT) {
      return Error(ENOENT, StrCat("layer ", name, ":", version, ": no such tag in ", store_->url()));
    }
    return text.status().Annotate(StrCat("read tag ", name, ":", version));
  }
  return ParseTagRecord(name, version, *text);
}

Result<TagRecord> Catalog::SetTag(std::string_view name, std::string_view version, const Digest128& digest) const {
  STRATA_RETURN_IF_ERROR(ValidateTagPart("layer name", name));
  STRATA_RETURN_IF_ERROR(ValidateTagPart("layer version", version));
  STRATA_ASSIGN_OR_RETURN(bool exists, HasManifest(digest));
  if (!exists) {
    return Error(ENOENT, StrCat("tag ", name, ":", version, ": layer ", digest.Hex(), " has no manifest in ", store_->url()));
  }
  TagRecord r{std::string(name), std::string(version), digest, FormatTime(::time(nullptr)), WhoAmI()};
  json j = {{"digest", digest.Hex()}, {"created", r.created}, {"by", r.by}};
  STRATA_RETURN_IF_ERROR(store_->Put(TagKey(name, version), j.dump()));
  return r;
}

Status Catalog::DeleteTag(std::string_view name, std::string_view version) const {
  STRATA_RETURN_IF_ERROR(GetTag(name, version).status());
  return store_->Delete(TagKey(name, version));
}

Result<std::vector<TagRecord>> Catalog::ListTags(std::string_view name) const {
  if (!name.empty()) STRATA_RETURN_IF_ERROR(ValidateTagPart("layer name", name));
  STRATA_ASSIGN_OR_RETURN(auto objects, ListAll(*store_, name.empty() ? std::string("tags/") : StrCat("tags/", name, "/")));
  std::vector<TagRecord> tags;
  for (const auto& o : objects) {
    auto parts = Split(o.key, '/');
    if (parts.size() != 3) continue;
    auto text = store_->Get(o.key);
    if (!text.ok()) {
      if (text.status().code() == ENOENT) continue;  // removed while listing
      return text.status();
    }
    STRATA_ASSIGN_OR_RETURN(TagRecord r, ParseTagRecord(parts[1], parts[2], *text));
    tags.push_back(std::move(r));
  }
  std::sort(tags.begin(), tags.end(), [](const TagRecord& a, const TagRecord& b) {
    return std::tie(a.name, a.version) < std::tie(b.name, b.version);
  });
  return tags;
}

Result<std::vector<StackLayer>> Catalog::ResolveStack(const std::vector<std::string>& refs) const {
  if (refs.empty()) return Error(EINVAL, "layer stack: no layer given");
  std::vector<StackLayer> stack;
  for (const auto& text : refs) {
    STRATA_ASSIGN_OR_RETURN(Digest128 digest, Resolve(text));
    STRATA_ASSIGN_OR_RETURN(std::shared_ptr<const Manifest> manifest, SharedManifest(digest));
    if (manifest->kind == LayerKind::kDiff) {
      if (stack.empty()) {
        for (const auto& parent : manifest->parents) {
          auto parent_manifest = SharedManifest(parent);
          if (!parent_manifest.ok()) {
            return parent_manifest.status().Annotate(StrCat("layer ", text, ": parent ", parent.Hex()));
          }
          stack.push_back({parent, std::move(*parent_manifest)});
        }
      } else {
        bool match = stack.size() == manifest->parents.size();
        for (size_t i = 0; match && i < stack.size(); ++i) match = stack[i].digest == manifest->parents[i];
        if (!match) {
          std::vector<std::string> want, got;
          for (const auto& p : manifest->parents) want.push_back(p.Hex().substr(0, 12));
          for (const auto& l : stack) got.push_back(l.digest.Hex().substr(0, 12));
          return Error(EINVAL, StrCat("layer stack: diff ", text, " was made on [", Join(want, ", "),
                                      "] (bottom first) but the layers below it are [", Join(got, ", "),
                                      "]; name the diff alone to bring its parents"));
        }
      }
    }
    stack.push_back({digest, std::move(manifest)});
  }
  return stack;
}

Status Catalog::PutAccessList(const Digest128& digest, const std::vector<uint32_t>& extents) const {
  json j = {{"schema", 1}, {"extents", extents}};
  return store_->Put(AccessKey(digest), j.dump());
}

Result<std::vector<uint32_t>> Catalog::GetAccessList(const Digest128& digest) const {
  STRATA_ASSIGN_OR_RETURN(std::string text, store_->Get(AccessKey(digest)));
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("extents") || !j["extents"].is_array()) {
    return Error(EINVAL, StrCat("access list of layer ", digest.Hex(), ": not valid JSON"));
  }
  std::vector<uint32_t> out;
  for (const auto& e : j["extents"]) {
    if (!e.is_number_unsigned()) return Error(EINVAL, StrCat("access list of layer ", digest.Hex(), ": bad entry"));
    out.push_back(e.get<uint32_t>());
  }
  return out;
}

Result<StoreSettings> Catalog::GetSettings() const {
  StoreSettings settings;
  auto text = store_->Get(kSettingsKey);
  if (!text.ok()) {
    if (text.status().code() == ENOENT) return settings;
    return text.status().Annotate(StrCat("read ", kSettingsKey, " of ", store_->url()));
  }
  auto where = [&] { return StrCat(kSettingsKey, " of ", store_->url()); };
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error(EINVAL, StrCat(where(), ": not a JSON object"));
  if (j.contains("compress")) {
    if (!j["compress"].is_string()) return Error(EINVAL, StrCat(where(), ": \"compress\" must be a string"));
    auto c = ParseCompression(j["compress"].get<std::string>());
    if (!c.ok()) return c.status().Annotate(where());
    settings.compression = *c;
  }
  return settings;
}

Status Catalog::PutSettings(const StoreSettings& settings) const {
  json j = {{"compress", settings.compression.ToString()}};
  return store_->Put(kSettingsKey, j.dump(2) + "\n");
}

Status Catalog::PutLease(const Lease& lease) const {
  STRATA_RETURN_IF_ERROR(ValidateTagPart("node name", lease.node));
  json j = {{"expires", lease.expires}};
  return store_->Put(LeaseKey(lease.node, lease.digest), j.dump());
}

Status Catalog::DropLease(std::string_view node, const Digest128& digest) const {
  return store_->Delete(LeaseKey(node, digest));
}

Result<std::vector<Lease>> Catalog::ListLeases() const {
  STRATA_ASSIGN_OR_RETURN(auto objects, ListAll(*store_, "leases/"));
  std::vector<Lease> leases;
  for (const auto& o : objects) {
    auto parts = Split(o.key, '/');
    if (parts.size() != 3) continue;
    auto digest = Digest128::FromHex(parts[2]);
    if (!digest) continue;
    auto text = store_->Get(o.key);
    if (!text.ok()) {
      if (text.status().code() == ENOENT) continue;
      return text.status();
    }
    json j = json::parse(*text, nullptr, false);
    // An unreadable lease still protects its layer until a later run can read it.
    int64_t expires = j.is_object() && j.contains("expires") && j["expires"].is_number_integer()
                          ? j["expires"].get<int64_t>()
                          : INT64_MAX;
    leases.push_back({parts[1], *digest, expires});
  }
  return leases;
}

std::string FormatTime(int64_t unix_seconds) {
  time_t t = static_cast<time_t>(unix_seconds);
  tm utc;
  gmtime_r(&t, &utc);
  char buf[32];
  strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buf;
}

std::string WhoAmI() {
  std::string user;
  if (passwd* pw = getpwuid(geteuid())) user = pw->pw_name;
  else user = std::to_string(geteuid());
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return user + "@" + host;
}

}  // namespace strata::cache
