// What the agent's request handlers (agent.cc, call.cc, detached.cc,
// files.cc) share: the answers every request may give.
#pragma once

#include <cstdint>
#include <string>

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
