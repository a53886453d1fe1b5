// UniqueFd: closes on reset and destruction.
#include "common/unique_fd.h"

#include <unistd.h>

namespace strata {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);  // close errors on read-side fds carry no information
  fd_ = fd;
}

}  // namespace strata
