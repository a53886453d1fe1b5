// PackUpper and Squash: read, translate, build, publish.
#include "packdiff/packdiff.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"
#include "layerctl/builder.h"
#include "packdiff/squash.h"

namespace strata::packdiff {
namespace {

constexpr std::string_view kBuildDirPrefix = "strata-packdiff.";

std::string TmpBase() {
  const char* base = std::getenv("TMPDIR");
  return base && *base ? base : "/tmp";
}

// The directory the layer is built in: the caller's, or a temporary one
// named after this process so a later run can tell it was abandoned.
struct BuildDir {
  std::optional<TempDir> temp;
  std::string path;
};

Result<BuildDir> MakeBuildDir(const std::string& wanted) {
  BuildDir dir;
  if (!wanted.empty()) {
    dir.path = wanted;
    return dir;
  }
  SweepStaleBuildDirs();
  STRATA_ASSIGN_OR_RETURN(TempDir temp, TempDir::Create(StrCat(kBuildDirPrefix, ::getpid())));
  dir.path = temp.path();
  dir.temp.emplace(std::move(temp));
  return dir;
}

// Builds (and publishes) the layer the tree describes.
Result<PackReport> BuildAndPublish(const ChangeNode& tree, const LowerStack& parents, const WriteHooks& hooks,
                                   const std::function<Status()>& before_finish, layerctl::BuildOptions build,
                                   const std::optional<cache::LayerRef>& tag, bool publish, size_t parallel,
                                   const cache::Catalog& catalog, PackReport report) {
  STRATA_ASSIGN_OR_RETURN(BuildDir dir, MakeBuildDir(build.output_dir));
  build.output_dir = dir.path;
  auto fill = [&](erofs::ImageWriter& writer) -> Status {
    STRATA_ASSIGN_OR_RETURN(report.written, WriteChangeTree(tree, parents, hooks, writer));
    return before_finish ? before_finish() : OkStatus();
  };
  STRATA_ASSIGN_OR_RETURN(layerctl::BuiltLayer layer, layerctl::BuildLayerFrom(build, fill));
  report.digest = layer.digest;
  report.parents = layer.manifest.parents;
  report.layer_bytes = layer.manifest.meta_size + layer.manifest.blob_size;
  if (publish) {
    STRATA_ASSIGN_OR_RETURN(report.push, layerctl::Push(layer, catalog, tag, {.parallel = parallel}));
  }
  report.manifest = std::move(layer.manifest);
  return report;
}

}  // namespace

void SweepStaleBuildDirs() {
  const std::string base = TmpBase();
  DIR* d = ::opendir(base.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (!name.starts_with(kBuildDirPrefix)) continue;
    std::string_view rest = name.substr(kBuildDirPrefix.size());
    const size_t dash = rest.find('-');
    if (dash == 0 || dash == std::string_view::npos) continue;
    pid_t pid = 0;
    bool digits = true;
    for (char c : rest.substr(0, dash)) {
      if (c < '0' || c > '9') digits = false;
      else pid = pid * 10 + (c - '0');
    }
    if (!digits || pid <= 0 || pid == ::getpid()) continue;
    if (::kill(pid, 0) != 0 && errno == ESRCH) stale.emplace_back(JoinPath(base, name));
  }
  ::closedir(d);
  for (const std::string& dir : stale) {
    Status s = RemoveTree(dir);
    if (!s.ok()) STRATA_LOG(kWarn) << "remove an abandoned packdiff build directory: " << s.ToString();
  }
}

Result<PackReport> PackUpper(const PackOptions& options, const cache::Catalog& catalog) {
  auto where = [&](std::string_view step) { return StrCat("pack upper ", options.upper, ": ", step); };
  if (options.parents.empty()) {
    return Error(EINVAL, where("name the layers it was made on (--parent REF, bottom first)"));
  }
  if (options.publish && !options.tag) return Error(EINVAL, where("publishing needs a tag (--tag NAME:VERSION)"));

  // 1. The parents: resolved as a sandbox resolves its stack, then opened
  //    (their metadata images) for the questions the upper raises.
  auto stack = catalog.ResolveStack(options.parents);
  if (!stack.ok()) return stack.status().Annotate(where("resolve the parents"));
  std::vector<Digest128> parent_digests;
  for (const auto& layer : *stack) parent_digests.push_back(layer.digest);
  auto parents = LowerStack::Open(catalog, parent_digests);
  if (!parents.ok()) return parents.status().Annotate(where("read the parents"));

  // 2. The upper, listed into a tree in layer terms.
  UpperOptions upper_options{options.upper, options.excludes, options.id_shift, options.keep_devices};
  auto reader = UpperReader::Open(upper_options, *parents);
  if (!reader.ok()) return reader.status().Annotate(StrCat("pack upper ", options.upper));
  auto tree = (*reader)->Read();
  if (!tree.ok()) return tree.status().Annotate(where("read"));
  if (options.after_listing) options.after_listing();

  // 3. The layer: data read as it is written, everything checked again at
  //    the end, then published.
  PackReport report;
  report.upper = (*reader)->stats();
  layerctl::BuildOptions build{.source = options.upper,
                               .output_dir = options.output_dir,
                               .kind = cache::LayerKind::kDiff,
                               .name = !options.name.empty() ? options.name : options.tag ? options.tag->name : "",
                               .parents = parent_digests,
                               .chunk_size = stack->back().manifest->chunk_size};
  WriteHooks hooks{[&](const std::string& rel) { return (*reader)->OpenFile(rel); }};
  auto packed = BuildAndPublish(**tree, *parents, hooks, [&] { return (*reader)->CheckUnchanged(); }, build,
                                options.tag, options.publish, options.parallel, catalog, std::move(report));
  if (!packed.ok()) return packed.status().Annotate(where("pack"));
  return packed;
}

Result<PackReport> Squash(const SquashOptions& options, const cache::Catalog& catalog) {
  auto where = [&](std::string_view step) { return StrCat("squash ", Join(options.diffs, " "), ": ", step); };
  if (options.diffs.empty()) return Error(EINVAL, "squash: name the diffs to merge, bottom first");
  if (options.publish && !options.tag) return Error(EINVAL, where("publishing needs a tag (--tag NAME:VERSION)"));

  // 1. The chain: every diff's parents are the previous diff's plus it.
  std::vector<std::shared_ptr<const PublishedLayer>> diffs;
  std::vector<Digest128> expected;
  for (const std::string& ref : options.diffs) {
    auto digest = catalog.Resolve(ref);
    if (!digest.ok()) return digest.status().Annotate(where("resolve"));
    auto layer = PublishedLayer::Open(catalog, *digest);
    if (!layer.ok()) return layer.status().Annotate(where("read " + ref));
    const cache::Manifest& m = (*layer)->manifest();
    if (m.kind != cache::LayerKind::kDiff) {
      return Error(EINVAL, where(StrCat(ref, " is a ", cache::LayerKindName(m.kind), " layer, not a diff")));
    }
    if (diffs.empty()) {
      expected = m.parents;
    } else if (m.parents != expected) {
      std::vector<std::string> want, got;
      for (const auto& p : expected) want.push_back(p.Hex().substr(0, 12));
      for (const auto& p : m.parents) got.push_back(p.Hex().substr(0, 12));
      return Error(EINVAL, where(StrCat(ref, " was made on [", Join(got, ", "), "], not on [", Join(want, ", "),
                                        "] (the first diff's parents and the diffs named before it); name the "
                                        "chain bottom first, each diff once")));
    }
    expected.push_back(*digest);
    diffs.push_back(std::move(*layer));
  }
  const std::vector<Digest128> parent_digests = diffs.front()->manifest().parents;

  // 2. One tree from the chain, written over the bottom diff's parents.
  auto tree = SquashDiffs(diffs);
  if (!tree.ok()) return tree.status().Annotate(where("merge"));
  auto parents = LowerStack::Open(catalog, parent_digests);
  if (!parents.ok()) return parents.status().Annotate(where("read the parents"));
  layerctl::BuildOptions build{.source = "diffs " + Join(options.diffs, " "),
                               .output_dir = options.output_dir,
                               .kind = cache::LayerKind::kDiff,
                               .name = !options.name.empty() ? options.name : options.tag ? options.tag->name : "",
                               .parents = parent_digests,
                               .chunk_size = diffs.front()->manifest().chunk_size};
  auto squashed = BuildAndPublish(**tree, *parents, WriteHooks{}, nullptr, build, options.tag, options.publish,
                                  options.parallel, catalog, PackReport{});
  if (!squashed.ok()) return squashed.status().Annotate(where("build"));
  return squashed;
}

}  // namespace strata::packdiff
