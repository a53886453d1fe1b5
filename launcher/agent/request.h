// What the agent's request handlers (agent.cc, call.cc, detached.cc,
// files.cc) share: the answers every request may give.
#pragma once

#include <sys/ioctl.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace strata::launcher::agent {

// Answers the request on `conn` with an error frame.
Status SendError(int conn, const Status& s);
// A request's JSON object; EINVAL for anything else.
Result<nlohmann::json> ParseJson(const std::string& payload);

// The names a put writes into before it renames the file into place
// (files.cc); a watch does not show them (watch.cc).
inline constexpr const char* kPutTempPrefix = ".strata-put-";

// The names in directory `dir` but "." and "..", sorted; an error names
// `what` and the directory (fs_ops.cc).
Result<std::vector<std::string>> DirNames(const std::string& dir, const char* what);

// A terminal's size from {"cols", "rows"} (each 1 to 10000; 80 by 24 when
// missing); EINVAL for anything else (call.cc).
Result<struct winsize> TerminalSize(const nlohmann::json& size);

// A user of the sandbox's own /etc/passwd: its ids and home (fs_ops.cc).
struct User {
  uint32_t uid = 0, gid = 0;
  std::string home;
};
Result<User> LookupUser(const std::string& name);
// MakeDirs, with every directory it made given to `user` (a name of
// /etc/passwd; empty, "root" or one it lacks: root's).
Status MakeDirsAs(const std::string& path, const std::string& user);

}  // namespace strata::launcher::agent
