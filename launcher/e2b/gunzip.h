// Gunzip: a gzip body decoded as it arrives (zlib's inflate, every member
// of a concatenation in turn), for envd uploads sent with
// Content-Encoding: gzip.
#pragma once

#include <zlib.h>

#include <functional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace strata::launcher::e2b {

class Gunzip {
 public:
  Gunzip();
  ~Gunzip();
  Gunzip(const Gunzip&) = delete;
  Gunzip& operator=(const Gunzip&) = delete;

  // Decodes `in`, handing each decoded piece to `out` (whose error ends
  // it); EINVAL for bytes that are not gzip or are damaged.
  Status Feed(std::string_view in, const std::function<Status(std::string_view)>& out);
  // OK once what was fed ends where a gzip member ends; EINVAL for a body
  // cut short (or empty).
  Status Finish() const;

 private:
  z_stream z_{};
  std::string out_;  // what inflate writes into, kept between pieces
  bool ready_ = false;  // inflateInit2 succeeded
  bool ended_ = false;  // the last member fed has ended
  bool any_ = false;    // a byte was fed
};

}  // namespace strata::launcher::e2b
