// launcher doctor: check (and with --fix repair) what sandboxes need.
#include <cstdio>
#include <memory>

#include "common/units.h"
#include "launcher/backends/doctor.h"
#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  bool fix = false;
  std::string uppers_size = "64G";
};

int Doctor(const Flags& f, const Cli& cli) {
  DoctorOptions options;
  options.fix = f.fix;
  auto size = ParseSize(f.uppers_size);
  if (!size.ok()) return Fail(size.status().Annotate("--uppers-size"));
  options.uppers_size = *size;
  bool all_ok = true;
  for (const auto& c : RunDoctor(cli.node, options)) {
    std::printf("%-7s %-32s %s\n", c.fixed ? "fixed" : (c.ok ? "ok" : "FAIL"), c.name.c_str(), c.detail.c_str());
    all_ok &= c.ok;
  }
  if (f.fix) SweepStaleSandboxes(cli.node).IgnoreError();
  return all_ok ? 0 : 1;
}

}  // namespace

void AddDoctor(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("doctor", "check (and with --fix repair) what sandboxes need");
  c->add_flag("--fix", f->fix, "repair what can be repaired safely");
  c->add_option("--uppers-size", f->uppers_size, "size of the loop-file btrfs --fix creates for uppers")->capture_default_str();
  c->callback([f, &cli] { cli.exit_code = Doctor(*f, cli); });
}

}  // namespace strata::launcher::cli
