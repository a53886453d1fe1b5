// Frames on a stream.
#include "common/frame.h"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/strings.h"

namespace strata {

namespace {
void PutHeader(char* header, uint8_t type, size_t len) {
  header[0] = static_cast<char>(type);
  for (int i = 0; i < 4; ++i) header[1 + i] = static_cast<char>(static_cast<uint32_t>(len) >> (8 * i));
}

Result<uint32_t> HeaderLength(const char* header) {
  uint32_t len = 0;
  for (int i = 0; i < 4; ++i) len |= static_cast<uint32_t>(static_cast<uint8_t>(header[1 + i])) << (8 * i);
  if (len > kMaxFrame) return Error(EMSGSIZE, StrCat("frame of ", len, " bytes is too large"));
  return len;
}
}  // namespace

std::string EncodeFrame(uint8_t type, std::string_view payload) {
  std::string out(kFrameHeader, '\0');
  PutHeader(out.data(), type, payload.size());
  out.append(payload);
  return out;
}

Result<size_t> DecodeFrame(std::string_view buffer, uint8_t* type, std::string_view* payload) {
  if (buffer.size() < kFrameHeader) return size_t{0};
  STRATA_ASSIGN_OR_RETURN(uint32_t len, HeaderLength(buffer.data()));
  if (buffer.size() - kFrameHeader < len) return size_t{0};
  *type = static_cast<uint8_t>(buffer[0]);
  *payload = buffer.substr(kFrameHeader, len);
  return kFrameHeader + len;
}

Status WriteFrame(int fd, uint8_t type, std::string_view payload) {
  if (payload.size() > kMaxFrame) return Error(EMSGSIZE, StrCat("frame of ", payload.size(), " bytes is too large"));
  char header[kFrameHeader];
  PutHeader(header, type, payload.size());
  iovec iov[2] = {{header, sizeof header}, {const_cast<char*>(payload.data()), payload.size()}};
  size_t total = sizeof header + payload.size(), done = 0;
  while (done < total) {
    msghdr msg{};
    // Skip what was written already.
    iovec rest[2];
    int n = 0;
    size_t skip = done;
    for (auto& v : iov) {
      if (skip >= v.iov_len) {
        skip -= v.iov_len;
        continue;
      }
      rest[n++] = {static_cast<char*>(v.iov_base) + skip, v.iov_len - skip};
      skip = 0;
    }
    msg.msg_iov = rest;
    msg.msg_iovlen = static_cast<size_t>(n);
    ssize_t w = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == ENOTSOCK) w = ::writev(fd, rest, n);  // a pipe or a serial port
      if (w < 0) return ErrnoError(errno, "send frame");
    }
    done += static_cast<size_t>(w);
  }
  return OkStatus();
}

namespace {
Status ReadExactly(int fd, char* buf, size_t n, bool* clean_eof) {
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::read(fd, buf + done, n - done);
    if (r < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "read frame");
    }
    if (r == 0) {
      if (done == 0 && clean_eof) {
        *clean_eof = true;
        return Error(ENODATA, "connection closed");
      }
      return Error(EPIPE, "connection closed in the middle of a frame");
    }
    done += static_cast<size_t>(r);
  }
  return OkStatus();
}
}  // namespace

Status ReadFrame(int fd, uint8_t* type, std::string* payload) {
  char header[kFrameHeader];
  bool eof = false;
  STRATA_RETURN_IF_ERROR(ReadExactly(fd, header, sizeof header, &eof));
  STRATA_ASSIGN_OR_RETURN(uint32_t len, HeaderLength(header));
  *type = static_cast<uint8_t>(header[0]);
  payload->resize(len);
  return ReadExactly(fd, payload->data(), len, nullptr);
}

}  // namespace strata
