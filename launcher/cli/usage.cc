// launcher usage: what a sandbox uses now (CPU, memory, disk), as the node sees it.
#include <cstdio>
#include <memory>

#include "common/strings.h"
#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string id;
  bool json = false;
  ClientFlags client;
};

// "45.1 MiB of 512 MiB", "3.2 MiB (no limit)", or "unknown".
std::string Of(const nlohmann::json& j) {
  if (!j.contains("used")) return "unknown";
  const uint64_t limit = j.value("limit", uint64_t{0});
  return StrCat(FormatBytes(j["used"].get<uint64_t>()), limit ? " of " + FormatBytes(limit) : std::string(" (no limit)"));
}

int Usage(const Flags& f) {
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  auto r = client->Usage(f.id);
  if (!r.ok()) return Fail(r.status());
  if (f.json) {
    std::printf("%s\n", r->dump(2).c_str());
    return 0;
  }
  const nlohmann::json cpu = r->value("cpu", nlohmann::json::object());
  const nlohmann::json memory = r->value("memory", nlohmann::json::object());
  std::printf("cpu     %s\n", cpu.contains("seconds") ? StrCat(cpu["seconds"].get<double>(), " s used").c_str() : "unknown");
  std::printf("memory  %s%s\n", Of(memory).c_str(),
              memory.contains("cache") ? StrCat(", page cache ", FormatBytes(memory["cache"].get<uint64_t>())).c_str() : "");
  std::printf("disk    %s\n", Of(r->value("disk", nlohmann::json::object())).c_str());
  if (r->value("shared", false)) std::printf("(a function-call sandbox: its pool's, shared by the pool's sandboxes)\n");
  return 0;
}

}  // namespace

void AddUsage(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("usage", "show what a sandbox uses now: CPU time, memory and disk against its limits");
  c->add_option("ID", f->id, "sandbox id")->required();
  c->add_flag("--json", f->json, "print the API's answer");
  f->client.Add(c);
  c->callback([f, &cli] { cli.exit_code = Usage(*f); });
}

}  // namespace strata::launcher::cli
