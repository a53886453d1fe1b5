// Directory trees as tar streams on the node API (PUT/GET files?format=tar):
// libarchive on the daemon's side, the agent's entry-by-entry tree
// protocol on the sandbox's. libarchive is loaded on first use (like
// libcurl and libmicrohttpd), so a `launcher run` never pays for it.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "launcher/front/http_server.h"
#include "launcher/sandbox/agent_client.h"

namespace strata::launcher {

// An upload whose body is a tar (plain, gzip, zstd, xz, bzip2) unpacked
// into the sandbox through `stream`: regular files, directories, symbolic
// and hard links (other types are skipped). Answers {"entries": N}.
Result<std::unique_ptr<HttpServer::Upload>> TarUpload(std::unique_ptr<AgentClient::TreeStream> stream);

// Writes the tree below `path` in the sandbox as a pax tar to `write`
// (false: the client went away). `Check` first: whether the tree can be
// read at all, so the answer's status can still say it.
Status CheckTree(AgentClient& agent, const std::string& path);
Status TreeToTar(AgentClient& agent, const std::string& path, const std::function<bool(std::string_view)>& write);

}  // namespace strata::launcher
