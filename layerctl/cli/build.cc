// layerctl build: a layer from a directory or a tar archive, written to a
// directory, pushed and tagged, or both.
#include <iostream>
#include <memory>

#include "common/fs.h"
#include "common/strings.h"
#include "common/units.h"
#include "layerctl/builder.h"
#include "layerctl/cli/cli.h"

namespace strata::layerctl::cli {
namespace {

struct Flags {
  std::string src, out_dir, kind = "base", name, chunk = "1M", tag, compress;
  std::string group = StrCat(kDefaultGroupSize >> 10, "K");
};

int Build(Flags f, const Cli& cli) {
  auto catalog = cli.OpenCatalog();
  if (!catalog.ok()) return Fail(catalog.status());
  auto push_options = ParsePushOptions(f.compress);
  if (!push_options.ok()) return Fail(push_options.status());
  auto to_tag = ParseOptionalTag(f.tag);
  if (!to_tag.ok()) return Fail(to_tag.status());
  if (!*to_tag && f.out_dir.empty()) return Fail(Error(EINVAL, "build: give -o DIR, --tag NAME:VERSION, or both"));
  if (!*to_tag && !f.compress.empty()) {
    return Fail(Error(EINVAL, "build: --compress applies to what --tag pushes; without --tag nothing is pushed"));
  }
  auto kind = cache::ParseLayerKind(f.kind);
  if (!kind.ok()) return Fail(kind.status());
  auto chunk = ParseSize(f.chunk);
  if (!chunk.ok()) return Fail(chunk.status());
  auto group = ParseSize(f.group);
  if (!group.ok()) return Fail(group.status().Annotate("build: --group-size"));
  if (*group > UINT32_MAX) return Fail(Error(EINVAL, StrCat("build: --group-size ", f.group, ": at most 4G")));
  std::optional<TempDir> tmp;
  if (f.out_dir.empty()) {
    auto t = TempDir::Create("strata-build");
    if (!t.ok()) return Fail(t.status());
    tmp.emplace(std::move(*t));
    f.out_dir = tmp->path();
  }
  BuildOptions options{.source = f.src, .output_dir = f.out_dir, .kind = *kind, .name = f.name,
                       .chunk_size = static_cast<uint32_t>(*chunk), .group_size = static_cast<uint32_t>(*group)};
  auto built = BuildLayer(options);
  if (!built.ok()) return Fail(built.status());
  if (!*to_tag) {
    if (cli.as_json) std::cout << ManifestSummary(built->digest, built->manifest).dump() << "\n";
    else std::cout << built->digest.Hex() << "\n";
    return 0;
  }
  auto report = Push(*built, *catalog, *to_tag, *push_options);
  if (!report.ok()) return Fail(report.status());
  PrintPush(*report, *to_tag, cli.as_json);
  return 0;
}

}  // namespace

void AddBuild(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("build", "build a layer from a directory or a tar archive (plain, gzip, zstd, xz, bzip2; - for stdin)");
  c->add_option("SRC", f->src, "directory or tar archive")->required();
  c->add_option("-o,--output", f->out_dir, "write meta.img, blob.img and manifest.json here");
  c->add_option("--kind", f->kind, "base, workspace, toolkit or diff")->capture_default_str();
  c->add_option("--name", f->name, "layer name recorded in the manifest");
  c->add_option("--chunk-size", f->chunk, "EROFS chunk size, the largest extent")->capture_default_str();
  c->add_option("--group-size", f->group,
                "small files' chunks side by side become one extent of at most this size (0: one extent per chunk)")
      ->capture_default_str();
  c->add_option("--tag", f->tag, "also push and tag as NAME:VERSION");
  c->add_option("--compress", f->compress, kCompressHelp);
  c->callback([f, &cli] { cli.exit_code = Build(*f, cli); });
}

}  // namespace strata::layerctl::cli
