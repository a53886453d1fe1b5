// launcher ls: the daemon's sandboxes.
#include <cstdio>
#include <memory>

#include "common/strings.h"
#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

using nlohmann::json;

struct Flags {
  bool as_json = false;
  ClientFlags client;
};

int List(const Flags& f) {
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  auto list = client->List();
  if (!list.ok()) return Fail(list.status());
  if (f.as_json) {
    std::printf("%s\n", list->dump().c_str());
    return 0;
  }
  std::printf("%-16s %-10s %-8s %-6s %s\n", "ID", "BACKEND", "STATE", "NET", "LAYERS");
  for (const auto& s : *list) {
    std::vector<std::string> names;
    for (const auto& l : s["layers"]) names.push_back(l.value("name", "") + "@" + l.value("digest", "").substr(0, 12));
    const json net_info = s.value("network", json::object());
    const std::string mode = net_info.is_object() ? net_info.value("mode", "none") : net_info.get<std::string>();
    std::printf("%-16s %-10s %-8s %-6s %s\n", s.value("id", "").c_str(), s.value("backend", "").c_str(),
                s.value("state", "").c_str(), mode.c_str(), Join(names, " ").c_str());
  }
  return 0;
}

}  // namespace

void AddLs(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("ls", "list the daemon's sandboxes");
  c->add_flag("--json", f->as_json, "print JSON");
  f->client.Add(c);
  c->callback([f, &cli] { cli.exit_code = List(*f); });
}

}  // namespace strata::launcher::cli
