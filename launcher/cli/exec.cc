// launcher exec: a command in a sandbox; exits with its code.
#include <unistd.h>

#include <memory>

#include "common/strings.h"
#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string id, role = "agent";
  ExecRequest request;
  std::vector<std::string> deny, read_only;
  bool with_stdin = false, kill_leftovers = false, keep_leftovers = false;
  ExecFlags exec;
  ClientFlags client;
};

int Exec(const Flags& f, const Cli& cli) {
  if (cli.command.empty()) return Fail(Error(EINVAL, "exec: no command given (launcher exec ID -- CMD [ARG ...])"));
  ExecRequest request = f.request;
  request.argv = cli.command;
  if (!f.deny.empty() || !f.read_only.empty()) {
    auto rules = MakeFileRules(f.deny, f.read_only, "--deny/--read-only");
    if (!rules.ok()) return Fail(rules.status());
    request.files = std::move(*rules);
  }
  if (f.role != "agent" && f.role != "grader") return Fail(Error(EINVAL, "--role: agent or grader, not " + Quote(f.role)));
  request.grader = f.role == "grader";
  if (f.kill_leftovers && f.keep_leftovers) return Fail(Error(EINVAL, "--kill-leftovers and --keep-leftovers: choose one"));
  if (f.kill_leftovers || f.keep_leftovers) request.kill_leftovers = f.kill_leftovers;
  if (Status s = f.exec.Apply(&request); !s.ok()) return Fail(s);
  if (f.with_stdin) {
    std::string in;
    char buf[65536];
    ssize_t n;
    while ((n = ::read(STDIN_FILENO, buf, sizeof buf)) > 0) in.append(buf, static_cast<size_t>(n));
    request.stdin_data = std::move(in);
  }
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  auto result = client->Exec(f.id, ExecJson(request), Print);
  if (!result.ok()) return Fail(result.status());
  return Report(*result, request.stdout_cap, 0);
}

}  // namespace

void AddExec(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("exec", "run a command in a sandbox; exits with its code");
  c->add_option("ID", f->id, "sandbox id")->required();
  c->add_option("--env", f->request.env, "K=V for the command");
  c->add_option("--workdir", f->request.cwd, "working directory (default: the sandbox's)");
  c->add_flag("-i,--stdin", f->with_stdin, "pass this process's stdin to the command");
  c->add_option("--deny", f->deny, "PATH this command may not read, list, write or run (repeatable)");
  c->add_option("--read-only", f->read_only, "PATH this command may not change (repeatable)");
  c->add_flag("--kill-leftovers", f->kill_leftovers, "kill what the command leaves running when it ends (default: the sandbox's)");
  c->add_flag("--keep-leftovers", f->keep_leftovers, "keep it running (the default unless the sandbox says otherwise)");
  c->add_option("--role", f->role, "agent, or grader: run without the sandbox's file rules")->capture_default_str();
  f->exec.Add(c);
  f->client.Add(c);
  c->footer("Command: launcher exec ID [options] -- CMD [ARG ...]");
  c->callback([f, &cli] { cli.exit_code = Exec(*f, cli); });
}

}  // namespace strata::launcher::cli
