// Unix stream sockets by path: listen (also to hand the socket to another
// process, as the launcher does for the agent) and connect.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "common/status.h"
#include "common/unique_fd.h"
#include "common/units.h"

namespace strata {

// Binds and listens on `path` (close-on-exec), chmod'ed to `mode`. A socket
// file nobody answers on is a leftover and is replaced; one a server still
// answers on is EADDRINUSE.
Result<UniqueFd> ListenUnix(const std::string& path, mode_t mode, int backlog = 128);

// Connects to `path` (close-on-exec). A non-zero `reply_timeout` bounds the
// connect (a full backlog: ETIMEDOUT) and each later read and write on the
// connection (SO_RCVTIMEO/SO_SNDTIMEO; one past it fails EAGAIN).
Result<UniqueFd> ConnectUnix(const std::string& path, Duration reply_timeout = Duration{0});

// Sends `bytes` in one sendmsg on a unix socket with descriptor `fd`
// attached (SCM_RIGHTS; -1: none). A stream socket may take part of
// `bytes` (EMSGSIZE then: callers send messages that fit).
Status SendWithFd(int sock, std::string_view bytes, int fd);

}  // namespace strata
