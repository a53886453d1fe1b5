// Manifest JSON and invariants.
#include "cache/manifest.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <unordered_set>
#include <utility>

#include "common/strings.h"

namespace strata::cache {

using nlohmann::json;

std::string_view LayerKindName(LayerKind kind) {
  switch (kind) {
    case LayerKind::kBase: return "base";
    case LayerKind::kWorkspace: return "workspace";
    case LayerKind::kToolkit: return "toolkit";
    case LayerKind::kDiff: return "diff";
  }
  return "base";
}

Result<LayerKind> ParseLayerKind(std::string_view name) {
  for (LayerKind k : {LayerKind::kBase, LayerKind::kWorkspace, LayerKind::kToolkit, LayerKind::kDiff}) {
    if (LayerKindName(k) == name) return k;
  }
  return Error(EINVAL, StrCat("layer kind ", Quote(name), ": expected base, workspace, toolkit or diff"));
}

std::string Manifest::ToJson() const {
  // Extents as compact [offset, length, "hash"] triples: a large image has
  // hundreds of thousands of them.
  json extents_json = json::array();
  for (const auto& e : extents) extents_json.push_back(json::array({e.offset, e.length, e.hash.Hex()}));
  json parents_json = json::array();
  for (const auto& p : parents) parents_json.push_back(p.Hex());
  json j = {
      {"schema", kSchema},
      {"kind", LayerKindName(kind)},
      {"name", name},
      {"parents", parents_json},
      {"chunk_size", chunk_size},
      {"block_size", block_size},
      {"meta", {{"hash", meta_hash.Hex()}, {"size", meta_size}}},
      {"blob", {{"size", blob_size}, {"extents", extents_json}}},
      {"build", {{"files", files}, {"bytes", bytes}, {"source", source}}},
  };
  return j.dump();  // nlohmann's object keeps keys sorted: canonical
}

namespace {

// Builds a Manifest from the JSON text's events, with no document tree in
// between: a 10,000-extent manifest's tree took 20-30 ms to allocate and
// fault in, where the events take a few. Canonical JSON sorts its keys, so
// "schema" comes last: every other problem is only noted on the way, and a
// schema this strata does not read is what gets reported.
class ManifestSax final : public json::json_sax_t {
 public:
  explicit ManifestSax(Manifest& m) : m_(m) {}

  Status Finish() {
    if (!syntax_.ok()) return syntax_;
    if (!(seen_ & kSchemaBit)) return Error(EINVAL, "manifest: no \"schema\"");
    if (schema_ != Manifest::kSchema) {
      return Error(ENOTSUP, StrCat("manifest: schema ", schema_, " is not supported (this strata reads ",
                                   Manifest::kSchema, ")"));
    }
    if (!error_.ok()) return error_;
    for (const auto& [bit, name] : kRequired) {
      if (!(seen_ & bit)) return Error(EINVAL, StrCat("manifest: no \"", name, "\""));
    }
    return OkStatus();
  }

  bool null() override { return Scalar(Value{}); }
  bool boolean(bool) override { return Scalar(Value{}); }
  bool number_integer(number_integer_t v) override {
    Value x;
    x.type = v < 0 ? Value::kNegative : Value::kUnsigned;
    x.u = static_cast<uint64_t>(v);
    return Scalar(x);
  }
  bool number_unsigned(number_unsigned_t v) override {
    Value x;
    x.type = Value::kUnsigned;
    x.u = v;
    return Scalar(x);
  }
  bool number_float(number_float_t, const string_t&) override { return Scalar(Value{}); }
  bool string(string_t& v) override {
    Value x;
    x.type = Value::kString;
    x.s = &v;
    return Scalar(x);
  }
  bool binary(binary_t&) override { return Scalar(Value{}); }

  bool start_object(std::size_t) override {
    if (stack_.empty()) {
      stack_.push_back({});
      return true;
    }
    const Where w = Here();
    if (w == Where::kSection) {
      // "meta", "blob", "build": objects, one level down. A repeated key
      // replaces the earlier value, as in a document.
      const std::string& k = stack_.back().key;
      seen_ &= ~(k == "meta" ? (64u | 128u) : k == "blob" ? (256u | 512u) : (1024u | 2048u | 4096u));
      if (k == "blob") m_.extents.clear();
    } else if (w != Where::kOther) {
      Note(StrCat(Describe(w), " is not ", Expected(w)));
    }
    Frame f;
    f.skip = w != Where::kSection;
    stack_.push_back(std::move(f));
    return true;
  }
  bool end_object() override { return Pop(); }
  bool start_array(std::size_t) override {
    if (stack_.empty()) {
      Note("not a JSON object");
      Frame f;
      f.array = f.skip = true;
      stack_.push_back(std::move(f));
      return true;
    }
    const Where w = Here();
    Frame f;
    f.array = true;
    if (w == Where::kParents || w == Where::kExtents) {
      f.list = w;
      // A repeated key replaces the earlier value, as in a document.
      if (w == Where::kParents) {
        m_.parents.clear();
        seen_ |= 8;
      } else {
        m_.extents.clear();
        seen_ |= 512;
      }
    } else if (w == Where::kExtentList) {
      f.list = Where::kExtent;  // one [offset, length, hash]
      extent_ = {};
    } else {
      if (w != Where::kOther) Note(StrCat(Describe(w), " is not ", Expected(w)));
      f.skip = true;
    }
    stack_.push_back(std::move(f));
    return true;
  }
  bool end_array() override {
    if (!stack_.empty() && stack_.back().list == Where::kExtent && !stack_.back().skip) {
      if (stack_.back().index != 3) Note("an extent is not [offset, length, hash]");
      else m_.extents.push_back(extent_);
    }
    return Pop();
  }
  bool key(string_t& k) override {
    stack_.back().key = k;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const json::exception& e) override {
    syntax_ = Error(EINVAL, StrCat("manifest: not valid JSON: ", e.what()));
    return false;
  }

 private:
  struct Value {
    enum Type { kOther, kUnsigned, kNegative, kString } type = kOther;
    uint64_t u = 0;
    const std::string* s = nullptr;
  };
  enum class Where {
    kOther,      // a field nobody reads, or inside one
    kField,      // a scalar field: "schema", "meta"."hash", ...
    kSection,    // "meta", "blob" or "build"
    kParents,    // the "parents" array
    kParent,     // one of its items
    kExtents,    // "blob"."extents"
    kExtentList, // one of its items: an extent
    kExtent,     // an item of an extent
  };
  struct Frame {
    bool array = false, skip = false;
    Where list = Where::kOther;  // for an array: what it holds
    std::string key;             // for an object: the key being read
    size_t index = 0;            // for an array: items so far
  };

  static constexpr uint32_t kSchemaBit = 1;
  static constexpr std::pair<uint32_t, const char*> kRequired[] = {
      {2, "kind"},         {4, "name"},       {8, "parents"},      {16, "chunk_size"},
      {32, "block_size"},  {64, "meta.hash"}, {128, "meta.size"},  {256, "blob.size"},
      {512, "blob.extents"}, {1024, "build.files"}, {2048, "build.bytes"}, {4096, "build.source"},
  };

  // Where the next value goes.
  Where Here() const {
    const Frame& top = stack_.back();
    if (top.skip) return Where::kOther;
    if (top.array) {
      if (top.list == Where::kParents) return Where::kParent;
      if (top.list == Where::kExtents) return Where::kExtentList;
      if (top.list == Where::kExtent) return Where::kExtent;
      return Where::kOther;
    }
    if (stack_.size() == 1) {
      const std::string& k = top.key;
      if (k == "meta" || k == "blob" || k == "build") return Where::kSection;
      if (k == "parents") return Where::kParents;
      if (k == "schema" || k == "kind" || k == "name" || k == "chunk_size" || k == "block_size") return Where::kField;
      return Where::kOther;
    }
    if (stack_.size() == 2) {
      const std::string& section = stack_[0].key;
      const std::string& k = top.key;
      if (section == "blob" && k == "extents") return Where::kExtents;
      if ((section == "meta" && (k == "hash" || k == "size")) || (section == "blob" && k == "size") ||
          (section == "build" && (k == "files" || k == "bytes" || k == "source"))) {
        return Where::kField;
      }
    }
    return Where::kOther;
  }

  std::string FieldName() const {
    return stack_.size() == 2 ? StrCat(stack_[0].key, ".", stack_[1].key) : stack_.back().key;
  }
  std::string Describe(Where w) const {
    switch (w) {
      case Where::kParent: return "a parent";
      case Where::kExtentList:
      case Where::kExtent: return "an extent";
      default: return StrCat("\"", FieldName(), "\"");
    }
  }
  std::string Expected(Where w) const {
    switch (w) {
      case Where::kSection: return "an object";
      case Where::kParents:
      case Where::kExtents: return "an array";
      case Where::kExtentList: return "[offset, length, hash]";
      case Where::kExtent: return "[offset, length, hash]";
      case Where::kParent: return "32 hex digits";
      default: {
        const std::string f = FieldName();
        return f == "kind" || f == "name" || f == "build.source" || f == "meta.hash" ? "a string" : "a number";
      }
    }
  }

  bool Pop() {
    if (!stack_.empty()) stack_.pop_back();
    if (!stack_.empty() && stack_.back().array) ++stack_.back().index;
    return true;
  }

  void Note(std::string what) {
    if (error_.ok()) error_ = Error(EINVAL, StrCat("manifest: ", what));
  }

  static std::optional<Digest128> Hex(const Value& v) {
    if (v.type != Value::kString) return std::nullopt;
    return Digest128::FromHex(*v.s);
  }

  bool Scalar(const Value& v) {
    if (stack_.empty()) {
      Note("not a JSON object");
      return true;
    }
    const Where w = Here();
    Frame& top = stack_.back();
    switch (w) {
      case Where::kField: Field(v); break;
      case Where::kParent:
        if (auto d = Hex(v)) m_.parents.push_back(*d);
        else Note("a parent is not 32 hex digits");
        break;
      case Where::kExtent:
        if (top.index == 0 && v.type == Value::kUnsigned) extent_.offset = v.u;
        else if (top.index == 1 && v.type == Value::kUnsigned) extent_.length = v.u;
        else if (auto d = top.index == 2 ? Hex(v) : std::nullopt) extent_.hash = *d;
        else Note("an extent is not [offset, length, hash]");
        break;
      case Where::kOther: break;
      default: Note(StrCat(Describe(w), " is not ", Expected(w))); break;
    }
    if (top.array) ++top.index;
    return true;
  }

  void Field(const Value& v) {
    const std::string f = FieldName();
    auto number = [&](uint64_t max, auto* out, uint32_t bit) {
      if (v.type != Value::kUnsigned || v.u > max) return Note(StrCat("\"", f, "\" is not a number from 0 to ", max));
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(v.u);
      seen_ |= bit;
    };
    auto text = [&](std::string* out, uint32_t bit) {
      if (v.type != Value::kString) return Note(StrCat("\"", f, "\" is not a string"));
      *out = *v.s;
      seen_ |= bit;
    };
    if (f == "schema") {
      if (v.type == Value::kUnsigned) schema_ = static_cast<int64_t>(std::min<uint64_t>(v.u, INT64_MAX));
      else if (v.type == Value::kNegative) schema_ = static_cast<int64_t>(v.u);
      else return Note("\"schema\" is not a number");
      seen_ |= kSchemaBit;
    } else if (f == "kind") {
      std::string name;
      text(&name, 0);
      if (v.type != Value::kString) return;
      auto kind = ParseLayerKind(name);
      if (!kind.ok()) return Note(std::string(kind.status().message()));
      m_.kind = *kind;
      seen_ |= 2;
    } else if (f == "name") {
      text(&m_.name, 4);
    } else if (f == "chunk_size") {
      number(UINT32_MAX, &m_.chunk_size, 16);
    } else if (f == "block_size") {
      number(UINT32_MAX, &m_.block_size, 32);
    } else if (f == "meta.hash") {
      if (auto d = Hex(v)) {
        m_.meta_hash = *d;
        seen_ |= 64;
      } else {
        Note("\"meta.hash\" is not 32 hex digits");
      }
    } else if (f == "meta.size") {
      number(UINT64_MAX, &m_.meta_size, 128);
    } else if (f == "blob.size") {
      number(UINT64_MAX, &m_.blob_size, 256);
    } else if (f == "build.files") {
      number(UINT64_MAX, &m_.files, 1024);
    } else if (f == "build.bytes") {
      number(UINT64_MAX, &m_.bytes, 2048);
    } else if (f == "build.source") {
      text(&m_.source, 4096);
    }
  }

  Manifest& m_;
  std::vector<Frame> stack_;
  Extent extent_;
  int64_t schema_ = 0;
  uint32_t seen_ = 0;
  Status error_, syntax_;
};

}  // namespace

Result<Manifest> Manifest::FromJson(std::string_view text) {
  Manifest m;
  ManifestSax sax(m);
  json::sax_parse(text, &sax);
  STRATA_RETURN_IF_ERROR(sax.Finish());
  STRATA_RETURN_IF_ERROR(m.Validate());
  return m;
}

Status Manifest::Validate() const {
  if (block_size < 512 || (block_size & (block_size - 1))) {
    return Error(EINVAL, StrCat("manifest: block size ", block_size, " is not a power of two >= 512"));
  }
  if (chunk_size < block_size || (chunk_size & (chunk_size - 1))) {
    return Error(EINVAL, StrCat("manifest: chunk size ", chunk_size, " is not a power of two >= the block size"));
  }
  if (kind != LayerKind::kDiff && !parents.empty()) {
    return Error(EINVAL, StrCat("manifest: a ", LayerKindName(kind), " layer cannot have parents"));
  }
  if (blob_size % block_size) return Error(EINVAL, "manifest: blob size is not a multiple of the block size");
  uint64_t end = 0;
  for (size_t i = 0; i < extents.size(); ++i) {
    const Extent& e = extents[i];
    if (e.length == 0 || e.length > chunk_size) {
      return Error(EINVAL, StrCat("manifest: extent ", i, " has length ", e.length, " (chunk size ", chunk_size, ")"));
    }
    if (e.offset % block_size || e.offset < end || e.offset + e.length > blob_size) {
      return Error(EINVAL, StrCat("manifest: extent ", i, " at offset ", e.offset, " overlaps, is unaligned or lies past the blob"));
    }
    end = e.offset + e.length;
  }
  return OkStatus();
}

const Extent* Manifest::FindExtent(uint64_t offset) const {
  auto it = std::upper_bound(extents.begin(), extents.end(), offset,
                             [](uint64_t off, const Extent& e) { return off < e.offset; });
  if (it == extents.begin()) return nullptr;
  --it;
  return offset < it->offset + it->length ? &*it : nullptr;
}

uint64_t Manifest::StoredBytes() const {
  // Each object once: a group of small chunks may hold the same bytes as a
  // small file's extent elsewhere in the blob.
  std::unordered_set<Digest128, Digest128Hash> seen;
  uint64_t total = meta_size;
  for (const auto& e : extents) {
    if (seen.insert(e.hash).second) total += e.length;
  }
  return total;
}

}  // namespace strata::cache
