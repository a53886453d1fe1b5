// Unix stream sockets by path.
#include "common/unix_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "common/strings.h"

namespace strata {

namespace {

Result<sockaddr_un> Address(const std::string& path, std::string_view step) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return Error(ENAMETOOLONG, StrCat(step, " ", path, ": path longer than ", sizeof addr.sun_path - 1, " bytes"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

}  // namespace

Result<UniqueFd> ListenUnix(const std::string& path, mode_t mode, int backlog) {
  STRATA_ASSIGN_OR_RETURN(sockaddr_un addr, Address(path, "listen on"));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoError(errno, "create unix socket");
  {
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      return Error(EADDRINUSE, StrCat("listen on ", path, ": another server is answering there"));
    }
    ::unlink(path.c_str());
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return ErrnoError(errno, "bind " + path);
  if (::chmod(path.c_str(), mode) != 0) return ErrnoError(errno, "chmod " + path);
  if (::listen(fd.get(), backlog) != 0) return ErrnoError(errno, "listen on " + path);
  return fd;
}

Result<UniqueFd> ConnectUnix(const std::string& path, Duration reply_timeout) {
  STRATA_ASSIGN_OR_RETURN(sockaddr_un addr, Address(path, "connect to"));
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return ErrnoError(errno, "create unix socket");
  if (reply_timeout.count() > 0) {
    // SO_SNDTIMEO also bounds connect(): a server whose backlog is full
    // (it stopped accepting) fails the call instead of blocking it.
    auto us = std::chrono::duration_cast<std::chrono::microseconds>(reply_timeout).count();
    timeval tv{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
    if (::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0 ||
        ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
      return ErrnoError(errno, "set timeouts on a connection to " + path);
    }
  }
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    if (errno == EAGAIN) return Error(ETIMEDOUT, "connect to " + path + ": the server does not accept connections");
    return ErrnoError(errno, "connect to " + path);
  }
  return fd;
}

Status SendWithFd(int sock, std::string_view bytes, int fd) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* cm = CMSG_FIRSTHDR(&msg);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cm), &fd, sizeof fd);
  }
  ssize_t sent;
  while ((sent = ::sendmsg(sock, &msg, MSG_NOSIGNAL)) < 0) {
    if (errno != EINTR) return ErrnoError(errno, "sendmsg");
  }
  if (static_cast<size_t>(sent) != bytes.size()) {
    return Error(EMSGSIZE, StrCat("sendmsg: ", sent, " of ", bytes.size(), " bytes sent"));
  }
  return OkStatus();
}

}  // namespace strata
