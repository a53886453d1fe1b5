// etcd's v3 JSON gateway: bodies are JSON, keys and values base64, 64-bit
// numbers strings; an error is a non-2xx answer with {"error", "code",
// "message"} (grpc codes).
#include "launcher/cluster/etcd.h"

#include <nlohmann/json.hpp>

#include "cache/http_client.h"
#include "common/strings.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

int64_t Int(const json& j, const char* name) {
  if (!j.contains(name)) return 0;
  const json& v = j[name];
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_string()) return std::strtoll(v.get<std::string>().c_str(), nullptr, 10);
  return 0;
}

// The key right after every key that starts with `prefix` (etcd's range_end).
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

}  // namespace

Result<std::unique_ptr<EtcdClient>> EtcdClient::Create(const std::string& endpoints, Duration timeout, const std::string& ca_file) {
  std::unique_ptr<EtcdClient> c(new EtcdClient());
  for (const auto& e : Split(endpoints, ',')) {
    std::string url = e;
    while (!url.empty() && url.front() == ' ') url.erase(url.begin());
    while (!url.empty() && url.back() == ' ') url.pop_back();
    if (url.empty()) continue;
    if (!url.starts_with("http://") && !url.starts_with("https://")) {
      return Error(EINVAL, "etcd endpoint " + Quote(url) + ": expected http://HOST:PORT or https://HOST:PORT");
    }
    while (url.ends_with("/")) url.pop_back();
    cache::HttpOptions options;
    options.connect_timeout = std::min<Duration>(timeout, std::chrono::milliseconds(500));
    options.attempt_timeout = timeout;
    options.deadline = timeout;
    options.attempts = 1;
    options.ca_file = ca_file;
    c->clients_.push_back(std::make_unique<cache::HttpClient>("etcd " + url, options));
    c->endpoints_.push_back(url);
  }
  if (c->endpoints_.empty()) return Error(EINVAL, "etcd: no endpoints given (--cluster URL[,URL...])");
  return c;
}

EtcdClient::~EtcdClient() = default;

Result<std::string> EtcdClient::Call(const std::string& path, const std::string& body) {
  const size_t n = endpoints_.size();
  const size_t first = current_.load();
  Status last;
  for (size_t i = 0; i < n; ++i) {
    const size_t m = (first + i) % n;
    cache::HttpRequest request;
    request.method = "POST";
    request.url = endpoints_[m] + path;
    request.headers = {"Content-Type: application/json"};
    request.body = body;
    request.any_status = true;
    auto r = clients_[m]->Perform(request, path);
    if (!r.ok()) {
      last = r.status();
      continue;
    }
    if (r->status >= 200 && r->status < 300) {
      current_ = m;
      return std::move(r->body);
    }
    json error = json::parse(r->body, nullptr, false);
    const std::string message = error.is_object() ? error.value("message", error.value("error", r->body)) : r->body;
    const int64_t code = error.is_object() ? Int(error, "code") : 0;
    // A member without a leader, or one that is stopping (grpc
    // Unavailable 14, or a 5xx): another member may answer.
    if (r->status >= 500 || code == 14) {
      last = Error(EAGAIN, StrCat("etcd ", endpoints_[m], ": ", path, ": ", message));
      continue;
    }
    if (code == 5 /* NotFound */ || message.find("not found") != std::string::npos) {
      return Error(ENOENT, StrCat("etcd ", endpoints_[m], ": ", path, ": ", message));
    }
    return Error(EIO, StrCat("etcd ", endpoints_[m], ": ", path, ": HTTP ", r->status, ": ", message));
  }
  return Error(last.code() ? last.code() : EIO, StrCat("etcd: no member answered (", Join(endpoints_, ","), "): ", last.message()));
}

Result<int64_t> EtcdClient::Grant(int64_t ttl_seconds) {
  STRATA_ASSIGN_OR_RETURN(std::string text, Call("/v3/lease/grant", json{{"TTL", std::to_string(ttl_seconds)}}.dump()));
  json j = json::parse(text, nullptr, false);
  const int64_t id = j.is_object() ? Int(j, "ID") : 0;
  if (id == 0) return Error(EPROTO, "etcd: lease grant: no ID in " + Quote(text));
  return id;
}

Status EtcdClient::KeepAlive(int64_t lease) {
  STRATA_ASSIGN_OR_RETURN(std::string text, Call("/v3/lease/keepalive", json{{"ID", std::to_string(lease)}}.dump()));
  // A stream of answers; its first one says whether the lease lives (an
  // expired lease comes back with TTL 0 or none).
  json j = json::parse(text.substr(0, text.find('\n')), nullptr, false);
  if (j.is_object() && j.contains("error")) {
    // A stream's error comes with HTTP 200 (a member without a leader):
    // not an expired lease; the next call asks the next member.
    current_ = (current_.load() + 1) % endpoints_.size();
    return Error(EAGAIN, "etcd: lease keep-alive: " + j["error"].dump());
  }
  const json result = j.is_object() ? j.value("result", json::object()) : json::object();
  if (Int(result, "TTL") <= 0) return Error(ENOENT, StrCat("etcd: lease ", lease, " has expired"));
  return OkStatus();
}

Status EtcdClient::Revoke(int64_t lease) {
  return Call("/v3/lease/revoke", json{{"ID", std::to_string(lease)}}.dump()).status();
}

Status EtcdClient::Put(const std::string& key, const std::string& value, int64_t lease) {
  json body = {{"key", Base64Encode(key)}, {"value", Base64Encode(value)}};
  if (lease) body["lease"] = std::to_string(lease);
  return Call("/v3/kv/put", body.dump()).status();
}

Status EtcdClient::Delete(const std::string& key) {
  return Call("/v3/kv/deleterange", json{{"key", Base64Encode(key)}}.dump()).status();
}

Result<std::vector<EtcdClient::KeyValue>> EtcdClient::Range(const std::string& key, const std::string& range_end) {
  json body = {{"key", Base64Encode(key)}};
  if (!range_end.empty()) body["range_end"] = Base64Encode(range_end);
  STRATA_ASSIGN_OR_RETURN(std::string text, Call("/v3/kv/range", body.dump()));
  json j = json::parse(text, nullptr, false);
  if (!j.is_object()) return Error(EPROTO, "etcd: range: not JSON: " + Quote(text.substr(0, 200)));
  std::vector<KeyValue> out;
  for (const auto& kv : j.value("kvs", json::array())) {
    KeyValue v;
    v.key = Base64Decode(kv.value("key", "")).value_or("");
    v.value = Base64Decode(kv.value("value", "")).value_or("");
    v.mod_revision = Int(kv, "mod_revision");
    v.lease = Int(kv, "lease");
    out.push_back(std::move(v));
  }
  return out;
}

Result<std::vector<EtcdClient::KeyValue>> EtcdClient::Prefix(const std::string& prefix) { return Range(prefix, PrefixEnd(prefix)); }

Result<std::optional<EtcdClient::KeyValue>> EtcdClient::Get(const std::string& key) {
  STRATA_ASSIGN_OR_RETURN(auto kvs, Range(key, ""));
  if (kvs.empty()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(std::move(kvs.front()));
}

}  // namespace strata::launcher
