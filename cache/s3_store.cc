// S3Store: objects in an S3 bucket, signed by libcurl's AWS SigV4.
//
// libcurl 7.88 builds the canonical request from the URL exactly as sent,
// so every path and query here is encoded the way SigV4's canonical form
// wants it (see CanonicalQuery), and the payload hash goes in our own
// x-amz-content-sha256 header, which curl then uses in the signature.
#include "cache/s3_store.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>

#include "common/strings.h"

namespace strata::cache {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// The inner text of every <tag>...</tag> (or <tag/>) in `xml`, in order.
// S3's listing and error documents have no nesting of a tag in itself, no
// CDATA and no comments, so a scan is enough.
std::vector<std::string_view> Elements(std::string_view xml, std::string_view tag) {
  std::vector<std::string_view> out;
  const std::string open = StrCat("<", tag), close = StrCat("</", tag, ">");
  size_t pos = 0;
  while ((pos = xml.find(open, pos)) != std::string_view::npos) {
    size_t after = pos + open.size();
    if (after >= xml.size()) break;
    char c = xml[after];
    if (c != '>' && c != ' ' && c != '/' && c != '\t' && c != '\n' && c != '\r') {
      pos = after;  // a longer tag name that starts the same
      continue;
    }
    size_t gt = xml.find('>', after);
    if (gt == std::string_view::npos) break;
    if (xml[gt - 1] == '/') {  // <tag/>
      out.push_back(std::string_view());
      pos = gt + 1;
      continue;
    }
    size_t end = xml.find(close, gt + 1);
    if (end == std::string_view::npos) break;
    out.push_back(xml.substr(gt + 1, end - gt - 1));
    pos = end + close.size();
  }
  return out;
}

std::string_view First(std::string_view xml, std::string_view tag) {
  auto all = Elements(xml, tag);
  return all.empty() ? std::string_view() : all.front();
}

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// Decodes XML's five named entities and numeric character references; an
// unknown or malformed entity is an error (a key we cannot read exactly
// must not turn into a different key).
Result<std::string> XmlDecode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '&') {
      out.push_back(s[i]);
      continue;
    }
    size_t semi = s.find(';', i);
    if (semi == std::string_view::npos || semi - i > 12) return Error(EPROTO, StrCat("bad XML entity in ", Quote(s)));
    std::string_view name = s.substr(i + 1, semi - i - 1);
    if (name == "amp") out.push_back('&');
    else if (name == "lt") out.push_back('<');
    else if (name == "gt") out.push_back('>');
    else if (name == "quot") out.push_back('"');
    else if (name == "apos") out.push_back('\'');
    else if (name.size() > 1 && name[0] == '#') {
      bool hex = name[1] == 'x' || name[1] == 'X';
      std::string_view digits = name.substr(hex ? 2 : 1);
      uint32_t cp = 0;
      auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), cp, hex ? 16 : 10);
      if (ec != std::errc() || p != digits.data() + digits.size() || digits.empty() || cp > 0x10ffff) {
        return Error(EPROTO, StrCat("bad XML character reference &", name, ";"));
      }
      AppendUtf8(out, cp);
    } else {
      return Error(EPROTO, StrCat("unknown XML entity &", name, ";"));
    }
    i = semi;
  }
  return out;
}

}  // namespace

std::string CanonicalQuery(std::vector<std::pair<std::string, std::string>> params) {
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(params.size());
  for (auto& [k, v] : params) encoded.emplace_back(EncodeUrlComponent(k), EncodeUrlComponent(v));
  std::sort(encoded.begin(), encoded.end());
  std::string out;
  for (const auto& [k, v] : encoded) {
    if (!out.empty()) out.push_back('&');
    out += StrCat(k, "=", v);
  }
  return out;
}

Result<std::pair<S3Location, HttpOptions>> ParseS3Url(std::string_view url) {
  auto bad = [&](std::string_view why) { return Error(EINVAL, StrCat("store URL ", Quote(url), ": ", why)); };
  if (!url.starts_with("s3://")) return bad("expected s3://bucket[/prefix]");
  ParsedUrl parsed = SplitUrlQuery(url.substr(5));
  S3Location loc;
  HttpOptions options;
  std::string_view rest = parsed.base;
  size_t slash = rest.find('/');
  loc.bucket = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) loc.prefix = std::string(rest.substr(slash + 1));
  if (loc.bucket.empty()) return bad("no bucket name");
  while (loc.prefix.ends_with('/')) loc.prefix.pop_back();
  if (!loc.prefix.empty()) {
    STRATA_RETURN_IF_ERROR(ValidateKey(loc.prefix).Annotate(StrCat("store URL ", Quote(url), ": prefix")));
    loc.prefix += '/';
  }
  std::string style;
  for (const auto& [name, value] : parsed.params) {
    if (name == "endpoint") loc.endpoint = value;
    else if (name == "region") loc.region = value;
    else if (name == "style") style = value;
    else {
      auto applied = ApplyHttpOption(name, value, &options);
      if (!applied.ok()) return bad(applied.status().message());
      if (!*applied) {
        return bad(StrCat("unknown parameter ", Quote(name), " (known: endpoint, region, style, timeout, "
                          "connect_timeout, attempts, backoff, backoff_max, deadline)"));
      }
    }
  }
  if (loc.region.empty()) loc.region = Env("AWS_REGION");
  if (loc.region.empty()) loc.region = Env("AWS_DEFAULT_REGION");
  if (loc.region.empty()) loc.region = "us-east-1";
  bool default_endpoint = loc.endpoint.empty();
  if (default_endpoint) loc.endpoint = StrCat("https://s3.", loc.region, ".amazonaws.com");
  while (loc.endpoint.ends_with('/')) loc.endpoint.pop_back();
  if (!loc.endpoint.starts_with("http://") && !loc.endpoint.starts_with("https://")) {
    return bad(StrCat("endpoint ", Quote(loc.endpoint), " must start with http:// or https://"));
  }
  if (loc.endpoint.find('/', loc.endpoint.find("//") + 2) != std::string::npos) {
    return bad(StrCat("endpoint ", Quote(loc.endpoint), " must be scheme://host[:port] without a path"));
  }
  if (style.empty()) loc.path_style = !default_endpoint;
  else if (style == "path") loc.path_style = true;
  else if (style == "virtual") loc.path_style = false;
  else return bad(StrCat("style=", style, ": expected path or virtual"));
  loc.access_key = Env("AWS_ACCESS_KEY_ID");
  loc.secret_key = Env("AWS_SECRET_ACCESS_KEY");
  loc.session_token = Env("AWS_SESSION_TOKEN");
  if (loc.access_key.empty() != loc.secret_key.empty()) {
    return bad("AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together");
  }
  return std::make_pair(std::move(loc), options);
}

S3Store::S3Store(std::string url, S3Location location, HttpOptions options)
    : url_(std::move(url)), loc_(std::move(location)), client_(StrCat("s3 store ", url_), options) {
  if (loc_.path_style) {
    host_base_ = loc_.endpoint;
  } else {
    size_t scheme_end = loc_.endpoint.find("://") + 3;
    host_base_ = StrCat(loc_.endpoint.substr(0, scheme_end), loc_.bucket, ".", loc_.endpoint.substr(scheme_end));
  }
  sigv4_ = StrCat("aws:amz:", loc_.region, ":s3");
}

Result<std::shared_ptr<ObjectStore>> S3Store::Open(std::string url, S3Location location, HttpOptions options) {
  return std::shared_ptr<ObjectStore>(new S3Store(std::move(url), std::move(location), options));
}

std::string S3Store::ObjectUrl(std::string_view key) const {
  std::string path = EncodeUrlPath(StrCat(loc_.prefix, key));
  if (loc_.path_style) return StrCat(host_base_, "/", EncodeUrlComponent(loc_.bucket), "/", path);
  return StrCat(host_base_, "/", path);
}

std::string S3Store::BucketUrl() const {
  if (loc_.path_style) return StrCat(host_base_, "/", EncodeUrlComponent(loc_.bucket));
  return host_base_ + "/";
}

HttpRequest S3Store::NewRequest(std::string method, std::string url, bool has_payload) const {
  HttpRequest req;
  req.method = std::move(method);
  req.url = std::move(url);
  req.headers.push_back(StrCat("x-amz-content-sha256: ", has_payload ? kUnsignedPayload : kEmptyPayloadSha256));
  if (!loc_.access_key.empty()) {
    if (!loc_.session_token.empty()) req.headers.push_back(StrCat("x-amz-security-token: ", loc_.session_token));
    req.aws_sigv4 = sigv4_;
    req.access_key = loc_.access_key;
    req.secret_key = loc_.secret_key;
  }
  return req;
}

Status S3Store::S3Error(const HttpResponse& r, std::string_view step) const {
  std::string detail;
  std::string_view code = First(r.body, "Code"), message = First(r.body, "Message");
  if (!code.empty()) detail = std::string(code);
  if (!message.empty()) detail += StrCat(detail.empty() ? "" : ": ", XmlDecode(message).value_or(std::string(message)));
  if ((r.status == 401 || r.status == 403) && loc_.access_key.empty()) {
    detail += " (no credentials: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set)";
  }
  return client_.StatusError(r, step, detail);
}

Result<std::string> S3Store::Get(std::string_view key) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  const std::string step = StrCat("get ", key);
  HttpRequest req = NewRequest("GET", ObjectUrl(key), false);
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(req, step));
  if (r.status != 200) return S3Error(r, step);
  return std::move(r.body);
}

Result<size_t> S3Store::GetRange(std::string_view key, uint64_t offset, std::span<char> out) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  if (out.empty()) return size_t{0};
  const std::string step = StrCat("get range ", offset, "+", out.size(), " of ", key);
  HttpRequest req = NewRequest("GET", ObjectUrl(key), false);
  req.headers.push_back(StrCat("Range: bytes=", offset, "-", offset + out.size() - 1));
  req.out = out;
  req.skip_on_200 = offset;
  req.check = [&](const HttpResponse& r) { return CheckRangeAnswer(r, offset, out.size()); };
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(req, step));
  if (r.status == 416) return size_t{0};
  if (r.status != 200 && r.status != 206) return S3Error(r, step);
  return r.out_bytes;
}

Status S3Store::Put(std::string_view key, std::string_view data) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  const std::string step = StrCat("put ", key);
  HttpRequest req = NewRequest("PUT", ObjectUrl(key), true);
  req.body = data;
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(req, step));
  if (r.status < 200 || r.status >= 300) return S3Error(r, step);
  return OkStatus();
}

Result<uint64_t> S3Store::Size(std::string_view key) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  const std::string step = StrCat("stat ", key);
  HttpRequest req = NewRequest("HEAD", ObjectUrl(key), false);
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(req, step));
  if (r.status != 200) return S3Error(r, step);
  auto length = r.ContentLength();
  if (!length) return Error(EPROTO, StrCat(client_.store_name(), ": ", step, ": HEAD answer has no Content-Length"));
  return *length;
}

Status S3Store::Delete(std::string_view key) {
  STRATA_RETURN_IF_ERROR(ValidateKey(key));
  const std::string step = StrCat("delete ", key);
  HttpRequest req = NewRequest("DELETE", ObjectUrl(key), false);
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(req, step));
  if ((r.status >= 200 && r.status < 300) || r.status == 404) return OkStatus();
  return S3Error(r, step);
}

Result<ListPage> S3Store::List(std::string_view prefix, std::string_view token, size_t max_keys) {
  if (max_keys == 0 || max_keys > 1000) max_keys = 1000;
  const std::string step = StrCat("list ", Quote(prefix));
  std::vector<std::pair<std::string, std::string>> params = {
      {"list-type", "2"}, {"max-keys", std::to_string(max_keys)}, {"prefix", StrCat(loc_.prefix, prefix)}};
  if (!token.empty()) params.emplace_back("continuation-token", std::string(token));
  HttpRequest req = NewRequest("GET", StrCat(BucketUrl(), "?", CanonicalQuery(std::move(params))), false);
  STRATA_ASSIGN_OR_RETURN(HttpResponse r, client_.Perform(req, step));
  if (r.status != 200) return S3Error(r, step);

  auto malformed = [&](std::string_view why) {
    return Error(EPROTO, StrCat(client_.store_name(), ": ", step, ": malformed ListObjectsV2 answer: ", why));
  };
  if (r.body.find("<ListBucketResult") == std::string::npos) return malformed("no <ListBucketResult>");
  ListPage page;
  for (std::string_view contents : Elements(r.body, "Contents")) {
    auto key = XmlDecode(First(contents, "Key"));
    if (!key.ok()) return malformed(key.status().message());
    std::string_view size_text = First(contents, "Size");
    uint64_t size = 0;
    auto [p, ec] = std::from_chars(size_text.data(), size_text.data() + size_text.size(), size);
    if (key->empty() || ec != std::errc() || p != size_text.data() + size_text.size()) {
      return malformed(StrCat("entry ", Quote(contents.substr(0, 200))));
    }
    if (!key->starts_with(loc_.prefix)) continue;  // cannot happen on a correct server
    page.objects.push_back({key->substr(loc_.prefix.size()), size});
  }
  std::sort(page.objects.begin(), page.objects.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  if (First(r.body, "IsTruncated") == "true") {
    auto next = XmlDecode(First(r.body, "NextContinuationToken"));
    if (!next.ok()) return malformed(next.status().message());
    if (next->empty()) return malformed("IsTruncated without NextContinuationToken");
    page.next_token = std::move(*next);
  }
  return page;
}

}  // namespace strata::cache
