// Gunzip on zlib's inflate.
#include "launcher/e2b/gunzip.h"

#include <string>

#include "common/strings.h"

namespace strata::launcher::e2b {

namespace {

constexpr size_t kOutChunk = 64 << 10;
constexpr int kGzipOnly = 16 + MAX_WBITS;  // (inflateInit2: a gzip header and trailer, no raw or zlib stream)

}  // namespace

Gunzip::Gunzip() { ready_ = ::inflateInit2(&z_, kGzipOnly) == Z_OK; }

Gunzip::~Gunzip() {
  if (ready_) ::inflateEnd(&z_);
}

Status Gunzip::Feed(std::string_view in, const std::function<Status(std::string_view)>& out) {
  if (!ready_) return Error(ENOMEM, "gzip: set up the decoder");
  std::string& buf = out_;
  if (buf.empty()) buf.resize(kOutChunk);
  while (!in.empty()) {
    if (ended_) {
      // Another member follows (gzip allows a concatenation).
      if (::inflateReset(&z_) != Z_OK) return Error(EIO, "gzip: reset the decoder");
      ended_ = false;
    }
    any_ = true;
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    z_.avail_in = static_cast<uInt>(std::min<size_t>(in.size(), 1u << 30));
    const size_t given = z_.avail_in;
    int rc = Z_OK;
    do {
      z_.next_out = reinterpret_cast<Bytef*>(buf.data());
      z_.avail_out = static_cast<uInt>(buf.size());
      rc = ::inflate(&z_, Z_NO_FLUSH);
      if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
        return Error(EINVAL, StrCat("gzip: the body is not gzip or is damaged (", z_.msg ? z_.msg : "zlib error", ")"));
      }
      const size_t made = buf.size() - z_.avail_out;
      if (made > 0) STRATA_RETURN_IF_ERROR(out({buf.data(), made}));
    } while (rc != Z_STREAM_END && (z_.avail_in > 0 || z_.avail_out == 0));
    in.remove_prefix(given - z_.avail_in);
    if (rc == Z_STREAM_END) ended_ = true;
  }
  return OkStatus();
}

Status Gunzip::Finish() const {
  if (!any_) return Error(EINVAL, "gzip: the body is empty (a gzip stream has at least a header and a trailer)");
  if (!ended_) return Error(EINVAL, "gzip: the body ends in the middle of its stream (cut short?)");
  return OkStatus();
}

}  // namespace strata::launcher::e2b
