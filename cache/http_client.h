// HttpClient: the one mechanism every remote store (http://, s3://) uses to
// talk to its server: a pool of libcurl handles shared by threads (so
// connections are reused), and the timeout, retry and deadline policy.
#pragma once

#include <atomic>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/units.h"

namespace strata::cache {

// How hard a remote call tries. Every remote store URL accepts these as
// query parameters (docs/cli.md): timeout, connect_timeout, attempts,
// backoff, backoff_max, deadline.
struct HttpOptions {
  Duration connect_timeout = std::chrono::seconds(5);
  // One attempt, connection to last byte.
  Duration attempt_timeout = std::chrono::seconds(30);
  // Attempts in all, the first included (>= 1).
  int attempts = 5;
  // Backoff before attempt n+1 is uniform in [0, min(backoff_max,
  // backoff_initial * 2^(n-1))] ("full jitter").
  Duration backoff_initial = std::chrono::milliseconds(100);
  Duration backoff_max = std::chrono::seconds(5);
  // The whole call, every attempt and backoff included.
  Duration deadline = std::chrono::seconds(120);
  // Talk HTTP over this unix socket instead of TCP (the node daemons' APIs).
  std::string unix_socket;
  // Trust the server certificates this PEM file's CAs signed (https://);
  // empty: the system's CAs.
  std::string ca_file;
};

// Loads libcurl now; otherwise the first request does (about 20 ms with the
// TLS libraries it brings). A long-running daemon calls it once it has
// started, off its request path. The error says why libcurl cannot be had.
Status LoadHttp();

// Applies one query parameter to `options`. Returns false (and leaves the
// options alone) when `name` is not one of the knobs above; an error when the
// value does not parse.
Result<bool> ApplyHttpOption(std::string_view name, std::string_view value, HttpOptions* options);

// A URL split into its part before '?' and its decoded query parameters,
// in the order given.
struct ParsedUrl {
  std::string base;
  std::vector<std::pair<std::string, std::string>> params;
};
ParsedUrl SplitUrlQuery(std::string_view url);

// Percent-encoding as SigV4 defines it (and any HTTP server accepts):
// every byte except A-Z a-z 0-9 - _ . ~ becomes %XX (uppercase hex);
// EncodeUrlPath also keeps '/'.
std::string EncodeUrlComponent(std::string_view s);
std::string EncodeUrlPath(std::string_view s);
// Decodes %XX (and '+' as a space when `plus_is_space`); invalid escapes
// are kept as they are.
std::string DecodeUrlComponent(std::string_view s, bool plus_is_space = false);

struct HttpRequest {
  std::string method = "GET";  // GET, HEAD, PUT, DELETE, MOVE, ...
  std::string url;             // already encoded
  std::vector<std::string> headers;  // "Name: value"
  std::string_view body;             // the upload of a PUT; must outlive the call
  // When `out` is non-empty, a 2xx body is written into it (up to its
  // size) instead of HttpResponse::body; the first `skip_on_200` bytes of a
  // 200 answer are dropped (a server that ignored a Range header).
  std::span<char> out;
  uint64_t skip_on_200 = 0;
  // SigV4 signing by libcurl: CURLOPT_AWS_SIGV4 ("aws:amz:<region>:s3")
  // with this key pair; empty: unsigned.
  std::string aws_sigv4;
  std::string access_key;
  std::string secret_key;
  // When set, a 2xx body is handed to it piece by piece as it arrives (a
  // streamed answer) instead of being collected; returning false cuts the
  // transfer. Use with attempts = 1: a retry would replay the pieces.
  std::function<bool(std::string_view)> sink;
  // Called on every 2xx answer; an error makes the attempt count as failed
  // (retried like a broken connection): for answers that are well-formed
  // HTTP but not what was asked for, such as a wrong Content-Range.
  std::function<Status(const struct HttpResponse&)> check;
  // Every answer, 5xx too, is returned as it is (never retried): for APIs
  // whose error bodies say what went wrong.
  bool any_status = false;
  // A relay of the answer as it comes (a proxy): called once with the
  // final status and headers as soon as they are in (before any body);
  // then the body of any status goes to `sink`. Returning false cuts the transfer. Use with
  // attempts = 1.
  std::function<bool(const struct HttpResponse& head)> on_headers;
  // With POST or PUT: the body is read from this as it is sent (chunked
  // when `source_size` is -1) instead of from `body`. It fills up to `n`
  // bytes and returns how many, 0 at the end, or kAbortSource to cut the
  // transfer; it may block. Use with attempts = 1.
  static constexpr size_t kAbortSource = 0x10000000;
  std::function<size_t(char* buf, size_t n)> source;
  int64_t source_size = -1;
  // When set, the transfer is cut soon (within about a second) after it
  // turns true, even while the server sends nothing.
  const std::atomic<bool>* cancel = nullptr;
};

struct HttpResponse {
  long status = 0;          // the final HTTP status
  std::string status_line;  // "HTTP/1.1 404 Not Found"
  // A 2xx body when HttpRequest::out is empty; otherwise at most the first
  // 4 KiB of a non-2xx body (for error details).
  std::string body;
  size_t out_bytes = 0;  // bytes written into HttpRequest::out
  std::vector<std::pair<std::string, std::string>> headers;  // names lowercased
  int attempts = 0;

  // The value of header `name` (lowercase), or nullopt.
  std::optional<std::string_view> Header(std::string_view name) const;
  std::optional<uint64_t> ContentLength() const;
};

// The check a range GET needs (HttpRequest::check): a 206 must carry a
// Content-Range starting at `offset`, no longer than `asked`, matching the
// bytes that arrived. Other answers pass.
Status CheckRangeAnswer(const HttpResponse& response, uint64_t offset, size_t asked);

class HttpClient {
 public:
  // `store_name` starts every error message: "http store http://host/x".
  HttpClient(std::string store_name, HttpOptions options);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Performs `request`, retrying connection errors, timeouts, 5xx, 429 and
  // failed checks with backoff, within the attempt count and the deadline;
  // never retrying other statuses. Returns the response for any final
  // status that was not retried (the caller decides what 404 means), and an
  // error naming the store, `step` ("get chunks/ab/ab12..."), the attempts
  // and the last answer when every attempt failed (EIO, ECONNREFUSED,
  // EAGAIN for 429) or the deadline passed (ETIMEDOUT). Thread-safe.
  Result<HttpResponse> Perform(const HttpRequest& request, std::string_view step);

  // The error for a final status the caller does not accept, with errno by
  // status (404 ENOENT, 401/403 EACCES, 400 EINVAL, 405/501 ENOTSUP,
  // 413 EFBIG, 507 ENOSPC, else EIO): "<store>: <step>: HTTP 403 (<status
  // line>)[: <detail>]".
  Status StatusError(const HttpResponse& response, std::string_view step, std::string_view detail = {}) const;

  const HttpOptions& options() const { return options_; }
  const std::string& store_name() const { return store_name_; }

 private:
  class Pool;
  // Loads libcurl (on first use by any client) and makes the pool, once.
  Status Start();

  std::string store_name_;
  HttpOptions options_;
  std::once_flag started_;
  Status start_error_;
  std::unique_ptr<Pool> pool_;
};

}  // namespace strata::cache
