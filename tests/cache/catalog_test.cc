#include "cache/catalog.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "common/strings.h"
#include "tests/testing/test_util.h"

namespace strata::cache {
namespace {

using testing::MakeTempDir;

Manifest SampleManifest(std::string name, LayerKind kind = LayerKind::kBase, std::vector<Digest128> parents = {}) {
  Manifest m;
  m.kind = kind;
  m.name = std::move(name);
  m.parents = std::move(parents);
  m.chunk_size = 1 << 20;
  m.meta_hash = HashBytes(m.name + "-meta");
  m.meta_size = 4096;
  m.blob_size = 3 << 20;
  m.extents = {{0, 1 << 20, HashBytes(std::string_view("a"))},
               {1 << 20, 100, HashBytes(std::string_view("b"))},
               {(1 << 20) + 4096, 1 << 20, HashBytes(std::string_view("c"))}};
  m.files = 3;
  m.bytes = (2 << 20) + 100;
  return m;
}

TEST(ManifestTest, JsonRoundTripIsCanonical) {
  Manifest m = SampleManifest("python");
  std::string json = m.ToJson();
  ASSERT_OK_AND_ASSIGN(Manifest back, Manifest::FromJson(json));
  EXPECT_EQ(back.ToJson(), json);
  EXPECT_EQ(back.Digest(), m.Digest());
  EXPECT_EQ(json.find(' '), std::string::npos);
  EXPECT_LT(json.find("\"blob\""), json.find("\"build\""));  // sorted keys
}

TEST(ManifestTest, DigestChangesWithContent) {
  Manifest a = SampleManifest("x"), b = SampleManifest("x");
  EXPECT_EQ(a.Digest(), b.Digest());
  b.extents[1].hash = HashBytes(std::string_view("changed"));
  EXPECT_NE(a.Digest(), b.Digest());
}

TEST(ManifestTest, FindExtent) {
  Manifest m = SampleManifest("x");
  EXPECT_EQ(m.FindExtent(0), &m.extents[0]);
  EXPECT_EQ(m.FindExtent((1 << 20) - 1), &m.extents[0]);
  EXPECT_EQ(m.FindExtent(1 << 20), &m.extents[1]);
  EXPECT_EQ(m.FindExtent((1 << 20) + 100), nullptr);  // padding
  EXPECT_EQ(m.FindExtent((1 << 20) + 4096), &m.extents[2]);
  EXPECT_EQ(m.FindExtent(3 << 20), nullptr);
}

TEST(ManifestTest, ValidateNamesTheBrokenInvariant) {
  Manifest m = SampleManifest("x");
  m.extents[2].offset = 1 << 20;  // overlaps extent 1
  EXPECT_NE(m.Validate().ToString().find("extent 2"), std::string::npos);
  m = SampleManifest("x");
  m.extents[0].length = (1 << 20) + 1;
  EXPECT_FALSE(m.Validate().ok());
  m = SampleManifest("x");
  m.parents = {HashBytes(std::string_view("p"))};
  EXPECT_NE(m.Validate().ToString().find("cannot have parents"), std::string::npos);
  EXPECT_FALSE(Manifest::FromJson("{\"schema\":2}").ok());
  EXPECT_FALSE(Manifest::FromJson("not json").ok());
  EXPECT_FALSE(Manifest::FromJson("{\"schema\":1}").ok());
}

TEST(ManifestTest, ParseErrorsNameTheField) {
  auto code = [](std::string_view text) { return Manifest::FromJson(text).status().code(); };
  auto message = [](std::string_view text) { return Manifest::FromJson(text).status().ToString(); };
  EXPECT_EQ(code("{\"schema\":2}"), ENOTSUP);
  // Canonical JSON puts "schema" last: a newer schema is what gets reported,
  // whatever else it changed.
  EXPECT_EQ(code("{\"blob\":{\"extents\":{\"new\":1}},\"schema\":2}"), ENOTSUP);
  EXPECT_EQ(code("not json"), EINVAL);
  EXPECT_EQ(code("[1,2]"), EINVAL);
  EXPECT_EQ(code("42"), EINVAL);
  EXPECT_NE(message("{\"schema\":1}").find("no \"kind\""), std::string::npos);
  std::string good = SampleManifest("x").ToJson();
  ASSERT_OK(Manifest::FromJson(good).status());
  auto with = [&](std::string_view from, std::string_view to) {
    std::string t = good;
    size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? t : t.replace(at, from.size(), to);
  };
  EXPECT_NE(message(with("\"chunk_size\":1048576", "\"chunk_size\":\"1M\"")).find("\"chunk_size\" is not a number"),
            std::string::npos);
  EXPECT_NE(message(with("\"chunk_size\":1048576", "\"chunk_size\":-1")).find("chunk_size"), std::string::npos);
  EXPECT_NE(message(with("[0,1048576,", "[0,")).find("an extent is not [offset, length, hash]"), std::string::npos);
  EXPECT_NE(message(with("\"kind\":\"base\"", "\"kind\":\"basement\"")).find("basement"), std::string::npos);
  EXPECT_NE(message(with("\"meta\":{", "\"meta\":[{")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(message(with("\"parents\":[]", "\"parents\":{}")).find("\"parents\" is not an array"), std::string::npos);
  // Fields nobody reads are skipped, whatever they hold.
  ASSERT_OK(Manifest::FromJson(with("\"schema\":1", "\"schema\":1,\"zz\":{\"a\":[1,{\"b\":null}]}")).status());
}

// The manifest parser reads events, not a document; here it is held against
// one that reads the document (the parser it replaced) on texts mutated at
// random: whatever it accepts, the document parser accepts as the same
// manifest, and every canonical text is accepted.
Result<Manifest> DocumentFromJson(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Error(EINVAL, "not a JSON object");
  Manifest m;
  try {
    if (j.at("schema").get<int>() != Manifest::kSchema) return Error(ENOTSUP, "schema");
    STRATA_ASSIGN_OR_RETURN(m.kind, ParseLayerKind(j.at("kind").get<std::string>()));
    m.name = j.at("name").get<std::string>();
    for (const auto& p : j.at("parents")) {
      auto d = Digest128::FromHex(p.get<std::string>());
      if (!d) return Error(EINVAL, "parent");
      m.parents.push_back(*d);
    }
    m.chunk_size = j.at("chunk_size").get<uint32_t>();
    m.block_size = j.at("block_size").get<uint32_t>();
    auto meta = Digest128::FromHex(j.at("meta").at("hash").get<std::string>());
    if (!meta) return Error(EINVAL, "meta.hash");
    m.meta_hash = *meta;
    m.meta_size = j.at("meta").at("size").get<uint64_t>();
    m.blob_size = j.at("blob").at("size").get<uint64_t>();
    const auto& extents = j.at("blob").at("extents");
    if (!extents.is_array()) return Error(EINVAL, "extents");
    for (const auto& e : extents) {
      if (!e.is_array() || e.size() != 3) return Error(EINVAL, "extent");
      auto h = Digest128::FromHex(e[2].get<std::string>());
      if (!h) return Error(EINVAL, "extent hash");
      m.extents.push_back({e[0].get<uint64_t>(), e[1].get<uint64_t>(), *h});
    }
    m.files = j.at("build").at("files").get<uint64_t>();
    m.bytes = j.at("build").at("bytes").get<uint64_t>();
    m.source = j.at("build").at("source").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return Error(EINVAL, e.what());
  }
  STRATA_RETURN_IF_ERROR(m.Validate());
  return m;
}

TEST(ManifestTest, EventParserAgreesWithTheDocumentParser) {
  Manifest base = SampleManifest("diff-1", LayerKind::kDiff,
                                 {HashBytes(std::string_view("p1")), HashBytes(std::string_view("p2"))});
  base.source = HashBytes(std::string_view("src")).Hex();
  const std::string good = base.ToJson();
  std::mt19937_64 rng(7);
  const std::string alphabet = "{}[],:\"0123456789-.eE abcdefnrtul\\";
  int accepted = 0;
  for (int round = 0; round < 4000; ++round) {
    std::string t = good;
    const int edits = 1 + static_cast<int>(rng() % 3);
    for (int e = 0; e < edits && !t.empty(); ++e) {
      const size_t at = rng() % t.size();
      switch (rng() % 4) {
        case 0: t[at] = alphabet[rng() % alphabet.size()]; break;
        case 1: t.erase(at, 1 + rng() % 8); break;
        case 2: t.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        default: t.insert(at, t.substr(rng() % t.size(), 1 + rng() % 24)); break;
      }
    }
    auto events = Manifest::FromJson(t);
    auto document = DocumentFromJson(t);
    if (events.ok()) {
      ++accepted;
      ASSERT_TRUE(document.ok()) << t << "\n" << document.status().ToString();
      EXPECT_EQ(events->ToJson(), document->ToJson()) << t;
    }
    if (document.ok() && document->ToJson() == t) {
      EXPECT_TRUE(events.ok()) << t << "\n" << events.status().ToString();
    }
  }
  EXPECT_GT(accepted, 10) << accepted;  // the mutations reach accepted texts too
  RecordProperty("accepted", accepted);
  ASSERT_OK_AND_ASSIGN(Manifest back, Manifest::FromJson(good));
  EXPECT_EQ(back.ToJson(), good);
}

TEST(RefTest, Parse) {
  ASSERT_OK_AND_ASSIGN(LayerRef tag, ParseRef("python:3.11"));
  EXPECT_EQ(tag.name, "python");
  EXPECT_EQ(tag.version, "3.11");
  Digest128 d = HashBytes(std::string_view("x"));
  ASSERT_OK_AND_ASSIGN(LayerRef by_digest, ParseRef(d.Hex()));
  EXPECT_TRUE(by_digest.is_digest());
  EXPECT_EQ(by_digest.digest, d);
  EXPECT_FALSE(ParseRef("python").ok());
  EXPECT_FALSE(ParseRef("py/thon:1").ok());
  EXPECT_FALSE(ParseRef("python:").ok());
  EXPECT_FALSE(ParseRef("../x:1").ok());
  EXPECT_FALSE(ParseTag(d.Hex()).ok());
}

class CatalogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = OpenStore(dir_.path());
    ASSERT_TRUE(store.ok());
    catalog_ = std::make_unique<Catalog>(*store);
  }
  Digest128 Put(const Manifest& m) {
    auto d = catalog_->PutManifest(m);
    EXPECT_TRUE(d.ok());
    return *d;
  }
  TempDir dir_ = MakeTempDir();
  std::unique_ptr<Catalog> catalog_;
};

TEST_F(CatalogTest, ManifestsAreCheckedAgainstTheirDigest) {
  Manifest m = SampleManifest("base");
  Digest128 d = Put(m);
  EXPECT_EQ(d, m.Digest());
  ASSERT_OK_AND_ASSIGN(Manifest back, catalog_->GetManifest(d));
  EXPECT_EQ(back.ToJson(), m.ToJson());
  // A manifest whose bytes do not hash to its name is refused.
  ASSERT_OK(catalog_->store().Put(Catalog::ManifestKey(d), SampleManifest("other").ToJson()));
  EXPECT_EQ(catalog_->GetManifest(d).status().code(), EBADMSG);
  auto missing = catalog_->GetManifest(HashBytes(std::string_view("nope")));
  EXPECT_EQ(missing.status().code(), ENOENT);
}

TEST_F(CatalogTest, SharedManifestsAreParsedOncePerProcess) {
  Manifest m = SampleManifest("shared-" + dir_.path());  // unique to this run
  Digest128 d = Put(m);
  std::string text;
  ASSERT_OK(catalog_->GetManifest(d, &text).status());
  EXPECT_EQ(HashBytes(text), d);  // as stored
  ASSERT_OK_AND_ASSIGN(auto a, catalog_->SharedManifest(d));
  EXPECT_EQ(a->ToJson(), m.ToJson());
  // Named by content: another catalog, another store object, the same copy.
  ASSERT_OK_AND_ASSIGN(auto store, OpenStore(dir_.path()));
  Catalog other(store);
  ASSERT_OK_AND_ASSIGN(auto b, other.SharedManifest(d));
  EXPECT_EQ(a.get(), b.get());
  // Once nobody holds it and enough others were asked for, it is let go.
  std::weak_ptr<const Manifest> weak = a;
  a.reset();
  b.reset();
  for (size_t i = 0; i < Catalog::kManifestsKept; ++i) {
    Digest128 o = Put(SampleManifest(StrCat("other-", i, "-", dir_.path())));
    ASSERT_OK(catalog_->SharedManifest(o).status());
  }
  EXPECT_TRUE(weak.expired());
  // A manifest that does not hash to its name is refused, and not kept.
  Digest128 bad = Put(SampleManifest("bad-" + dir_.path()));
  ASSERT_OK(catalog_->store().Put(Catalog::ManifestKey(bad), m.ToJson()));
  EXPECT_EQ(catalog_->SharedManifest(bad).status().code(), EBADMSG);
  EXPECT_EQ(catalog_->SharedManifest(bad).status().code(), EBADMSG);
}

TEST_F(CatalogTest, TagsPointAtLayers) {
  Digest128 v1 = Put(SampleManifest("py1")), v2 = Put(SampleManifest("py2"));
  ASSERT_OK(catalog_->SetTag("python", "1", v1).status());
  ASSERT_OK(catalog_->SetTag("python", "2", v1).status());
  ASSERT_OK(catalog_->SetTag("python", "2", v2).status());  // moves
  ASSERT_OK(catalog_->SetTag("busybox", "1", v2).status());
  ASSERT_OK_AND_ASSIGN(Digest128 got, catalog_->Resolve("python:2"));
  EXPECT_EQ(got, v2);
  ASSERT_OK_AND_ASSIGN(got, catalog_->Resolve(v1.Hex()));
  EXPECT_EQ(got, v1);
  ASSERT_OK_AND_ASSIGN(auto all, catalog_->ListTags());
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].name, "busybox");
  EXPECT_FALSE(all[0].created.empty());
  EXPECT_NE(all[0].by.find('@'), std::string::npos);
  ASSERT_OK_AND_ASSIGN(auto py, catalog_->ListTags("python"));
  EXPECT_EQ(py.size(), 2u);
  ASSERT_OK(catalog_->DeleteTag("python", "1"));
  EXPECT_EQ(catalog_->Resolve("python:1").status().code(), ENOENT);
  EXPECT_EQ(catalog_->DeleteTag("python", "1").code(), ENOENT);
  auto unknown = catalog_->Resolve("nope:1");
  EXPECT_NE(unknown.status().ToString().find("nope:1"), std::string::npos);
  EXPECT_EQ(catalog_->SetTag("x", "1", HashBytes(std::string_view("no layer"))).status().code(), ENOENT);
}

TEST_F(CatalogTest, DiffsBringTheirParentsAndStacksMustMatch) {
  Digest128 base = Put(SampleManifest("base"));
  Digest128 toolkit = Put(SampleManifest("toolkit", LayerKind::kToolkit));
  Digest128 diff = Put(SampleManifest("diff", LayerKind::kDiff, {base, toolkit}));
  Digest128 diff2 = Put(SampleManifest("diff2", LayerKind::kDiff, {base, toolkit, diff}));

  ASSERT_OK_AND_ASSIGN(auto alone, catalog_->ResolveStack({diff.Hex()}));
  ASSERT_EQ(alone.size(), 3u);
  EXPECT_EQ(alone[0].digest, base);
  EXPECT_EQ(alone[1].digest, toolkit);
  EXPECT_EQ(alone[2].digest, diff);

  ASSERT_OK_AND_ASSIGN(auto chain, catalog_->ResolveStack({diff2.Hex()}));
  EXPECT_EQ(chain.size(), 4u);

  ASSERT_OK_AND_ASSIGN(auto explicit_stack, catalog_->ResolveStack({base.Hex(), toolkit.Hex(), diff.Hex()}));
  EXPECT_EQ(explicit_stack.size(), 3u);

  auto wrong = catalog_->ResolveStack({base.Hex(), diff.Hex()});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), EINVAL);
  EXPECT_NE(wrong.status().ToString().find("was made on"), std::string::npos);

  ASSERT_OK_AND_ASSIGN(auto plain, catalog_->ResolveStack({base.Hex(), toolkit.Hex()}));
  EXPECT_EQ(plain.size(), 2u);
  EXPECT_FALSE(catalog_->ResolveStack({}).ok());
}

TEST_F(CatalogTest, AccessListsAndLeases) {
  Digest128 d = Put(SampleManifest("base"));
  EXPECT_EQ(catalog_->GetAccessList(d).status().code(), ENOENT);
  ASSERT_OK(catalog_->PutAccessList(d, {5, 1, 9}));
  ASSERT_OK_AND_ASSIGN(auto list, catalog_->GetAccessList(d));
  EXPECT_EQ(list, (std::vector<uint32_t>{5, 1, 9}));

  ASSERT_OK(catalog_->PutLease({"node-1", d, 12345}));
  ASSERT_OK_AND_ASSIGN(auto leases, catalog_->ListLeases());
  ASSERT_EQ(leases.size(), 1u);
  EXPECT_EQ(leases[0].node, "node-1");
  EXPECT_EQ(leases[0].expires, 12345);
  ASSERT_OK(catalog_->DropLease("node-1", d));
  ASSERT_OK_AND_ASSIGN(leases, catalog_->ListLeases());
  EXPECT_TRUE(leases.empty());
}

}  // namespace
}  // namespace strata::cache
