// What the agent's request handlers (agent.cc, call.cc, detached.cc,
// files.cc) share: the answers every request may give.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace strata::launcher::agent {

// Answers the request on `conn` with an error frame.
Status SendError(int conn, const Status& s);
// A request's JSON object; EINVAL for anything else.
Result<nlohmann::json> ParseJson(const std::string& payload);

}  // namespace strata::launcher::agent
