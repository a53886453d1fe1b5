// What the node API's routes share on the wire: the bounds of what a
// request may ask, parsing a request's sandbox spec, exec and signal,
// the answers (JSON, errors) and an exec's encodings (frames, NDJSON),
// and the Idempotency-Key claim of a call that may be retried.
// docs/api.md describes the API; parsing is tested without a node
// (tests/launcher/wire_test.cc).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "launcher/front/http_server.h"
#include "launcher/node/idempotency.h"
#include "launcher/sandbox/sandbox.h"

namespace strata::launcher::api {

// Bounds of numbers a request gives (beyond them conversions overflow).
constexpr int64_t kMaxTtlSeconds = int64_t{10} * 365 * 24 * 3600;
constexpr int64_t kMaxTimeoutSeconds = int64_t{365} * 24 * 3600;
// Labels of one sandbox: how many, and the longest name or value.
constexpr size_t kMaxLabels = 64;
constexpr size_t kMaxLabelBytes = 1024;
// A deadline given as seconds from now (0: none), in unix milliseconds.
Result<int64_t> DeadlineField(const nlohmann::json& j, const char* what);
// A sandbox's labels: an object of strings, within the bounds above.
Result<std::map<std::string, std::string>> ParseLabels(const nlohmann::json& j, const char* what);
// The most output an exec may keep per stream (a collected answer holds it).
constexpr uint64_t kMaxOutputCap = uint64_t{64} << 20;

// JSON text with invalid UTF-8 replaced (names need not be UTF-8).
std::string Dump(const nlohmann::json& j);
HttpServer::Response Json(const nlohmann::json& j, int status = 200);
// The error answer of `s` (its HTTP status by errno).
HttpServer::Response Fail(const Status& s);
nlohmann::json ErrorJson(const Status& s);
// A size given as bytes or text ("512M").
Result<uint64_t> SizeField(const nlohmann::json& j, const char* name);

// A create's sandbox spec; EINVAL naming the field. The back end must be
// one of `node`'s.
Result<SandboxSpec> ParseSpec(const nlohmann::json& j, const NodeConfig& node);
// An exec request; EINVAL naming the field.
Result<ExecRequest> ParseExec(const nlohmann::json& j);
// A signal by number or name ("TERM", "SIGKILL").
Result<int> ParseSignal(const nlohmann::json& j);
// A path in a sandbox for the file calls: absolute, no NUL, no "..".
Status CheckSandboxPath(const std::string& path);
// Whether the client of connection `fd` has hung up.
bool ClientGone(int fd);
// A command's failure once its sandbox was there: 400 for a missing or
// unrunnable program (the errno stays).
HttpServer::Response CommandFail(const Status& s);

// How an exec's answer goes out.
enum class ExecFormat { kFrames, kNdjson, kJson };
std::string EncodePiece(ExecFormat f, int stream, std::string_view bytes);
// The exec's ending: `answer` is the exit report (plus stdout/stderr) or
// an error object.
std::string EncodeEnd(ExecFormat f, const nlohmann::json& answer);
const char* ContentType(ExecFormat f);

// The request's method, path and body (but "stream"), hashed: what a
// retry with the same Idempotency-Key must repeat.
std::string Fingerprint(const HttpServer::Request& req, nlohmann::json body);
// A claimed idempotency key that an exception on the way would leave held
// (every retry would wait on it): released unless settled.
struct KeyGuard {
  IdempotencyKeys* keys = nullptr;
  std::string scope, key;
  KeyGuard() = default;
  KeyGuard(const KeyGuard&) = delete;
  KeyGuard& operator=(const KeyGuard&) = delete;
  ~KeyGuard() {
    if (keys) keys->Release(scope, key);
  }
  void Hold(IdempotencyKeys& k, const std::string& s, const std::string& name) {
    keys = &k;
    scope = s;
    key = name;
  }
  void Disarm() { keys = nullptr; }
  IdempotencyKeys& Settle() {
    IdempotencyKeys* k = keys;
    keys = nullptr;
    return *k;
  }
};

// The request's Idempotency-Key (none: `claim->key` stays empty), claimed
// for `scope`. Returns the answer to give at once for a malformed or
// reused key; otherwise `guard` holds the key unless its answer is kept
// (kDone, which the caller replays).
struct KeyClaim {
  std::string key;
  IdempotencyKeys::Claim::Kind kind = IdempotencyKeys::Claim::kOwner;
  IdempotencyKeys::Answer answer;
  nlohmann::json note;
};
std::optional<HttpServer::Response> ClaimKey(IdempotencyKeys& keys, const HttpServer::Request& req, const std::string& scope,
                                             const nlohmann::json& body, const nlohmann::json& note, KeyGuard& guard,
                                             KeyClaim* out);

}  // namespace strata::launcher::api
