// layerctl inspect: a layer's manifest, or with --files its tree (read from
// the metadata image, not mounted).
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>

#include "common/strings.h"
#include "layerctl/cli/cli.h"
#include "layerctl/inspect.h"

namespace strata::layerctl::cli {
namespace {

using nlohmann::json;

struct Flags {
  std::string ref;
  bool files = false;
};

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

json FileJson(const FileEntry& f) {
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
std::string FileLine(const FileEntry& f) {
  const erofs::Inode& in = f.inode;
  std::string size = StrCat(in.size);
  if (in.type == erofs::FileType::kCharDevice || in.type == erofs::FileType::kBlockDevice) {
    size = StrCat(major(in.rdev), ",", minor(in.rdev));
  }
  size_t stored = 0;
  for (const auto& e : f.extents) stored += !e.hole;
  char head[96];
  std::snprintf(head, sizeof head, "%c %04o %11s %12s %4zu ", FileTypeLetter(in.type), in.mode & 07777,
                StrCat(in.uid, ":", in.gid).c_str(), size.c_str(), stored);
  std::string line = head + Quote(f.path);
  if (in.type == erofs::FileType::kSymlink) line += " -> " + Quote(f.link_target);
  return line;
}

int Files(cache::Catalog& catalog, const Digest128& digest, const Cli& cli) {
  json list = json::array();
  if (!cli.as_json) std::cout << "T MODE   UID:GID         SIZE EXTS PATH\n";
  Status s = ListLayerFiles(catalog, digest, [&](const FileEntry& f) {
    if (cli.as_json) list.push_back(FileJson(f));
    else std::cout << FileLine(f) << "\n";
    return OkStatus();
  });
  if (!s.ok()) return Fail(s);
  if (cli.as_json) std::cout << json{{"digest", digest.Hex()}, {"files", list}}.dump() << "\n";
  return 0;
}

int Inspect(const Flags& f, const Cli& cli) {
  auto catalog = cli.OpenCatalog();
  if (!catalog.ok()) return Fail(catalog.status());
  auto digest = catalog->Resolve(f.ref);
  if (!digest.ok()) return Fail(digest.status());
  if (f.files) return Files(*catalog, *digest, cli);
  auto m = catalog->GetManifest(*digest);
  if (!m.ok()) return Fail(m.status());
  json j = ManifestSummary(*digest, *m);
  if (cli.as_json) {
    std::cout << j.dump() << "\n";
    return 0;
  }
  for (auto& [k, v] : j.items()) {
    std::cout << k << std::string(14 - std::min<size_t>(13, k.size()), ' ')
              << (v.is_string() ? v.get<std::string>() : v.dump()) << "\n";
  }
  return 0;
}

}  // namespace

void AddInspect(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("inspect", "show a layer's manifest, or with --files its tree");
  c->add_option("REF", f->ref, "NAME:VERSION or digest")->required();
  c->add_flag("--files", f->files, "list every path: type, mode, owner, size, extents (read from the metadata image, not mounted)");
  c->callback([f, &cli] { cli.exit_code = Inspect(*f, cli); });
}

}  // namespace strata::layerctl::cli
