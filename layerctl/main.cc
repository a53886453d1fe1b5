// layerctl: build, publish, version, pull, inspect, verify and collect layers.
#include <sys/sysmacros.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cache/catalog.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/units.h"
#include "layerctl/builder.h"
#include "layerctl/gc.h"
#include "layerctl/inspect.h"
#include "layerctl/publish.h"

namespace {

using nlohmann::json;
using namespace strata;

int Fail(const Status& s) {
  std::fprintf(stderr, "layerctl: %s\n", s.ToString().c_str());
  return 1;
}

Result<cache::Catalog> OpenCatalog(const std::string& flag) {
  STRATA_ASSIGN_OR_RETURN(auto store, cache::OpenStore(cache::DefaultStoreUrl(flag)));
  return cache::Catalog(store);
}

json PushJson(const layerctl::PushReport& r) {
  return {{"digest", r.digest.Hex()},         {"chunks", r.chunks},
          {"chunks_uploaded", r.chunks_uploaded}, {"bytes_uploaded", r.bytes_uploaded},
          {"bytes_sent", r.bytes_sent},           {"chunks_compressed", r.chunks_compressed},
          {"compress", r.compression.ToString()},
          {"chunks_present", r.chunks_present},   {"bytes_present", r.bytes_present}};
}

void PrintPush(const layerctl::PushReport& r, const std::optional<cache::LayerRef>& tag, bool as_json) {
  if (as_json) {
    json j = PushJson(r);
    if (tag) j["tag"] = tag->ToString();
    std::cout << j.dump() << "\n";
    return;
  }
  std::cout << r.digest.Hex() << "\n";
  std::fprintf(stderr, "uploaded %s in %llu chunks (%s sent, %s), %s already present in %llu chunks%s\n",
               FormatBytes(r.bytes_uploaded).c_str(), static_cast<unsigned long long>(r.chunks_uploaded),
               FormatBytes(r.bytes_sent).c_str(), r.compression.ToString().c_str(),
               FormatBytes(r.bytes_present).c_str(), static_cast<unsigned long long>(r.chunks_present),
               tag ? (", tagged " + tag->ToString()).c_str() : "");
}

json ManifestSummary(const Digest128& digest, const cache::Manifest& m) {
  json parents = json::array();
  for (const auto& p : m.parents) parents.push_back(p.Hex());
  return {{"digest", digest.Hex()},    {"kind", cache::LayerKindName(m.kind)},
          {"name", m.name},            {"parents", parents},
          {"chunk_size", m.chunk_size}, {"meta_size", m.meta_size},
          {"blob_size", m.blob_size},  {"extents", m.extents.size()},
          {"stored_bytes", m.StoredBytes()}, {"files", m.files},
          {"bytes", m.bytes},          {"source", m.source}};
}

// JSON strings must be UTF-8 and names need not be: such a name is given
// escaped for reading under `key` and exactly, in hex, under `key`_hex.
void PutName(json& j, const std::string& key, const std::string& name) {
  if (IsUtf8(name)) {
    j[key] = name;
    return;
  }
  j[key] = Quote(name);
  j[key + "_hex"] = HexEncode(std::span(reinterpret_cast<const uint8_t*>(name.data()), name.size()));
}

json FileJson(const layerctl::FileEntry& f) {
  const erofs::Inode& in = f.inode;
  json j = {{"type", std::string(erofs::FileTypeName(in.type))},
            {"mode", in.mode & 07777}, {"uid", in.uid},
            {"gid", in.gid},          {"size", in.size},
            {"nlink", in.nlink},      {"mtime", in.mtime},
            {"mtime_nsec", in.mtime_nsec}, {"nid", in.nid}};
  PutName(j, "path", f.path);
  if (in.type == erofs::FileType::kSymlink) PutName(j, "target", f.link_target);
  if (in.type == erofs::FileType::kCharDevice || in.type == erofs::FileType::kBlockDevice) j["rdev"] = in.rdev;
  if (in.type == erofs::FileType::kRegular) {
    json extents = json::array();
    for (const auto& e : f.extents) {
      json x = {{"offset", e.file_offset}, {"length", e.length}};
      if (e.hole) {
        x["hole"] = true;
      } else if (e.in_metadata) {
        x["in_metadata"] = true;
      } else {
        x["blob_offset"] = e.blob_offset;
        if (e.chunk) {
          x["chunk"] = e.chunk->Hex();
          x["chunk_offset"] = e.chunk_offset;
        }
      }
      extents.push_back(std::move(x));
    }
    j["extents"] = std::move(extents);
  }
  return j;
}

// TYPE MODE UID:GID SIZE EXTENTS PATH [-> TARGET]; devices show
// MAJOR,MINOR for the size, EXTENTS counts the stored pieces.
std::string FileLine(const layerctl::FileEntry& f) {
  const erofs::Inode& in = f.inode;
  std::string size = StrCat(in.size);
  if (in.type == erofs::FileType::kCharDevice || in.type == erofs::FileType::kBlockDevice) {
    size = StrCat(major(in.rdev), ",", minor(in.rdev));
  }
  size_t stored = 0;
  for (const auto& e : f.extents) stored += !e.hole;
  char head[96];
  std::snprintf(head, sizeof head, "%c %04o %11s %12s %4zu ", layerctl::FileTypeLetter(in.type), in.mode & 07777,
                StrCat(in.uid, ":", in.gid).c_str(), size.c_str(), stored);
  std::string line = head + Quote(f.path);
  if (in.type == erofs::FileType::kSymlink) line += " -> " + Quote(f.link_target);
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"layerctl: build, publish, version, pull, inspect, verify and collect layers"};
  app.require_subcommand(1);
  app.fallthrough();
  std::string store_url;
  bool as_json = false;
  app.add_option("--store", store_url, "store URL (default: $STRATA_STORE, else /var/lib/strata/store)");
  app.add_flag("--json", as_json, "print JSON for scripts");

  // build
  auto* build = app.add_subcommand("build", "build a layer from a directory or a tar archive (plain, gzip, zstd, xz, bzip2; - for stdin)");
  std::string src, out_dir, kind_text = "base", name, chunk_text = "1M", tag_text;
  std::string group_text = StrCat(layerctl::kDefaultGroupSize >> 10, "K");
  build->add_option("SRC", src, "directory or tar archive")->required();
  build->add_option("-o,--output", out_dir, "write meta.img, blob.img and manifest.json here");
  build->add_option("--kind", kind_text, "base, workspace, toolkit or diff")->capture_default_str();
  build->add_option("--name", name, "layer name recorded in the manifest");
  build->add_option("--chunk-size", chunk_text, "EROFS chunk size, the largest extent")->capture_default_str();
  build->add_option("--group-size", group_text,
                    "small files' chunks side by side become one extent of at most this size (0: one extent per chunk)")
      ->capture_default_str();
  build->add_option("--tag", tag_text, "also push and tag as NAME:VERSION");
  std::string compress_text;
  const char* compress_help = "chunk encoding in the store: none, zstd or zstd:LEVEL (1-19; default: the store's setting, zstd:1)";
  build->add_option("--compress", compress_text, compress_help);

  auto* push = app.add_subcommand("push", "publish a built layer directory");
  std::string push_dir;
  push->add_option("DIR", push_dir, "layer directory from build -o")->required();
  push->add_option("--tag", tag_text, "tag as NAME:VERSION once published");
  push->add_option("--compress", compress_text, compress_help);

  auto* settings = app.add_subcommand("settings", "show the store's settings, or change them");
  std::string default_compress;
  settings->add_option("--compress", default_compress, "what pushes without --compress use: none, zstd or zstd:LEVEL");

  auto* pull = app.add_subcommand("pull", "write a published layer's files into a directory");
  std::string ref;
  pull->add_option("REF", ref, "NAME:VERSION or digest")->required();
  pull->add_option("-o,--output", out_dir, "directory")->required();

  auto* ls = app.add_subcommand("ls", "list tags: name, version, digest, kind, size, created, parents (diffs)");
  std::string ls_name;
  ls->add_option("NAME", ls_name, "only this name");

  auto* inspect = app.add_subcommand("inspect", "show a layer's manifest, or with --files its tree");
  inspect->add_option("REF", ref, "NAME:VERSION or digest")->required();
  bool files = false;
  inspect->add_flag("--files", files,
                    "list every path: type, mode, owner, size, extents (read from the metadata image, not mounted)");

  auto* verify = app.add_subcommand("verify", "check every chunk's hash and fsck the assembled image");
  verify->add_option("REF", ref, "NAME:VERSION or digest")->required();

  auto* tag = app.add_subcommand("tag", "point NAME:VERSION at a layer");
  std::string new_tag;
  tag->add_option("REF", ref, "NAME:VERSION or digest")->required();
  tag->add_option("TAG", new_tag, "NAME:VERSION")->required();

  auto* rm = app.add_subcommand("rm", "remove a tag (the layer stays until gc)");
  rm->add_option("TAG", new_tag, "NAME:VERSION")->required();

  auto* gc = app.add_subcommand("gc", "delete what no tag or lease reaches, after a grace period");
  std::string grace_text = "24h";
  bool dry_run = false;
  gc->add_option("--grace", grace_text, "how long an object must have been unreachable")->capture_default_str();
  gc->add_flag("--dry-run", dry_run, "only report");

  CLI11_PARSE(app, argc, argv);

  auto catalog = OpenCatalog(store_url);
  if (!catalog.ok()) return Fail(catalog.status());
  layerctl::PushOptions push_options;
  if (!compress_text.empty()) {
    auto c = cache::ParseCompression(compress_text);
    if (!c.ok()) return Fail(c.status().Annotate("--compress"));
    push_options.compression = *c;
  }

  if (settings->parsed()) {
    auto current = catalog->GetSettings();
    if (!current.ok()) return Fail(current.status());
    if (!default_compress.empty()) {
      auto c = cache::ParseCompression(default_compress);
      if (!c.ok()) return Fail(c.status().Annotate("--compress"));
      current->compression = *c;
      Status s = catalog->PutSettings(*current);
      if (!s.ok()) return Fail(s.Annotate("write the store's settings"));
    }
    json j = {{"store", catalog->store().url()}, {"compress", current->compression.ToString()}};
    if (as_json) std::cout << j.dump() << "\n";
    else std::cout << "compress " << current->compression.ToString() << "\n";
    return 0;
  }

  if (build->parsed()) {
    std::optional<cache::LayerRef> to_tag;
    if (!tag_text.empty()) {
      auto t = cache::ParseTag(tag_text);
      if (!t.ok()) return Fail(t.status());
      to_tag = *t;
    } else if (out_dir.empty()) {
      return Fail(Error(EINVAL, "build: give -o DIR, --tag NAME:VERSION, or both"));
    } else if (!compress_text.empty()) {
      return Fail(Error(EINVAL, "build: --compress applies to what --tag pushes; without --tag nothing is pushed"));
    }
    auto kind = cache::ParseLayerKind(kind_text);
    if (!kind.ok()) return Fail(kind.status());
    auto chunk = ParseSize(chunk_text);
    if (!chunk.ok()) return Fail(chunk.status());
    auto group = ParseSize(group_text);
    if (!group.ok()) return Fail(group.status().Annotate("build: --group-size"));
    if (*group > UINT32_MAX) return Fail(Error(EINVAL, StrCat("build: --group-size ", group_text, ": at most 4G")));
    std::optional<TempDir> tmp;
    if (out_dir.empty()) {
      auto t = TempDir::Create("strata-build");
      if (!t.ok()) return Fail(t.status());
      tmp.emplace(std::move(*t));
      out_dir = tmp->path();
    }
    layerctl::BuildOptions options{.source = src, .output_dir = out_dir, .kind = *kind, .name = name,
                                   .chunk_size = static_cast<uint32_t>(*chunk),
                                   .group_size = static_cast<uint32_t>(*group)};
    auto built = layerctl::BuildLayer(options);
    if (!built.ok()) return Fail(built.status());
    if (!to_tag) {
      if (as_json) std::cout << ManifestSummary(built->digest, built->manifest).dump() << "\n";
      else std::cout << built->digest.Hex() << "\n";
      return 0;
    }
    auto report = layerctl::Push(*built, *catalog, to_tag, push_options);
    if (!report.ok()) return Fail(report.status());
    PrintPush(*report, to_tag, as_json);
    return 0;
  }
  if (push->parsed()) {
    std::optional<cache::LayerRef> to_tag;
    if (!tag_text.empty()) {
      auto t = cache::ParseTag(tag_text);
      if (!t.ok()) return Fail(t.status());
      to_tag = *t;
    }
    auto layer = layerctl::OpenLayerDir(push_dir);
    if (!layer.ok()) return Fail(layer.status());
    auto report = layerctl::Push(*layer, *catalog, to_tag, push_options);
    if (!report.ok()) return Fail(report.status());
    PrintPush(*report, to_tag, as_json);
    return 0;
  }
  if (tag->parsed() || rm->parsed()) {
    auto t = cache::ParseTag(new_tag);
    if (!t.ok()) return Fail(t.status());
    if (rm->parsed()) {
      Status s = catalog->DeleteTag(t->name, t->version);
      return s.ok() ? 0 : Fail(s);
    }
    auto digest = catalog->Resolve(ref);
    if (!digest.ok()) return Fail(digest.status());
    auto record = catalog->SetTag(t->name, t->version, *digest);
    if (!record.ok()) return Fail(record.status());
    if (as_json) std::cout << json{{"tag", t->ToString()}, {"digest", digest->Hex()}}.dump() << "\n";
    return 0;
  }
  if (ls->parsed()) {
    auto tags = catalog->ListTags(ls_name);
    if (!tags.ok()) return Fail(tags.status());
    json rows = json::array();
    std::vector<std::vector<std::string>> table = {{"NAME", "VERSION", "DIGEST", "KIND", "SIZE", "CREATED", "PARENTS"}};
    for (const auto& t : *tags) {
      auto m = catalog->GetManifest(t.digest);
      std::string kind = m.ok() ? std::string(cache::LayerKindName(m->kind)) : "?";
      uint64_t size = m.ok() ? m->meta_size + m->blob_size : 0;
      json parents = json::array();
      std::vector<std::string> short_parents;  // a diff's stack, bottom first
      if (m.ok()) {
        for (const auto& p : m->parents) {
          parents.push_back(p.Hex());
          short_parents.push_back(p.Hex().substr(0, 12));
        }
      }
      rows.push_back({{"name", t.name}, {"version", t.version}, {"digest", t.digest.Hex()}, {"kind", kind},
                      {"size", size}, {"created", t.created}, {"by", t.by}, {"parents", parents}});
      table.push_back({t.name, t.version, t.digest.Hex(), kind, FormatBytes(size), t.created,
                       short_parents.empty() ? "-" : Join(short_parents, ",")});
    }
    if (as_json) {
      std::cout << rows.dump() << "\n";
      return 0;
    }
    std::vector<size_t> width(table.front().size(), 0);
    for (const auto& row : table) {
      for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
    }
    for (const auto& row : table) {
      std::string line;
      for (size_t i = 0; i < row.size(); ++i) line += row[i] + std::string(width[i] - row[i].size() + 2, ' ');
      while (!line.empty() && line.back() == ' ') line.pop_back();
      std::cout << line << "\n";
    }
    return 0;
  }
  if (pull->parsed() || inspect->parsed() || verify->parsed()) {
    auto digest = catalog->Resolve(ref);
    if (!digest.ok()) return Fail(digest.status());
    if (pull->parsed()) {
      auto report = layerctl::Pull(*catalog, *digest, out_dir);
      if (!report.ok()) return Fail(report.status());
      if (as_json) std::cout << ManifestSummary(*digest, report->manifest).dump() << "\n";
      else std::cout << digest->Hex() << "\n";
      return 0;
    }
    if (inspect->parsed() && files) {
      json list = json::array();
      if (!as_json) std::cout << "T MODE   UID:GID         SIZE EXTS PATH\n";
      Status s = layerctl::ListLayerFiles(*catalog, *digest, [&](const layerctl::FileEntry& f) {
        if (as_json) list.push_back(FileJson(f));
        else std::cout << FileLine(f) << "\n";
        return OkStatus();
      });
      if (!s.ok()) return Fail(s);
      if (as_json) std::cout << json{{"digest", digest->Hex()}, {"files", list}}.dump() << "\n";
      return 0;
    }
    if (inspect->parsed()) {
      auto m = catalog->GetManifest(*digest);
      if (!m.ok()) return Fail(m.status());
      json j = ManifestSummary(*digest, *m);
      if (as_json) {
        std::cout << j.dump() << "\n";
        return 0;
      }
      for (auto& [k, v] : j.items()) {
        std::cout << k << std::string(14 - std::min<size_t>(13, k.size()), ' ')
                  << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
      }
      return 0;
    }
    auto report = layerctl::Verify(*catalog, *digest);
    if (!report.ok()) return Fail(report.status());
    if (as_json) {
      std::cout << json{{"digest", digest->Hex()}, {"chunks", report->chunks}, {"bytes", report->bytes},
                        {"stored_bytes", report->stored_bytes}, {"compressed", report->compressed},
                        {"ok", report->ok()}, {"problems", report->problems}}.dump()
                << "\n";
    } else {
      for (const auto& p : report->problems) std::cout << "problem: " << p << "\n";
      std::cout << (report->ok() ? "ok" : "FAILED") << ": " << report->chunks << " chunks (" << report->compressed
                << " zstd), " << FormatBytes(report->bytes) << " checked, " << FormatBytes(report->stored_bytes)
                << " stored\n";
    }
    return report->ok() ? 0 : 2;
  }
  if (gc->parsed()) {
    auto grace = ParseDuration(grace_text);
    if (!grace.ok()) return Fail(grace.status());
    layerctl::GcOptions options;
    options.grace_seconds = std::chrono::duration_cast<std::chrono::seconds>(*grace).count();
    options.dry_run = dry_run;
    auto report = layerctl::CollectGarbage(*catalog, options);
    if (!report.ok()) return Fail(report.status());
    if (as_json) {
      std::cout << json{{"reachable_layers", report->reachable_layers}, {"leased_layers", report->leased_layers},
                        {"objects_scanned", report->objects_scanned}, {"newly_unreachable", report->newly_unreachable},
                        {"waiting", report->waiting}, {"deleted", report->deleted},
                        {"bytes_deleted", report->bytes_deleted}, {"would_delete", report->deleted_keys}}.dump()
                << "\n";
    } else {
      for (const auto& k : report->deleted_keys) std::cout << "would delete " << k << "\n";
      std::cout << report->reachable_layers << " layers reachable (" << report->leased_layers << " leased), "
                << report->objects_scanned << " objects scanned, " << report->deleted << " deleted ("
                << FormatBytes(report->bytes_deleted) << "), " << report->waiting
                << " unreachable within the grace period\n";
    }
    return 0;
  }
  return 0;
}
