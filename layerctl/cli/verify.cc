// layerctl verify: every chunk's hash checked and the assembled image
// fscked; exits 2 when a problem is found.
#include <iostream>
#include <memory>

#include "common/strings.h"
#include "layerctl/cli/cli.h"
#include "layerctl/inspect.h"

namespace strata::layerctl::cli {
namespace {

using nlohmann::json;

int VerifyLayer(const std::string& ref, const Cli& cli) {
  auto catalog = cli.OpenCatalog();
  if (!catalog.ok()) return Fail(catalog.status());
  auto digest = catalog->Resolve(ref);
  if (!digest.ok()) return Fail(digest.status());
  auto report = Verify(*catalog, *digest);
  if (!report.ok()) return Fail(report.status());
  if (cli.as_json) {
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

}  // namespace

void AddVerify(CLI::App& app, Cli& cli) {
  auto ref = std::make_shared<std::string>();
  auto* c = app.add_subcommand("verify", "check every chunk's hash and fsck the assembled image");
  c->add_option("REF", *ref, "NAME:VERSION or digest")->required();
  c->callback([ref, &cli] { cli.exit_code = VerifyLayer(*ref, cli); });
}

}  // namespace strata::layerctl::cli
