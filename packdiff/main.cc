// packdiff: an overlayfs upper directory into a diff layer; squash a chain of diffs.
#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cache/catalog.h"
#include "common/strings.h"
#include "packdiff/packdiff.h"

namespace {

using nlohmann::json;
using namespace strata;

std::optional<uint32_t> ParseId(const std::string& text) {
  uint32_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) return std::nullopt;
  return v;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "packdiff: %s\n", s.ToString().c_str());
  return 1;
}

json ReportJson(const packdiff::PackReport& r, const std::optional<cache::LayerRef>& tag) {
  json parents = json::array();
  for (const auto& p : r.parents) parents.push_back(p.Hex());
  const auto& w = r.written;
  json j = {{"digest", r.digest.Hex()},
            {"parents", parents},
            {"layer_bytes", r.layer_bytes},
            {"meta_size", r.manifest.meta_size},
            {"blob_size", r.manifest.blob_size},
            {"written",
             {{"directories", w.directories},
              {"opaque_directories", w.opaque_directories},
              {"files", w.files},
              {"file_bytes", w.file_bytes},
              {"symlinks", w.symlinks},
              {"specials", w.specials},
              {"hardlinks", w.hardlinks},
              {"whiteouts", w.whiteouts},
              {"whiteouts_dropped", w.whiteouts_dropped}}},
            {"upper",
             {{"entries", r.upper.entries},
              {"excluded", r.upper.excluded},
              {"sockets", r.upper.sockets},
              {"metacopy_resolved", r.upper.metacopy_resolved},
              {"redirects_resolved", r.upper.redirects_resolved},
              {"flags_dropped", r.upper.flags_dropped}}}};
  if (r.push) {
    j["chunks_uploaded"] = r.push->chunks_uploaded;
    j["bytes_uploaded"] = r.push->bytes_uploaded;
    j["chunks_present"] = r.push->chunks_present;
    j["bytes_present"] = r.push->bytes_present;
  }
  if (tag) j["tag"] = tag->ToString();
  return j;
}

void Print(const packdiff::PackReport& r, const std::optional<cache::LayerRef>& tag, bool as_json) {
  if (as_json) {
    std::cout << ReportJson(r, tag).dump() << "\n";
    return;
  }
  std::cout << r.digest.Hex() << "\n";
  const auto& w = r.written;
  std::fprintf(stderr, "diff layer %s: %llu files (%s), %llu directories (%llu opaque), %llu whiteouts, %llu hardlinks\n",
               FormatBytes(r.layer_bytes).c_str(), static_cast<unsigned long long>(w.files),
               FormatBytes(w.file_bytes).c_str(), static_cast<unsigned long long>(w.directories),
               static_cast<unsigned long long>(w.opaque_directories), static_cast<unsigned long long>(w.whiteouts),
               static_cast<unsigned long long>(w.hardlinks));
  if (r.upper.excluded || r.upper.sockets || r.upper.metacopy_resolved || r.upper.redirects_resolved) {
    std::fprintf(stderr, "upper: %llu excluded, %llu sockets left out, %llu metacopy and %llu redirected entries resolved\n",
                 static_cast<unsigned long long>(r.upper.excluded), static_cast<unsigned long long>(r.upper.sockets),
                 static_cast<unsigned long long>(r.upper.metacopy_resolved),
                 static_cast<unsigned long long>(r.upper.redirects_resolved));
  }
  if (r.push) {
    std::fprintf(stderr, "uploaded %s in %llu chunks, %s already present in %llu chunks%s\n",
                 FormatBytes(r.push->bytes_uploaded).c_str(), static_cast<unsigned long long>(r.push->chunks_uploaded),
                 FormatBytes(r.push->bytes_present).c_str(), static_cast<unsigned long long>(r.push->chunks_present),
                 tag ? (", tagged " + tag->ToString()).c_str() : "");
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"packdiff: turn an overlayfs upper directory into a diff layer; squash chains of diffs"};
  std::string store_url, tag_text, out_dir, upper, uid_shift_text, id_count_text = "65536";
  std::vector<std::string> parents, excludes, diffs;
  bool as_json = false, keep_devices = false;
  app.add_option("--store", store_url, "store URL (default: $STRATA_STORE, else /var/lib/strata/store)");
  app.add_flag("--json", as_json, "print a JSON report on stdout");
  app.add_option("-o,--output", out_dir, "also keep the layer's files (meta.img, blob.img, manifest.json) here");

  app.add_option("UPPER", upper, "the overlayfs upper directory");
  app.add_option("--parent", parents, "a layer the upper was made on (NAME:VERSION or digest), bottom first; repeat");
  app.add_option("--tag", tag_text, "publish the diff as NAME:VERSION");
  app.add_option("--exclude", excludes,
                 "leave out upper paths matching GLOB (with a '/': the whole path, else the last component); repeat");
  app.add_option("--uid-shift", uid_shift_text, "the upper holds host ids = container ids + N: map them back");
  app.add_option("--id-count", id_count_text, "how many ids the shift maps")->capture_default_str();
  app.add_flag("--keep-devices", keep_devices, "pack device nodes instead of refusing them");

  auto* squash = app.add_subcommand("squash", "merge a chain of diffs (bottom first) into one equivalent diff");
  squash->add_option("REF", diffs, "the diffs, bottom first")->required();
  squash->add_option("--tag", tag_text, "publish the result as NAME:VERSION")->required();
  squash->fallthrough();

  CLI11_PARSE(app, argc, argv);

  auto store = cache::OpenStore(cache::DefaultStoreUrl(store_url));
  if (!store.ok()) return Fail(store.status());
  cache::Catalog catalog(*store);
  auto tag = cache::ParseTag(tag_text);
  if (!tag.ok()) return Fail(tag_text.empty() ? Error(EINVAL, "give --tag NAME:VERSION") : tag.status());

  if (squash->parsed()) {
    auto report = packdiff::Squash({.diffs = diffs, .tag = *tag, .output_dir = out_dir}, catalog);
    if (!report.ok()) return Fail(report.status());
    Print(*report, *tag, as_json);
    return 0;
  }

  if (upper.empty()) return Fail(Error(EINVAL, "give the upper directory (packdiff UPPER --parent REF --tag NAME:VERSION)"));
  packdiff::PackOptions options{.upper = upper, .parents = parents, .tag = *tag, .excludes = excludes,
                                .keep_devices = keep_devices, .output_dir = out_dir};
  if (!uid_shift_text.empty()) {
    auto shift = ParseId(uid_shift_text), count = ParseId(id_count_text);
    if (!shift) return Fail(Error(EINVAL, "--uid-shift " + uid_shift_text + ": not a number from 0 to 4294967295"));
    if (!count || *count == 0) return Fail(Error(EINVAL, "--id-count " + id_count_text + ": not a positive number"));
    if (uint64_t{*shift} + *count > uint64_t{UINT32_MAX} + 1) {
      return Fail(Error(EINVAL, StrCat("--uid-shift ", *shift, " with --id-count ", *count, " passes the last id")));
    }
    options.id_shift = packdiff::IdShift{*shift, *count};
  }
  auto report = packdiff::PackUpper(options, catalog);
  if (!report.ok()) return Fail(report.status());
  Print(*report, *tag, as_json);
  return 0;
}
