// layerctl ls: the store's tags, with each layer's kind, size and parents.
#include <algorithm>
#include <iostream>
#include <memory>

#include "common/strings.h"
#include "common/units.h"
#include "layerctl/cli/cli.h"

namespace strata::layerctl::cli {
namespace {

using nlohmann::json;

int List(const std::string& name, const Cli& cli) {
  auto catalog = cli.OpenCatalog();
  if (!catalog.ok()) return Fail(catalog.status());
  auto tags = catalog->ListTags(name);
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
  if (cli.as_json) {
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

}  // namespace

void AddLs(CLI::App& app, Cli& cli) {
  auto name = std::make_shared<std::string>();
  auto* c = app.add_subcommand("ls", "list tags: name, version, digest, kind, size, created, parents (diffs)");
  c->add_option("NAME", *name, "only this name");
  c->callback([name, &cli] { cli.exit_code = List(*name, cli); });
}

}  // namespace strata::layerctl::cli
