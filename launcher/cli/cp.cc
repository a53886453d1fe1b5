// launcher cp: a file into or out of a sandbox (ID:/path).
#include <sys/stat.h>

#include <memory>
#include <utility>

#include "common/fs.h"
#include "launcher/cli/cli.h"

namespace strata::launcher::cli {
namespace {

struct Flags {
  std::string src, dst;
  ClientFlags client;
};

// "ID:/path" -> (id, path); a plain path -> ("", path).
std::pair<std::string, std::string> SplitCopyArg(const std::string& arg) {
  size_t colon = arg.find(':');
  if (colon != std::string::npos && arg.starts_with("sb-")) return {arg.substr(0, colon), arg.substr(colon + 1)};
  return {"", arg};
}

int Copy(const Flags& f) {
  auto [src_id, src_path] = SplitCopyArg(f.src);
  auto [dst_id, dst_path] = SplitCopyArg(f.dst);
  if (src_id.empty() == dst_id.empty()) return Fail(Error(EINVAL, "cp: exactly one of SRC and DST must be ID:/path"));
  auto client = f.client.Connect();
  if (!client.ok()) return Fail(client.status());
  if (dst_id.empty()) {
    auto data = client->Get(src_id, src_path);
    if (!data.ok()) return Fail(data.status());
    return Done(WriteFileAtomic(dst_path, *data, false));
  }
  auto data = ReadFileToString(src_path);
  if (!data.ok()) return Fail(data.status());
  struct stat st{};
  ::stat(src_path.c_str(), &st);
  return Done(client->Put(dst_id, dst_path, *data, st.st_mode & 07777));
}

}  // namespace

void AddCp(CLI::App& app, Cli& cli) {
  auto f = std::make_shared<Flags>();
  auto* c = app.add_subcommand("cp", "copy a file into or out of a sandbox (ID:/path)");
  c->add_option("SRC", f->src, "file or ID:/path")->required();
  c->add_option("DST", f->dst, "file or ID:/path")->required();
  f->client.Add(c);
  c->callback([f, &cli] { cli.exit_code = Copy(*f); });
}

}  // namespace strata::launcher::cli
