// HttpClient: libcurl transfers, the handle pool, and the retry policy.
//
// Why a pool of easy handles rather than one multi handle: callers are
// already threads (the chunk cache's fetch workers), each blocking on one
// object, and an easy handle keeps its connection alive after a transfer, so
// handing handles back to a pool is all connection reuse needs. DNS answers
// and TLS sessions are shared across the handles through one CURLSH.
#include "cache/http_client.h"

#define CURL_DISABLE_TYPECHECK  // curl_easy_setopt as a function, so it has an address type
#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <random>
#include <thread>

#include "common/dynlib.h"
#include "common/log.h"
#include "common/strings.h"

namespace strata::cache {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kErrorBodyCap = 4096;
constexpr size_t kMaxIdleHandles = 64;
constexpr size_t kMaxReserve = size_t{1} << 30;  // trust Content-Length only this far

// The one exception boundary of every curl callback: nothing thrown may
// unwind through libcurl's C frames. `fallback` is what the callback returns
// to curl instead (an abort value for data callbacks).
template <typename R, typename F>
R Guarded(const char* callback, R fallback, F&& body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    try {
      STRATA_LOG(kError) << "curl " << callback << " callback: " << e.what();
    } catch (...) {
    }
  } catch (...) {
    try {
      STRATA_LOG(kError) << "curl " << callback << " callback: unknown exception";
    } catch (...) {
    }
  }
  return fallback;
}

// libcurl is loaded when the first HttpClient needs it, not at program
// start (common/dynlib.h): most runs of our tools never speak HTTP (a
// file:// store; the launcher, whose node-local sockets use frames).
struct CurlApi {
  Status status;  // why loading failed
  decltype(&curl_global_init) global_init = nullptr;
  decltype(&curl_easy_init) easy_init = nullptr;
  decltype(&curl_easy_cleanup) easy_cleanup = nullptr;
  decltype(&curl_easy_reset) easy_reset = nullptr;
  decltype(&curl_easy_setopt) easy_setopt = nullptr;
  decltype(&curl_easy_perform) easy_perform = nullptr;
  decltype(&curl_easy_strerror) easy_strerror = nullptr;
  decltype(&curl_share_init) share_init = nullptr;
  decltype(&curl_share_setopt) share_setopt = nullptr;
  decltype(&curl_share_cleanup) share_cleanup = nullptr;
  decltype(&curl_slist_append) slist_append = nullptr;
  decltype(&curl_slist_free_all) slist_free_all = nullptr;
};

const CurlApi& Curl() {
  static const CurlApi api = [] {
    CurlApi a;
    auto lib = DynamicLibrary::Open(STRATA_CURL_SONAME, "libcurl4");
    if (!lib.ok()) {
      a.status = lib.status();
      return a;
    }
    auto get = [&](auto& fn, const char* name) {
      if (a.status.ok()) a.status = lib->Resolve(fn, name);
    };
    get(a.global_init, "curl_global_init");
    get(a.easy_init, "curl_easy_init");
    get(a.easy_cleanup, "curl_easy_cleanup");
    get(a.easy_reset, "curl_easy_reset");
    get(a.easy_setopt, "curl_easy_setopt");
    get(a.easy_perform, "curl_easy_perform");
    get(a.easy_strerror, "curl_easy_strerror");
    get(a.share_init, "curl_share_init");
    get(a.share_setopt, "curl_share_setopt");
    get(a.share_cleanup, "curl_share_cleanup");
    get(a.slist_append, "curl_slist_append");
    get(a.slist_free_all, "curl_slist_free_all");
    if (a.status.ok()) a.global_init(CURL_GLOBAL_DEFAULT);
    return a;
  }();
  return api;
}

}  // namespace

Status LoadHttp() { return Curl().status; }

namespace {

struct CurlDeleter {
  void operator()(CURL* c) const { Curl().easy_cleanup(c); }
};
using CurlPtr = std::unique_ptr<CURL, CurlDeleter>;

struct SlistDeleter {
  void operator()(curl_slist* l) const { Curl().slist_free_all(l); }
};
using SlistPtr = std::unique_ptr<curl_slist, SlistDeleter>;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) s.remove_suffix(1);
  return s;
}

std::optional<uint64_t> ParseUint(std::string_view s) {
  uint64_t v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || s.empty()) return std::nullopt;
  return v;
}

std::string FormatDuration(Duration d) {
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(d).count();
  if (ms % 1000 == 0) return StrCat(ms / 1000, "s");
  return StrCat(ms, "ms");
}

// What one transfer writes into; the curl callbacks' user data.
struct Transfer {
  const HttpRequest* request;
  HttpResponse* response;
  size_t upload_pos = 0;
  uint64_t skipped = 0;
  bool overflow = false;  // the body was longer than `out`; the transfer was cut
  bool headed = false;    // on_headers was called

  bool Success() const { return response->status >= 200 && response->status < 300; }

  // Returns false to cut the transfer.
  bool OnHeader(std::string_view line) {
    line = Trim(line);
    if (line.empty()) {  // the end of an answer's headers
      if (request->on_headers && !headed && response->status >= 200) {
        headed = true;
        return request->on_headers(*response);
      }
      return true;
    }
    if (line.starts_with("HTTP/")) {
      // A new status line (after a 100 Continue, or a redirect) starts a new answer.
      response->status_line = std::string(line);
      response->headers.clear();
      size_t sp = line.find(' ');
      response->status = 0;
      if (sp != std::string_view::npos) {
        auto code = ParseUint(line.substr(sp + 1, 3));
        if (code) response->status = static_cast<long>(*code);
      }
      return true;
    }
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return true;
    response->headers.emplace_back(Lower(Trim(line.substr(0, colon))), std::string(Trim(line.substr(colon + 1))));
    if (response->headers.back().first == "content-length" && Success() && request->out.empty() &&
        request->method != "HEAD") {
      if (auto n = ParseUint(response->headers.back().second)) response->body.reserve(std::min<uint64_t>(*n, kMaxReserve));
    }
    return true;
  }

  // Returns false to cut the transfer.
  bool OnBody(const char* data, size_t n) {
    if (request->cancel && request->cancel->load()) return false;
    if (request->on_headers) {
      if (!headed) {
        headed = true;
        if (!request->on_headers(*response)) return false;
      }
      response->out_bytes += n;
      return !request->sink || request->sink(std::string_view(data, n));
    }
    if (!Success()) {
      size_t keep = std::min(n, kErrorBodyCap - std::min(kErrorBodyCap, response->body.size()));
      response->body.append(data, keep);
      return true;
    }
    if (request->sink) {
      response->out_bytes += n;
      return request->sink(std::string_view(data, n));
    }
    if (request->out.empty()) {
      response->body.append(data, n);
      return true;
    }
    if (response->status == 200 && skipped < request->skip_on_200) {
      size_t skip = static_cast<size_t>(std::min<uint64_t>(n, request->skip_on_200 - skipped));
      skipped += skip;
      data += skip;
      n -= skip;
    }
    size_t room = request->out.size() - response->out_bytes;
    size_t copy = std::min(room, n);
    std::memcpy(request->out.data() + response->out_bytes, data, copy);
    response->out_bytes += copy;
    if (copy < n) {
      overflow = true;
      return false;
    }
    return true;
  }

  size_t OnUpload(char* buf, size_t n) {
    if (request->source) {
      if (request->cancel && request->cancel->load()) return CURL_READFUNC_ABORT;
      const size_t got = request->source(buf, n);
      return got == HttpRequest::kAbortSource ? size_t{CURL_READFUNC_ABORT} : got;
    }
    std::string_view body = request->body;
    size_t copy = std::min(n, body.size() - upload_pos);
    std::memcpy(buf, body.data() + upload_pos, copy);
    upload_pos += copy;
    return copy;
  }
};

extern "C" size_t HeaderCallback(char* data, size_t size, size_t nmemb, void* user) {
  size_t n = size * nmemb;
  return Guarded("header", size_t{0}, [&] {
    return static_cast<Transfer*>(user)->OnHeader(std::string_view(data, n)) ? n : size_t{0};
  });
}

extern "C" size_t WriteCallback(char* data, size_t size, size_t nmemb, void* user) {
  size_t n = size * nmemb;
  return Guarded("write", size_t{0}, [&] { return static_cast<Transfer*>(user)->OnBody(data, n) ? n : size_t{0}; });
}

extern "C" size_t ReadCallback(char* buf, size_t size, size_t nmemb, void* user) {
  return Guarded("read", size_t{CURL_READFUNC_ABORT},
                 [&] { return static_cast<Transfer*>(user)->OnUpload(buf, size * nmemb); });
}

extern "C" int ProgressCallback(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  const auto* t = static_cast<Transfer*>(user);
  return t->request->cancel && t->request->cancel->load() ? 1 : 0;
}

extern "C" int SeekCallback(void* user, curl_off_t offset, int origin) {
  return Guarded("seek", int{CURL_SEEKFUNC_FAIL}, [&] {
    auto* t = static_cast<Transfer*>(user);
    if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > t->request->body.size()) {
      return int{CURL_SEEKFUNC_CANTSEEK};
    }
    t->upload_pos = static_cast<size_t>(offset);
    return int{CURL_SEEKFUNC_OK};
  });
}

// Errors worth another attempt: the network or the server's side of it,
// never a mistake in the request.
bool Retryable(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_WEIRD_SERVER_REPLY:
    case CURLE_BAD_CONTENT_ENCODING:
      return true;
    default:
      return false;
  }
}

int ErrnoOf(CURLcode code) {
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT: return ETIMEDOUT;
    case CURLE_COULDNT_CONNECT: return ECONNREFUSED;
    case CURLE_COULDNT_RESOLVE_HOST: return EHOSTUNREACH;
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL: return EINVAL;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_LOGIN_DENIED: return EACCES;
    case CURLE_OUT_OF_MEMORY: return ENOMEM;
    default: return EIO;
  }
}

int ErrnoOfStatus(long status) {
  switch (status) {
    case 404: return ENOENT;
    case 401:
    case 403: return EACCES;
    case 400: return EINVAL;
    case 405:
    case 501: return ENOTSUP;
    case 413: return EFBIG;
    case 429: return EAGAIN;
    case 507: return ENOSPC;
    default: return EIO;
  }
}

Duration Backoff(const HttpOptions& options, int failed_attempts) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  Duration cap = options.backoff_initial;
  for (int i = 1; i < failed_attempts && cap < options.backoff_max; ++i) cap *= 2;
  cap = std::min(cap, options.backoff_max);
  if (cap <= Duration::zero()) return Duration::zero();
  std::uniform_int_distribution<int64_t> pick(0, cap.count());
  return Duration(pick(rng));
}

// "bytes 10-19/100" -> {10, 19}; nullopt when malformed.
std::optional<std::pair<uint64_t, uint64_t>> ParseContentRange(std::string_view v) {
  if (!v.starts_with("bytes ")) return std::nullopt;
  v.remove_prefix(6);
  size_t dash = v.find('-'), slash = v.find('/');
  if (dash == std::string_view::npos || slash == std::string_view::npos || slash < dash) return std::nullopt;
  uint64_t first = 0, last = 0;
  auto a = std::from_chars(v.data(), v.data() + dash, first);
  auto b = std::from_chars(v.data() + dash + 1, v.data() + slash, last);
  if (a.ec != std::errc() || b.ec != std::errc() || last < first) return std::nullopt;
  return std::make_pair(first, last);
}

}  // namespace

Result<bool> ApplyHttpOption(std::string_view name, std::string_view value, HttpOptions* options) {
  Duration* target = nullptr;
  if (name == "timeout") target = &options->attempt_timeout;
  else if (name == "connect_timeout") target = &options->connect_timeout;
  else if (name == "backoff") target = &options->backoff_initial;
  else if (name == "backoff_max") target = &options->backoff_max;
  else if (name == "deadline") target = &options->deadline;
  if (target) {
    STRATA_ASSIGN_OR_RETURN(Duration d, ParseDuration(value));
    if (d <= Duration::zero() && name != "backoff" && name != "backoff_max") {
      return Error(EINVAL, StrCat(name, "=", value, ": must be more than zero"));
    }
    *target = d;
    return true;
  }
  if (name == "attempts") {
    auto n = ParseUint(value);
    if (!n || *n < 1 || *n > 100) return Error(EINVAL, StrCat("attempts=", value, ": expected a whole number from 1 to 100"));
    options->attempts = static_cast<int>(*n);
    return true;
  }
  return false;
}

ParsedUrl SplitUrlQuery(std::string_view url) {
  ParsedUrl parsed;
  size_t q = url.find('?');
  parsed.base = std::string(url.substr(0, q));
  if (q == std::string_view::npos) return parsed;
  for (const auto& pair : Split(url.substr(q + 1), '&')) {
    if (pair.empty()) continue;
    size_t eq = pair.find('=');
    std::string name = DecodeUrlComponent(std::string_view(pair).substr(0, eq), true);
    std::string value = eq == std::string::npos ? "" : DecodeUrlComponent(std::string_view(pair).substr(eq + 1), true);
    parsed.params.emplace_back(std::move(name), std::move(value));
  }
  return parsed;
}

namespace {
std::string Encode(std::string_view s, bool keep_slash) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size() * 3 / 2);
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

std::string EncodeUrlComponent(std::string_view s) { return Encode(s, false); }
std::string EncodeUrlPath(std::string_view s) { return Encode(s, true); }

std::string DecodeUrlComponent(std::string_view s, bool plus_is_space) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && HexValue(s[i + 1]) >= 0 && HexValue(s[i + 2]) >= 0) {
      out.push_back(static_cast<char>(HexValue(s[i + 1]) * 16 + HexValue(s[i + 2])));
      i += 2;
    } else if (plus_is_space && s[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::optional<std::string_view> HttpResponse::Header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return std::string_view(v);
  }
  return std::nullopt;
}

std::optional<uint64_t> HttpResponse::ContentLength() const {
  auto v = Header("content-length");
  if (!v) return std::nullopt;
  return ParseUint(*v);
}

// Idle easy handles (each with its live connection) and the share object
// holding the DNS cache and TLS sessions of all of them.
class HttpClient::Pool {
 public:
  Pool() : share_(Curl().share_init()) {
    Curl().share_setopt(share_, CURLSHOPT_LOCKFUNC, &Pool::Lock);
    Curl().share_setopt(share_, CURLSHOPT_UNLOCKFUNC, &Pool::Unlock);
    Curl().share_setopt(share_, CURLSHOPT_USERDATA, this);
    Curl().share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    Curl().share_setopt(share_, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
  }
  ~Pool() {
    idle_.clear();  // handles detach from the share before it goes
    Curl().share_cleanup(share_);
  }

  // A handle with no options set beyond the share; nullptr when curl is out of memory.
  CurlPtr Take() {
    {
      std::lock_guard lock(mu_);
      if (!idle_.empty()) {
        CurlPtr h = std::move(idle_.back());
        idle_.pop_back();
        return h;
      }
    }
    return CurlPtr(Curl().easy_init());
  }

  void Give(CurlPtr h) {
    Curl().easy_reset(h.get());
    std::lock_guard lock(mu_);
    if (idle_.size() < kMaxIdleHandles) idle_.push_back(std::move(h));
  }

  CURLSH* share() const { return share_; }

 private:
  static void Lock(CURL*, curl_lock_data data, curl_lock_access, void* user) {
    Guarded("share lock", 0, [&] {
      static_cast<Pool*>(user)->locks_[static_cast<size_t>(data) % kLocks].lock();
      return 0;
    });
  }
  static void Unlock(CURL*, curl_lock_data data, void* user) {
    Guarded("share unlock", 0, [&] {
      static_cast<Pool*>(user)->locks_[static_cast<size_t>(data) % kLocks].unlock();
      return 0;
    });
  }

  static constexpr size_t kLocks = CURL_LOCK_DATA_LAST;
  CURLSH* share_;
  std::mutex locks_[kLocks];
  std::mutex mu_;
  std::vector<CurlPtr> idle_;
};

HttpClient::HttpClient(std::string store_name, HttpOptions options)
    : store_name_(std::move(store_name)), options_(options) {
  if (options_.attempts < 1) options_.attempts = 1;
}

Status HttpClient::Start() {
  std::call_once(started_, [this] {
    if (!Curl().status.ok()) start_error_ = Curl().status.Annotate(store_name_);
    else pool_ = std::make_unique<Pool>();
  });
  return start_error_;
}

HttpClient::~HttpClient() = default;

Status HttpClient::StatusError(const HttpResponse& response, std::string_view step, std::string_view detail) const {
  std::string message = StrCat(store_name_, ": ", step, ": HTTP ", response.status, " (", response.status_line, ")");
  if (!detail.empty()) message += StrCat(": ", detail);
  return Error(ErrnoOfStatus(response.status), std::move(message));
}

Result<HttpResponse> HttpClient::Perform(const HttpRequest& request, std::string_view step) {
  STRATA_RETURN_IF_ERROR(Start());
  const auto start = Clock::now();
  const auto deadline_at = start + options_.deadline;
  std::string last;     // what the last failed attempt got
  int last_errno = EIO;
  long last_status = 0;
  int attempt = 0;
  auto give_up = [&](std::string_view why, int code) {
    return Error(code, StrCat(store_name_, ": ", step, ": ", why, " (last: ", last, ")"));
  };
  auto deadline_error = [&] {
    return give_up(StrCat("deadline of ", FormatDuration(options_.deadline), " passed after ", attempt,
                          attempt == 1 ? " attempt" : " attempts"),
                   ETIMEDOUT);
  };

  // An unsigned PUT goes without "Expect: 100-continue" (a round trip per
  // upload for nothing). A signed one keeps it: libcurl 7.88 would sign our
  // "Expect:" removal as an empty header it never sends, which S3 rejects
  // (s3_signature_test caught it); and S3 wants the early "no" it allows.
  SlistPtr headers;
  auto add_header = [&](const std::string& h) {
    curl_slist* l = Curl().slist_append(headers.get(), h.c_str());
    if (l) {
      headers.release();
      headers.reset(l);
    }
    return l != nullptr;
  };
  for (const auto& h : request.headers) {
    if (!add_header(h)) return Error(ENOMEM, StrCat(store_name_, ": ", step, ": out of memory"));
  }
  // A streamed upload (a relay) keeps it: a server that refuses the
  // upload at once answers before the body is sent, instead of cutting
  // the connection under it.
  if (request.method == "PUT" && request.aws_sigv4.empty() && !request.source && !add_header("Expect:")) {
    return Error(ENOMEM, StrCat(store_name_, ": ", step, ": out of memory"));
  }

  while (true) {
    ++attempt;
    auto now = Clock::now();
    if (now >= deadline_at) return deadline_error();
    Duration remaining = deadline_at - now;
    bool clamped = remaining < options_.attempt_timeout;
    Duration timeout = clamped ? remaining : options_.attempt_timeout;

    CurlPtr h = pool_->Take();
    if (!h) return Error(ENOMEM, StrCat(store_name_, ": ", step, ": curl_easy_init failed"));
    HttpResponse response;
    Transfer transfer{&request, &response};
    char errbuf[CURL_ERROR_SIZE] = {0};
    CURL* c = h.get();
    auto ms = [](Duration d) { return static_cast<long>(std::max<int64_t>(1, std::chrono::duration_cast<std::chrono::milliseconds>(d).count())); };
    Curl().easy_setopt(c, CURLOPT_SHARE, pool_->share());
    Curl().easy_setopt(c, CURLOPT_URL, request.url.c_str());
    Curl().easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    Curl().easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    Curl().easy_setopt(c, CURLOPT_TCP_KEEPALIVE, 1L);
    Curl().easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, std::min(ms(options_.connect_timeout), ms(timeout)));
    Curl().easy_setopt(c, CURLOPT_TIMEOUT_MS, ms(timeout));
    Curl().easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    Curl().easy_setopt(c, CURLOPT_HEADERFUNCTION, &HeaderCallback);
    Curl().easy_setopt(c, CURLOPT_HEADERDATA, &transfer);
    Curl().easy_setopt(c, CURLOPT_WRITEFUNCTION, &WriteCallback);
    Curl().easy_setopt(c, CURLOPT_WRITEDATA, &transfer);
    if (headers) Curl().easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
    if (request.cancel) {
      Curl().easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
      Curl().easy_setopt(c, CURLOPT_XFERINFOFUNCTION, &ProgressCallback);
      Curl().easy_setopt(c, CURLOPT_XFERINFODATA, &transfer);
    }
    if (request.method == "HEAD") {
      Curl().easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (request.source && (request.method == "PUT" || request.method == "POST")) {
      if (request.method == "PUT") {
        Curl().easy_setopt(c, CURLOPT_UPLOAD, 1L);
        Curl().easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.source_size));
      } else {
        Curl().easy_setopt(c, CURLOPT_POST, 1L);
        Curl().easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.source_size));
      }
      Curl().easy_setopt(c, CURLOPT_READFUNCTION, &ReadCallback);
      Curl().easy_setopt(c, CURLOPT_READDATA, &transfer);
    } else if (request.method == "PUT") {
      Curl().easy_setopt(c, CURLOPT_UPLOAD, 1L);
      Curl().easy_setopt(c, CURLOPT_READFUNCTION, &ReadCallback);
      Curl().easy_setopt(c, CURLOPT_READDATA, &transfer);
      Curl().easy_setopt(c, CURLOPT_SEEKFUNCTION, &SeekCallback);
      Curl().easy_setopt(c, CURLOPT_SEEKDATA, &transfer);
      Curl().easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    } else if (request.method == "POST") {
      Curl().easy_setopt(c, CURLOPT_POSTFIELDS, request.body.data());
      Curl().easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
    } else if (request.method != "GET") {
      Curl().easy_setopt(c, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    }
    if (!options_.unix_socket.empty()) Curl().easy_setopt(c, CURLOPT_UNIX_SOCKET_PATH, options_.unix_socket.c_str());
    if (!options_.ca_file.empty()) Curl().easy_setopt(c, CURLOPT_CAINFO, options_.ca_file.c_str());
    if (!request.aws_sigv4.empty()) {
      Curl().easy_setopt(c, CURLOPT_AWS_SIGV4, request.aws_sigv4.c_str());
      Curl().easy_setopt(c, CURLOPT_USERNAME, request.access_key.c_str());
      Curl().easy_setopt(c, CURLOPT_PASSWORD, request.secret_key.c_str());
    }

    CURLcode code = Curl().easy_perform(c);
    pool_->Give(std::move(h));
    // A 200 to a range request whose body outlasts the buffer was cut on
    // purpose: everything asked for arrived.
    if (code == CURLE_WRITE_ERROR && transfer.overflow && response.status == 200 && request.skip_on_200 > 0) {
      code = CURLE_OK;
    }

    bool retry = false;
    if (code == CURLE_OK) {
      if (response.status >= 200 && response.status < 300) {
        Status checked = request.check ? request.check(response) : OkStatus();
        if (checked.ok()) {
          response.attempts = attempt;
          return response;
        }
        last = checked.message();
        last_errno = checked.code();
        last_status = 0;
        retry = true;
      } else if ((response.status >= 500 || response.status == 429) && !request.any_status) {
        last = response.status_line.empty() ? StrCat("HTTP ", response.status) : response.status_line;
        if (auto ra = response.Header("retry-after")) last += StrCat(", Retry-After: ", *ra);
        last_status = response.status;
        last_errno = ErrnoOfStatus(response.status);
        retry = true;
      } else {
        response.attempts = attempt;
        return response;
      }
    } else {
      last = Curl().easy_strerror(code);
      if (transfer.overflow) last = StrCat("server sent more than the ", request.out.size(), " bytes asked for");
      else if (errbuf[0]) last += StrCat(": ", Trim(errbuf));
      last_status = 0;
      last_errno = ErrnoOf(code);
      if (code == CURLE_OPERATION_TIMEDOUT && clamped) return deadline_error();
      retry = Retryable(code) || transfer.overflow;
      if (!retry) return give_up(attempt == 1 ? "request failed" : StrCat("request failed at attempt ", attempt), last_errno);
    }

    STRATA_LOG(kDebug) << store_name_ << ": " << step << ": attempt " << attempt << " failed: " << last;
    if (attempt >= options_.attempts) break;
    Duration wait = Backoff(options_, attempt);
    if (last_status == 429 || last_status == 503) {
      // Honour the server's Retry-After (seconds) within our own cap.
      if (auto ra = response.Header("retry-after"); ra) {
        if (auto secs = ParseUint(*ra)) {
          wait = std::max(wait, std::min<Duration>(std::chrono::seconds(*secs), options_.backoff_max));
        }
      }
    }
    if (Clock::now() + wait >= deadline_at) return deadline_error();
    std::this_thread::sleep_for(wait);
  }
  std::string why = last_status ? StrCat("HTTP ", last_status, " after ", attempt, " attempts")
                                : StrCat("failed after ", attempt, " attempts");
  return give_up(why, last_errno);
}

Status CheckRangeAnswer(const HttpResponse& r, uint64_t offset, size_t asked) {
  if (r.status != 206) return OkStatus();  // a 200 was trimmed to the range while it arrived
  auto range = r.Header("content-range");
  auto parsed = range ? ParseContentRange(*range) : std::nullopt;
  if (!parsed) return Error(EPROTO, StrCat("206 answer with Content-Range ", Quote(range.value_or("(none)"))));
  uint64_t want_last = offset + asked - 1;
  if (parsed->first != offset || parsed->second > want_last || parsed->second - parsed->first + 1 != r.out_bytes) {
    return Error(EPROTO, StrCat("asked for bytes ", offset, "-", want_last, ", got Content-Range ", *range, " with ",
                                r.out_bytes, " bytes of body"));
  }
  return OkStatus();
}

}  // namespace strata::cache
