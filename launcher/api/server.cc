// LauncherServer: who may call, what they may ask for, and requests to
// SandboxManager calls.
#include "launcher/api/server.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>

#include "common/fs.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "common/units.h"
#include "launcher/protocol/protocol.h"
#include "launcher/api/tar_bridge.h"
#include "launcher/node/node_cgroup.h"

namespace strata::launcher {

using nlohmann::json;
using Response = HttpServer::Response;
using Request = HttpServer::Request;

namespace {

// Most sandboxes one bulk create makes, and how many it makes at once.
constexpr int kMaxBulk = 1000;
constexpr int kBulkParallel = 8;
// Warm pools stop filling this far above the memory reserve.
constexpr uint64_t kWarmMemoryMargin = uint64_t{256} << 20;
// Bounds of numbers a request gives (beyond them conversions overflow).
constexpr int64_t kMaxTtlSeconds = int64_t{10} * 365 * 24 * 3600;
constexpr int64_t kMaxTimeoutSeconds = int64_t{365} * 24 * 3600;
// The most output an exec may keep per stream (a collected answer holds it).
constexpr uint64_t kMaxOutputCap = uint64_t{64} << 20;
// An idempotent exec's kept answer holds its output only up to this much
// (both streams); past it the answer is kept without it.
constexpr size_t kMaxKeptOutput = size_t{2} << 20;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

Response Json(const json& j, int status = 200) {
  Response r;
  r.status = status;
  r.body = Dump(j);
  return r;
}

Response Fail(const Status& s) { return HttpServer::ErrorResponse(s); }

json ErrorJson(const Status& s) { return {{"error", s.ToString()}, {"errno", s.code()}}; }

Result<uint64_t> SizeField(const json& j, const char* name) {
  if (j[name].is_string()) return ParseSize(j[name].get<std::string>());
  return j[name].get<uint64_t>();
}

// "a, b or c".
std::string NamesOr(const std::vector<std::string>& names) {
  if (names.size() < 2) return Join(names, "");
  return Join(std::vector<std::string>(names.begin(), names.end() - 1), ", ") + " or " + names.back();
}

Result<SandboxSpec> ParseSpec(const json& j, const NodeConfig& node) {
  SandboxSpec spec;
  try {
    spec.layers = j.at("layers").get<std::vector<std::string>>();
    spec.store = j.value("store", "");
    spec.backend = j.value("backend", kDefaultBackend);
    if (!node.backends || !node.backends->Find(spec.backend).ok()) {
      return Error(EINVAL, StrCat("create: backend must be ", NamesOr(node.backends ? node.backends->Names() : std::vector<std::string>{}),
                                  ", not ", Quote(spec.backend)));
    }
    spec.limits.cpus = j.value("cpus", 0.0);
    spec.limits.pids = j.value("pids", int64_t{0});
    if (j.contains("memory")) {
      STRATA_ASSIGN_OR_RETURN(spec.limits.memory, SizeField(j, "memory"));
    }
    if (j.contains("disk")) {
      STRATA_ASSIGN_OR_RETURN(spec.disk, SizeField(j, "disk"));
    }
    if (j.contains("network")) {
      auto policy = NetPolicy::FromJson(j["network"]);
      if (!policy.ok()) return policy.status().Annotate("create");
      spec.network = *policy;
    }
    spec.env = j.value("env", std::vector<std::string>{});
    spec.workdir = j.value("workdir", "/");
    if (j.contains("files")) {
      STRATA_ASSIGN_OR_RETURN(spec.files, ParseFileRules(j["files"], "create: files"));
    }
    spec.kill_leftovers = j.value("kill_leftovers", false);
    if (j.contains("ttl") && !j["ttl"].is_null()) {
      if (j["ttl"].is_string()) {
        STRATA_ASSIGN_OR_RETURN(Duration d, ParseDuration(j["ttl"].get<std::string>()));
        spec.ttl_seconds = std::chrono::duration_cast<std::chrono::seconds>(d).count();
      } else {
        const double ttl = j["ttl"].get<double>();
        if (!(ttl >= 0 && ttl <= kMaxTtlSeconds)) return Error(EINVAL, StrCat("create: ttl must be 0 to ", kMaxTtlSeconds, " seconds"));
        spec.ttl_seconds = static_cast<int64_t>(ttl);
      }
      if (spec.ttl_seconds < 0 || spec.ttl_seconds > kMaxTtlSeconds) {
        return Error(EINVAL, StrCat("create: ttl must be 0 to ", kMaxTtlSeconds, " seconds"));
      }
    }
  } catch (const json::exception& e) {
    return Error(EINVAL, StrCat("create: ", e.what()));
  }
  if (spec.layers.empty()) return Error(EINVAL, "create: layers must name at least one layer");
  return spec;
}

Result<ExecRequest> ParseExec(const json& j) {
  ExecRequest r;
  try {
    r.argv = j.at("argv").get<std::vector<std::string>>();
    r.env = j.value("env", std::vector<std::string>{});
    r.cwd = j.value("cwd", "");
    if (j.contains("timeout")) {
      if (j["timeout"].is_string()) {
        STRATA_ASSIGN_OR_RETURN(r.timeout, ParseDuration(j["timeout"].get<std::string>()));
      } else {
        const double seconds = j["timeout"].get<double>();
        if (!(seconds >= 0 && seconds <= kMaxTimeoutSeconds)) {
          return Error(EINVAL, StrCat("exec: timeout must be 0 (none) to ", kMaxTimeoutSeconds, " seconds"));
        }
        r.timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
      }
    }
    uint64_t cap = j.value("output_cap", uint64_t{1} << 20);
    if (cap > kMaxOutputCap) return Error(EINVAL, StrCat("exec: output_cap is at most ", kMaxOutputCap, " bytes"));
    r.stdout_cap = r.stderr_cap = cap;
    if (j.contains("kill_leftovers") && !j["kill_leftovers"].is_null()) r.kill_leftovers = j["kill_leftovers"].get<bool>();
    if (j.contains("files")) {
      STRATA_ASSIGN_OR_RETURN(r.files, ParseFileRules(j["files"], "exec: files"));
    }
    const std::string role = j.value("role", "agent");
    if (role != "agent" && role != "grader") return Error(EINVAL, "exec: role must be agent or grader, not " + Quote(role));
    r.grader = role == "grader";
    if (j.contains("stdin")) {
      auto in = Base64Decode(j["stdin"].get<std::string>());
      if (!in) return Error(EINVAL, "exec: stdin is not base64");
      r.stdin_data = std::move(*in);
    }
  } catch (const json::exception& e) {
    return Error(EINVAL, StrCat("exec: ", e.what()));
  }
  if (r.argv.empty()) return Error(EINVAL, "exec: argv is empty");
  for (const auto& a : r.argv) {
    if (a.find('\0') != std::string::npos) return Error(EINVAL, "exec: an argument holds a NUL byte");
  }
  return r;
}

// A signal by number or name ("TERM", "SIGKILL").
Result<int> ParseSignal(const json& j) {
  if (j.is_number_integer()) {
    int n = j.get<int>();
    if (n > 0 && n < 65) return n;
  } else if (j.is_string()) {
    std::string name = j.get<std::string>();
    if (name.starts_with("SIG")) name = name.substr(3);
    static const std::map<std::string, int> kNames = {{"HUP", SIGHUP},   {"INT", SIGINT},   {"QUIT", SIGQUIT}, {"KILL", SIGKILL},
                                                      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"CONT", SIGCONT},
                                                      {"STOP", SIGSTOP}};
    if (auto it = kNames.find(name); it != kNames.end()) return it->second;
  }
  return Error(EINVAL, "signal must be a number (1-64) or a name such as TERM or KILL");
}

// A path in a sandbox for the file calls: absolute, no NUL, no "..".
Status CheckSandboxPath(const std::string& path) {
  if (path.empty() || path[0] != '/') return Error(EINVAL, "files: ?path=/absolute/path is required");
  if (path.size() > 4096) return Error(EINVAL, "files: path is longer than 4096 bytes");
  if (path.find('\0') != std::string::npos) return Error(EINVAL, "files: path holds a NUL byte");
  for (const auto& part : Split(path, '/')) {
    if (part == "..") return Error(EINVAL, "files: path " + Quote(path) + " has a \"..\" component");
  }
  return OkStatus();
}

// MemAvailable of /proc/meminfo, in bytes.
uint64_t MemAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

bool ClientGone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, HangupEvents(fd), 0};
  return ::poll(&p, 1, 0) == 1 && HungUp(p);
}

std::string Fingerprint(const Request& req, json body) {
  body.erase("stream");  // how the answer is delivered is not the request
  return HashBytes(StrCat(req.method, " ", req.path, "\n", Dump(body))).Hex();
}

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

// The sandbox was there when the exec began (CheckExec): a "no such
// file" or "permission denied" now is about the command (a missing
// program), a bad request rather than a missing sandbox.
// (The errno stays what it was.)
Response CommandFail(const Status& s) {
  Response r = Fail(s);
  if (s.code() == ENOENT || s.code() == EACCES || s.code() == ENOEXEC) r.status = 400;
  return r;
}

// The request's Idempotency-Key (none: `claim->key` stays empty), claimed
// for `scope`. Returns the answer to give at once for a malformed or
// reused key; otherwise `guard` holds the key unless its answer is kept
// (kDone, which the caller replays).
struct KeyClaim {
  std::string key;
  IdempotencyKeys::Claim::Kind kind = IdempotencyKeys::Claim::kOwner;
  IdempotencyKeys::Answer answer;
  json note;
};
std::optional<Response> ClaimKey(IdempotencyKeys& keys, const Request& req, const std::string& scope, const json& body,
                                 const json& note, KeyGuard& guard, KeyClaim* out) {
  const auto header = req.headers.find("idempotency-key");
  if (header == req.headers.end() || header->second.empty()) return std::nullopt;
  out->key = header->second;
  if (Status s = IdempotencyKeys::CheckKey(out->key); !s.ok()) return Fail(s);
  auto claim = keys.Begin(scope, out->key, Fingerprint(req, body), note);
  if (!claim.ok()) {
    // The key store failed (full, a disk error): the call is served as if
    // it had no key rather than refused; a retry may then repeat it.
    STRATA_LOG(kWarn) << "idempotency key " << Quote(out->key) << " not kept: " << claim.status().ToString();
    out->key.clear();
    return std::nullopt;
  }
  if (claim->kind == IdempotencyKeys::Claim::kMismatch) {
    Response r = Fail(Error(EINVAL, "Idempotency-Key " + Quote(out->key) + " was used for a different request"));
    r.status = 422;
    return r;
  }
  out->kind = claim->kind;
  out->answer = std::move(claim->answer);
  out->note = std::move(claim->note);
  if (claim->kind != IdempotencyKeys::Claim::kDone) guard.Hold(keys, scope, out->key);
  return std::nullopt;
}

// How an exec's answer goes out.
enum class ExecFormat { kFrames, kNdjson, kJson };

std::string EncodePiece(ExecFormat f, int stream, std::string_view bytes) {
  if (f == ExecFormat::kFrames) return EncodeFrame(stream == 1 ? Frame::kStdout : Frame::kStderr, bytes);
  return Dump({{stream == 1 ? "stdout" : "stderr", Base64Encode(bytes)}}) + "\n";
}

// The exec's ending: `answer` is the exit report (plus stdout/stderr) or
// an error object.
std::string EncodeEnd(ExecFormat f, const json& answer) {
  const bool error = answer.contains("error");
  if (f == ExecFormat::kFrames) {
    json report = answer;
    report.erase("stdout");
    report.erase("stderr");
    return EncodeFrame(error ? Frame::kError : Frame::kExit, Dump(report));
  }
  if (error) return Dump(answer) + "\n";
  json report = answer;
  report.erase("stdout");
  report.erase("stderr");
  return Dump({{"exit", report}}) + "\n";
}

const char* ContentType(ExecFormat f) {
  return f == ExecFormat::kFrames ? "application/vnd.strata.frames" : "application/x-ndjson";
}

}  // namespace

Result<std::unique_ptr<LauncherServer>> LauncherServer::Start(const ServeOptions& options, SandboxManager& manager,
                                                              std::vector<std::string>* warnings) {
  gid_t group = static_cast<gid_t>(-1);
  if (!options.allow_group.empty()) {
    struct group* g = ::getgrnam(options.allow_group.c_str());
    if (!g) return Error(ENOENT, "serve: no group named " + Quote(options.allow_group));
    group = g->gr_gid;
  }
  std::unique_ptr<LauncherServer> s(new LauncherServer(
      options, manager,
      AuthPolicy{.who = "launcher", .unix_operator = true, .operator_group = group, .open_without_tokens = options.insecure,
                 .gateway_credentials = true}));
  // Warm pools fill within the node's admission limits and give way first:
  // their ready sandboxes go when memory falls below the reserve, or when
  // sandboxes in use and ready ones pass --max-sandboxes.
  manager.SetWarmAdmission([max = options.max_sandboxes, reserve = options.memory_reserve, capacity = options.memory_capacity,
                            m = &manager, s_ptr = s.get()](size_t held) {
    SandboxManager::WarmVerdict v;
    const int64_t in_use = static_cast<int64_t>(m->Count());
    if (max > 0 && in_use + static_cast<int64_t>(held) >= max) {
      v.status = Error(EAGAIN, StrCat("node full (--max-sandboxes ", max, ")"));
      v.shed = in_use + static_cast<int64_t>(held) > max;
    }
    // (A microVM commits its guest's RAM and more even without a limit:
    // the next one must fit whole, and may need more than the margin.)
    const uint64_t next = m->WarmFillCommit();
    if (capacity > 0) {
      const uint64_t committed = m->CommittedMemory();
      if (committed + next > capacity) {
        v.status = Error(EAGAIN, StrCat("memory limits at --memory-capacity ", FormatBytes(capacity)));
        v.shed |= committed > capacity;
      }
    }
    if (reserve > 0) {
      const uint64_t available = s_ptr->SandboxMemoryAvailable();
      if (available < reserve + std::max(kWarmMemoryMargin, next)) {
        v.status = Error(ENOMEM, StrCat("memory available ", FormatBytes(available), " is near the reserve ", FormatBytes(reserve)));
        v.shed |= available < reserve;
      }
    }
    return v;
  });
  STRATA_RETURN_IF_ERROR(s->auth_.Load(options.tokens_file, options.legacy_token_file));
  if (!options.legacy_token_file.empty() && warnings) {
    warnings->push_back("--token-file is replaced by --tokens (docs/api.md); its token is the tenant \"default\"");
  }
  const bool tls = !options.tls_cert_file.empty() || !options.tls_key_file.empty();
  if (tls && (options.tls_cert_file.empty() || options.tls_key_file.empty())) {
    return Error(EINVAL, "serve: TLS needs both --tls-cert and --tls-key");
  }
  std::string cert, key;
  if (tls) {
    STRATA_ASSIGN_OR_RETURN(cert, ReadFileToString(options.tls_cert_file));
    STRATA_ASSIGN_OR_RETURN(key, ReadFileToString(options.tls_key_file));
  }
  for (const auto& address : options.listen) {
    STRATA_ASSIGN_OR_RETURN(auto hp, ParseHostPort(address));
    const bool loopback = IsLoopbackHost(hp.first);
    if (!s->auth_.has_tenants()) {
      if (!options.insecure) {
        return Error(EINVAL, "serve: --listen " + address + " without --tokens would let anyone who reaches it act as root; "
                             "give --tokens FILE (or --insecure for tests and one-machine setups)");
      }
      if (warnings) warnings->push_back("--listen " + address + " has no tokens: every caller there is the operator (--insecure)");
    }
    if (!tls && !loopback) {
      if (!options.insecure) {
        return Error(EINVAL, "serve: --listen " + address + " is not a loopback address and has no TLS; tokens would cross "
                             "the network in the clear: give --tls-cert and --tls-key (or --insecure)");
      }
      if (warnings) warnings->push_back("--listen " + address + " is plain TCP off loopback (--insecure)");
    }
  }

  mode_t mode = group != static_cast<gid_t>(-1) ? 0660 : 0600;
  if (s->auth_.has_tenants()) mode = 0666;  // the tokens are the gate
  LauncherServer* self = s.get();
  auto handler = [self](const Request& r) { return self->Handle(r); };
  auto upload = [self](const Request& r, std::optional<Response>* refusal) { return self->StartUpload(r, refusal); };
  HttpServer::Limits unix_limits = options.tcp_limits;
  unix_limits.max_connections = 4096;
  // Root's own socket (0600) has no deadlines; one that others may reach
  // (a group, tokens) has the TCP listeners' idle and request deadlines.
  if (mode == 0600) unix_limits.idle_timeout = unix_limits.request_timeout = Duration{0};
  STRATA_ASSIGN_OR_RETURN(s->unix_, HttpServer::Listen({.unix_path = options.socket_path, .mode = mode,
                                                        .limits = unix_limits, .handler = handler, .upload = upload}));
  if (group != static_cast<gid_t>(-1) && ::chown(options.socket_path.c_str(), 0, group) != 0) {
    return ErrnoError(errno, "chown " + options.socket_path);
  }
  for (const auto& address : options.listen) {
    STRATA_ASSIGN_OR_RETURN(auto server, HttpServer::Listen({.tcp_address = address, .tls_cert_pem = cert, .tls_key_pem = key,
                                                             .limits = options.tcp_limits, .handler = handler, .upload = upload}));
    s->tcp_.push_back(std::move(server));
  }
  return s;
}

int64_t LauncherServer::Creating() {
  std::lock_guard lock(admission_mu_);
  return creating_;
}

std::string LauncherServer::TcpUrl() const { return tcp_.empty() ? "" : tcp_.front()->url(); }

void LauncherServer::SetClusterStatus(std::function<json()> status) {
  std::lock_guard lock(cluster_mu_);
  cluster_status_ = std::move(status);
}

LauncherServer::~LauncherServer() {
  manager_.SetWarmAdmission(nullptr);  // (it asks this server)
  // Listeners first: no handler runs once they are gone.
  tcp_.clear();
  unix_.reset();
}

std::vector<std::string> LauncherServer::urls() const {
  std::vector<std::string> out;
  if (unix_) out.push_back(unix_->url());
  for (const auto& t : tcp_) out.push_back(t->url());
  return out;
}

Status LauncherServer::ReloadTokens() { return auth_.Reload(); }

Status LauncherServer::CheckOwner(const std::string& id, const Caller& caller) {
  auto owner = manager_.Owner(id);
  if (!owner.ok()) return owner.status();
  if (!caller.is_operator && *owner != caller.scope()) return Error(ENOENT, StrCat("sandbox ", Quote(id), ": no such sandbox"));
  return OkStatus();
}

// The memory sandboxes may still take: MemAvailable, and with
// --memory-capacity no more than what their parent cgroup has left.
uint64_t LauncherServer::SandboxMemoryAvailable() const {
  uint64_t available = MemAvailable();
  if (options_.memory_capacity > 0) {
    const uint64_t used = SandboxMemoryUsage(manager_.node().cgroup_parent);
    available = std::min(available, options_.memory_capacity > used ? options_.memory_capacity - used : 0);
  }
  return available;
}

Status LauncherServer::Admit(const Caller& caller, uint64_t memory) {
  const uint64_t available = options_.memory_reserve > 0 ? SandboxMemoryAvailable() : 0;  // (read before the lock)
  const uint64_t committed = options_.memory_capacity > 0 ? manager_.CommittedMemory() : 0;
  const Headroom room = NodeHeadroom();
  std::lock_guard lock(admission_mu_);
  NodeLoad load = Load(room, available, committed);
  load.sandboxes += creating_;
  load.memory_committed += creating_memory_;
  STRATA_RETURN_IF_ERROR(AdmitOnNode(Limits(), load, memory));
  if (caller.tenant) {
    const auto& limits = caller.tenant->limits;
    if (limits.max_sandboxes > 0 &&
        static_cast<int64_t>(manager_.CountOwned(caller.scope())) + creating_by_tenant_[caller.scope()] >= limits.max_sandboxes) {
      return Error(EUSERS, StrCat("tenant ", caller.scope(), " has its limit of ", limits.max_sandboxes, " sandboxes"));
    }
    if (auth_.tenants().TakeCreations(*caller.tenant, 1) < 1) {
      return Error(EUSERS, StrCat("tenant ", caller.scope(), ": more than ", limits.creates_per_second, " creations per second"));
    }
    ++creating_by_tenant_[caller.scope()];
  }
  ++creating_;
  creating_memory_ += memory;
  return OkStatus();
}

void LauncherServer::Admitted(const Caller& caller, uint64_t memory) {
  std::lock_guard lock(admission_mu_);
  --creating_;
  creating_memory_ -= memory;
  if (caller.tenant && --creating_by_tenant_[caller.scope()] == 0) creating_by_tenant_.erase(caller.scope());
}

NodeLimits LauncherServer::Limits() const {
  return {.max_sandboxes = options_.max_sandboxes, .memory_capacity = options_.memory_capacity,
          .disk_reserve = options_.disk_reserve, .memory_reserve = options_.memory_reserve};
}

NodeLoad LauncherServer::Load(const Headroom& room, uint64_t memory_available, uint64_t committed) {
  return {.sandboxes = static_cast<int64_t>(manager_.Count()), .memory_committed = committed,
          .memory_available = memory_available, .disk_available = room.disk_available,
          .inodes_known = room.inodes_known, .inodes_available = room.inodes_available,
          .pids_available = room.pids_available};
}

LauncherServer::Headroom LauncherServer::NodeHeadroom() const {
  Headroom h;
  struct statvfs vfs{};
  if (::statvfs(manager_.node().uppers.c_str(), &vfs) == 0) {
    h.disk_available = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    h.inodes_known = vfs.f_files > 0;  // (btrfs makes inodes as it goes: 0)
    h.inodes_available = vfs.f_favail;
  }
  // Threads now (the fourth field of /proc/loadavg: running/total) against kernel.pid_max.
  auto pid_max = ReadFileToString("/proc/sys/kernel/pid_max");
  auto loadavg = ReadFileToString("/proc/loadavg");
  if (pid_max.ok() && loadavg.ok()) {
    const uint64_t max = std::strtoull(pid_max->c_str(), nullptr, 10);
    const size_t slash = loadavg->find('/');
    const uint64_t threads = slash == std::string::npos ? 0 : std::strtoull(loadavg->c_str() + slash + 1, nullptr, 10);
    h.pids_available = max > threads ? max - threads : 0;
  }
  return h;
}

json LauncherServer::Health() {
  json health = NodeHealth();
  std::lock_guard lock(cluster_mu_);
  if (cluster_status_) health["cluster"] = cluster_status_();
  return health;
}

json LauncherServer::NodeHealth() {
  json headroom = json::object();
  const size_t count = manager_.Count();
  headroom["slots"] = options_.max_sandboxes > 0 ? json(std::max<int64_t>(0, options_.max_sandboxes - static_cast<int64_t>(count))) : json(nullptr);
  const uint64_t available = SandboxMemoryAvailable();
  headroom["memory_available"] = available;
  headroom["memory_reserve"] = options_.memory_reserve;
  const uint64_t committed = manager_.CommittedMemory();
  headroom["memory_committed"] = committed;
  headroom["memory_capacity"] = options_.memory_capacity > 0 ? json(options_.memory_capacity) : json(nullptr);
  const Headroom room = NodeHeadroom();
  headroom["disk_available"] = room.disk_available;
  headroom["disk_reserve"] = options_.disk_reserve;
  headroom["inodes_available"] = room.inodes_known ? json(room.inodes_available) : json(nullptr);
  headroom["pids_available"] = room.pids_available;
  // Whether it would take one more (a byte of memory: not with its capacity
  // all committed), by the same rule as a create, without those under way.
  const bool accepting = AdmitOnNode(Limits(), Load(room, available, committed), 1).ok();
  json health = {{"ok", true}, {"pid", ::getpid()}, {"sandboxes", count}, {"accepting", accepting}, {"headroom", headroom}};
  if (!manager_.node().name.empty()) health["node"] = manager_.node().name;
  return health;
}

Response LauncherServer::Handle(const Request& req) {
  return Answer(
      req, [this](const Request& r) { return auth_.Authenticate(r); },
      [this](const Request& r, const Caller& caller) { return Route(r, caller); });
}

Response LauncherServer::Route(const Request& req, const Caller& caller) {
  if (req.method == "GET" && req.path == "/metrics") {
    Response r;
    r.content_type = "text/plain; version=0.0.4";
    r.body = manager_.Metrics();
    return r;
  }
  if (req.method == "GET" && req.path == "/v1/health") return Json(Health());
  // (A file upload's body is the file itself; uploads never reach here.)
  json body = json::parse(req.body.empty() ? "{}" : req.body, nullptr, false);
  if (body.is_discarded() || !body.is_object()) {
    return Fail(Error(EINVAL, "request body is not a JSON object (or not valid UTF-8)"));
  }
  if (req.path == "/v1/warm") {
    if (!caller.is_operator) return Fail(Error(EPERM, "warm pools: only the node's operator sets and lists them"));
    if (req.method == "GET") return Json({{"pools", manager_.WarmPools()}});
    if (req.method == "POST") {
      auto spec = ParseSpec(body, manager_.node());
      if (!spec.ok()) return Fail(spec.status().Annotate("warm pool"));
      if (!body.contains("size") || !body["size"].is_number_integer()) return Fail(Error(EINVAL, "warm pool: size (a whole number) is required"));
      if (spec->store.empty() && !options_.stores.empty()) spec->store = options_.stores[0];
      auto info = manager_.SetWarmPool(std::move(*spec), body["size"].get<int>());
      return info.ok() ? Json(*info) : Fail(info.status());
    }
  }
  if (req.path == "/v1/keys" && req.method == "GET") {
    // Whether a call with this Idempotency-Key was made here (its work runs
    // or its answer is kept): a gateway asks the nodes before it places a
    // retried create, so the retry lands where the first attempt went.
    auto key = req.query.find("key");
    if (key == req.query.end()) return Fail(Error(EINVAL, "keys: ?key= is required"));
    if (Status s = IdempotencyKeys::CheckKey(key->second); !s.ok()) return Fail(s);
    auto known = manager_.keys().Known(caller.scope(), key->second);
    if (!known.ok()) return Fail(known.status());
    if (!*known) return Fail(Error(ENOENT, "Idempotency-Key " + Quote(key->second) + " is not known here"));
    return Json({{"known", true}});
  }
  if (req.path == "/v1/sandboxes") {
    if (req.method == "GET") return Json(manager_.List(caller.is_operator ? std::nullopt : std::optional(caller.scope())));
    if (req.method == "POST") return Create(req, body, caller);
  }
  const std::string prefix = "/v1/sandboxes/";
  if (!req.path.starts_with(prefix)) return Fail(Error(ENOENT, "no API " + req.method + " " + req.path));
  std::string rest = req.path.substr(prefix.size());
  std::string id = rest.substr(0, rest.find('/'));
  std::string verb = rest.size() > id.size() ? rest.substr(id.size() + 1) : "";
  auto status_reply = [](const Status& s) { return s.ok() ? Json(json::object()) : Fail(s); };

  if (verb.empty() && req.method == "DELETE") return Destroy(req, id, caller);
  if (Status s = CheckOwner(id, caller); !s.ok()) return Fail(s);
  manager_.Touch(id);  // every call on a sandbox renews its ttl
  if (verb == "keepalive" && req.method == "POST") {
    auto info = manager_.Info(id);
    return info.ok() ? Json(*info) : Fail(info.status());
  }
  if (verb == "execs" || verb.starts_with("execs/")) return Execs(req, id, verb, body);
  if (verb.empty() && req.method == "GET") {
    auto info = manager_.Info(id);
    return info.ok() ? Json(*info) : Fail(info.status());
  }
  if (verb == "network" && (req.method == "GET" || req.method == "PUT")) {
    auto policy = req.method == "PUT" ? NetPolicy::FromJson(body) : Result<NetPolicy>(NetPolicy{});
    if (!policy.ok()) return Fail(policy.status().Annotate("network"));
    auto r = req.method == "PUT" ? manager_.SetNetwork(id, *policy) : manager_.Network(id);
    return r.ok() ? Json(*r) : Fail(r.status());
  }
  if (verb == "pause" && req.method == "POST") return status_reply(manager_.Pause(id));
  if (verb == "resume" && req.method == "POST") return status_reply(manager_.Resume(id));
  if (verb == "files" && req.method == "GET") {
    if (Status s = manager_.CheckExec(id); !s.ok()) return Fail(s);  // a frozen agent would never answer
    auto path = req.query.find("path");
    Status ok = CheckSandboxPath(path == req.query.end() ? "" : path->second);
    if (!ok.ok()) return Fail(ok);
    if (auto f = req.query.find("format"); f != req.query.end() && f->second == "tar") {
      auto agent = manager_.AgentOf(id, "get a tree");
      if (!agent.ok()) return Fail(agent.status());
      if (Status s = CheckTree(*agent, path->second); !s.ok()) return Fail(s);
      Response r;
      r.content_type = "application/x-tar";
      r.stream = [agent = *agent, dir = path->second, hold = manager_.Hold(id)](const HttpServer::StreamWriter& write) mutable {
        TreeToTar(agent, dir, write).IgnoreError();  // (an error past the headers can only cut the stream)
      };
      return r;
    } else if (f != req.query.end() && f->second != "file") {
      return Fail(Error(EINVAL, "files: format is file or tar"));
    }
    // Streamed from the agent as it reads (never held whole); its first
    // answer (a missing file, a directory) still decides the status.
    auto agent = manager_.AgentOf(id, "get");
    if (!agent.ok()) return Fail(agent.status());
    auto file = agent->OpenGet(path->second);
    if (!file.ok()) return Fail(file.status());
    Response r;
    r.content_type = "application/octet-stream";
    r.headers.emplace_back("X-Strata-File-Size", std::to_string((*file)->size()));
    r.stream = [file = std::shared_ptr<AgentClient::GetStream>(std::move(*file)), hold = manager_.Hold(id)](
                   const HttpServer::StreamWriter& write) {
      std::string piece;
      while (true) {
        auto more = file->Next(&piece);
        if (!more.ok() || !*more || !write(piece)) return;  // (an error past the headers can only cut the stream)
      }
    };
    return r;
  }
  if (verb == "exec" && req.method == "POST") return Exec(req, id, body, caller);
  if (verb == "snapshot" && req.method == "POST") return Snapshot(req, id, body, caller);
  return Fail(Error(ENOENT, "no API " + req.method + " " + req.path));
}

// --- create ------------------------------------------------------------------

Response LauncherServer::Create(const Request& req, const json& body, const Caller& caller) {
  auto spec = ParseSpec(body, manager_.node());
  if (!spec.ok()) return Fail(spec.status());
  const bool bulk = body.contains("count");
  int count = 1;
  if (bulk) {
    if (!body["count"].is_number_integer() || body["count"].get<int64_t>() < 1 || body["count"].get<int64_t>() > kMaxBulk) {
      return Fail(Error(EINVAL, StrCat("create: count must be a whole number from 1 to ", kMaxBulk)));
    }
    count = body["count"].get<int>();
  }
  // What a tenant may ask for.
  if (caller.tenant) {
    const auto& limits = caller.tenant->limits;
    if (spec->network.mode == NetMode::kHost && !limits.net_host) {
      return Fail(Error(EPERM, StrCat("create: tenant ", caller.scope(), " may not use the host's network")));
    }
    if (!spec->store.empty()) {
      bool allowed = std::find(options_.stores.begin(), options_.stores.end(), spec->store) != options_.stores.end() ||
                     std::find(limits.stores.begin(), limits.stores.end(), spec->store) != limits.stores.end();
      if (!allowed) {
        return Fail(Error(EPERM, StrCat("create: tenant ", caller.scope(), " may not use store ", Quote(spec->store),
                                        " (only the daemon's --store list and its own)")));
      }
    }
    for (const auto& layer : spec->layers) {
      if (!LayerAllowed(limits, layer)) {
        return Fail(Error(EPERM, StrCat("create: tenant ", caller.scope(), " may not use layer ", Quote(layer))));
      }
    }
  }
  if (spec->store.empty() && !options_.stores.empty()) spec->store = options_.stores[0];

  std::vector<std::string> ids(static_cast<size_t>(count));
  for (auto& id : ids) id = NewSandboxId(manager_.node().name);
  KeyGuard guard;
  KeyClaim claim;
  if (auto reply = ClaimKey(manager_.keys(), req, caller.scope(), body, {{"ids", ids}}, guard, &claim)) return *reply;
  const std::string& key = claim.key;
  if (claim.kind == IdempotencyKeys::Claim::kDone) return Json(claim.answer.body, claim.answer.status);
  if (claim.kind == IdempotencyKeys::Claim::kInterrupted) {
    // The same ids again: those the dead daemon made (and this one
    // re-adopted) are answered as they are, the others are made now.
    auto old = claim.note.value("ids", std::vector<std::string>{});
    if (old.size() == ids.size()) ids = old;
  }

  struct Outcome {
    std::optional<json> info;
    Status error;
  };
  std::vector<Outcome> outcomes(ids.size());
  auto make = [&](size_t i) {
    if (manager_.Exists(ids[i])) {  // made by an interrupted first attempt
      auto info = manager_.Info(ids[i]);
      if (info.ok()) outcomes[i].info = *info;
      else outcomes[i].error = info.status();
      return;
    }
    // A create a ready warm sandbox serves commits nothing new: the pool's
    // count has it already.
    if (Status a = Admit(caller, manager_.WarmReadyFor(*spec) ? 0 : MemoryCommit(manager_.node(), *spec)); !a.ok()) {
      outcomes[i].error = a;
      return;
    }
    SandboxSpec one = *spec;
    one.id = ids[i];
    auto info = manager_.Create(std::move(one), caller.scope());
    Admitted(caller, MemoryCommit(manager_.node(), *spec));
    if (info.ok()) outcomes[i].info = std::move(*info);
    else outcomes[i].error = info.status();
  };
  if (ids.size() == 1) {
    make(0);
  } else {
    std::atomic<size_t> next{0};
    std::vector<std::thread> workers;
    for (int w = 0; w < std::min<int>(kBulkParallel, count); ++w) {
      workers.emplace_back([&] {
        for (size_t i; (i = next++) < ids.size();) make(i);
      });
    }
    for (auto& t : workers) t.join();
  }

  json created = json::array(), failures = json::array();
  Status first_error;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    if (outcomes[i].info) {
      created.push_back(*outcomes[i].info);
    } else {
      json f = ErrorJson(outcomes[i].error);
      f["index"] = i;
      failures.push_back(f);
      if (first_error.ok()) first_error = outcomes[i].error;
    }
  }
  Response r;
  if (!bulk) {
    r = created.empty() ? Fail(first_error) : Json(created[0], 201);
  } else {
    json answer = {{"sandboxes", created}, {"failures", failures}};
    int status = 201;
    if (created.empty()) {
      answer.update(ErrorJson(first_error));
      status = HttpServer::HttpStatusFor(first_error.code());
    }
    r = Json(answer, status);
  }
  if (!key.empty()) {
    // Nothing made: a retry tries again. Otherwise the retry gets this.
    IdempotencyKeys& keys = guard.Settle();
    if (created.empty() || !keys.Finish(caller.scope(), key, {r.status, json::parse(r.body)}).ok()) keys.Release(caller.scope(), key);
  }
  return r;
}

// --- exec --------------------------------------------------------------------

Response LauncherServer::Exec(const Request& req, const std::string& id, const json& body, const Caller& caller) {
  auto exec = ParseExec(body);
  if (!exec.ok()) return Fail(exec.status());
  if (body.value("detach", false)) return Detach(req, id, body, std::move(*exec), caller);
  ExecFormat format = ExecFormat::kJson;
  if (auto a = req.headers.find("accept"); a != req.headers.end() && a->second.find("application/x-ndjson") != std::string::npos) {
    format = ExecFormat::kNdjson;
  } else if (body.value("stream", true)) {
    format = ExecFormat::kFrames;
  }
  const std::string scope = caller.scope();
  KeyGuard guard;
  KeyClaim claim;
  if (auto reply = ClaimKey(manager_.keys(), req, scope, body, json::object(), guard, &claim)) return *reply;
  const std::string key = claim.key;
  guard.Disarm();  // the run below settles the key, however the exec ends
  {
    if (claim.kind == IdempotencyKeys::Claim::kDone) {  // the first answer again
      const json& answer = claim.answer.body;
      if (format == ExecFormat::kJson) return Json(answer, claim.answer.status);
      Response r;
      r.content_type = ContentType(format);
      for (int stream : {1, 2}) {
        auto bytes = Base64Decode(answer.value(stream == 1 ? "stdout" : "stderr", ""));
        if (bytes && !bytes->empty()) r.body += EncodePiece(format, stream, *bytes);
      }
      r.body += EncodeEnd(format, answer);
      return r;
    }
    // (An interrupted exec's command died with the daemon's connection to
    // its agent: it runs again.)
  }
  if (Status s = manager_.CheckExec(id); !s.ok()) {
    if (!key.empty()) manager_.keys().Release(scope, key);
    return Fail(s);
  }
  // A client that goes away abandons its command (the agent kills it). A
  // copy of the connection's descriptor: valid as long as the exec runs,
  // whatever the server does with its own.
  auto watch = std::make_shared<UniqueFd>(req.connection_fd >= 0 ? ::fcntl(req.connection_fd, F_DUPFD_CLOEXEC, 0) : -1);
  exec->cancel_fd = watch->get();
  // Runs the command; `emit` gets each encoded piece (false: the client is
  // gone). Returns the answer, and settles the idempotency key.
  auto run = [this, id, key, scope, format, watch](ExecRequest request, const std::function<bool(std::string_view)>& emit) {
    std::string out, err;
    bool gone = false;
    bool dropped = false;  // a keyed streamed answer past what a kept answer holds
    auto result = manager_.Exec(id, std::move(request), [&](int stream, std::string_view b) {
      if (format == ExecFormat::kJson) {
        (stream == 1 ? out : err).append(b);  // the answer itself (bounded by output_cap)
        return;
      }
      if (!key.empty() && !dropped) {
        if (out.size() + err.size() + b.size() > kMaxKeptOutput) {
          dropped = true;
          std::string().swap(out);
          std::string().swap(err);
        } else {
          (stream == 1 ? out : err).append(b);
        }
      }
      if (!emit(EncodePiece(format, stream, b))) gone = true;
    });
    json answer;
    if (result.ok()) {
      answer = ExecResultJson(*result);
      answer["stdout"] = Base64Encode(out);
      answer["stderr"] = Base64Encode(err);
    } else {
      answer = ErrorJson(result.status());
    }
    gone |= ClientGone(watch->get());
    if (!key.empty()) {
      // Only a command that ran to its end, for a client still there, is
      // an answer to keep; otherwise a retry runs it again. Its output is
      // kept only up to kMaxKeptOutput.
      const bool too_big = dropped || out.size() + err.size() > kMaxKeptOutput;
      json kept = json::object();
      for (const auto& [k, v] : answer.items()) {
        if (!too_big || (k != "stdout" && k != "stderr")) kept[k] = v;
      }
      if (too_big) kept["output_not_kept"] = true;
      if (!result.ok() || gone || !manager_.keys().Finish(scope, key, {200, kept}).ok()) manager_.keys().Release(scope, key);
    }
    return std::make_pair(result.status(), answer);
  };
  if (format == ExecFormat::kJson) {
    auto [status, answer] = run(std::move(*exec), nullptr);
    return status.ok() ? Json(answer) : CommandFail(status);
  }
  // Streamed as the command writes (stdout, stderr, then exit or error),
  // so a client sees output before the command ends.
  Response r;
  r.content_type = ContentType(format);
  r.stream = [run, format, request = std::move(*exec)](const HttpServer::StreamWriter& write) mutable {
    auto [status, answer] = run(std::move(request), write);
    write(EncodeEnd(format, answer));
  };
  return r;
}

// --- detached execs ----------------------------------------------------------

Response LauncherServer::Detach(const Request& req, const std::string& id, const json& body, ExecRequest exec,
                                const Caller& caller) {
  std::string exec_id = "ex-" + NewSandboxId().substr(3);
  KeyGuard guard;
  KeyClaim claim;
  if (auto reply = ClaimKey(manager_.keys(), req, caller.scope(), body, {{"exec_id", exec_id}}, guard, &claim)) return *reply;
  const std::string& key = claim.key;
  if (claim.kind == IdempotencyKeys::Claim::kDone) return Json(claim.answer.body, claim.answer.status);
  {
    if (claim.kind == IdempotencyKeys::Claim::kInterrupted) {
      // The dead daemon may have started it: the agent still has it then.
      exec_id = claim.note.value("exec_id", exec_id);
      if (auto status = manager_.ExecStatus(id, exec_id, Duration{0}); status.ok()) {
        json answer = {{"exec_id", exec_id}, {"sandbox", id}, {"state", (*status)["state"]}};
        guard.Settle().Finish(caller.scope(), key, {201, answer}).IgnoreError();
        return Json(answer, 201);
      }
    }
  }
  auto started = manager_.StartDetached(id, std::move(exec), exec_id);
  if (!key.empty()) {
    IdempotencyKeys& keys = guard.Settle();
    json answer = started.ok() ? json{{"exec_id", *started}, {"sandbox", id}, {"state", "running"}} : json();
    if (!started.ok() || !keys.Finish(caller.scope(), key, {201, answer}).ok()) keys.Release(caller.scope(), key);
  }
  if (!started.ok()) return CommandFail(started.status());
  return Json({{"exec_id", *started}, {"sandbox", id}, {"state", "running"}}, 201);
}

Response LauncherServer::Execs(const Request& req, const std::string& id, const std::string& verb, const json& body) {
  if (verb == "execs") {
    if (req.method != "GET") return Fail(Error(ENOENT, "no API " + req.method + " " + req.path));
    auto list = manager_.ListExecs(id);
    return list.ok() ? Json((*list)["execs"]) : Fail(list.status());
  }
  std::string rest = verb.substr(6);  // after "execs/"
  const std::string eid = rest.substr(0, rest.find('/'));
  const std::string what = rest.size() > eid.size() ? rest.substr(eid.size() + 1) : "";
  auto query = [&](const char* name) -> std::optional<std::string> {
    auto it = req.query.find(name);
    if (it == req.query.end()) return std::nullopt;
    return it->second;
  };
  auto number = [&](const char* name, uint64_t fallback) -> Result<uint64_t> {
    auto v = query(name);
    if (!v) return fallback;
    char* end = nullptr;
    uint64_t n = std::strtoull(v->c_str(), &end, 10);
    if (v->empty() || *end) return Error(EINVAL, StrCat(name, " must be a whole number"));
    return n;
  };
  if (what.empty() && req.method == "GET") {
    auto status = manager_.ExecStatus(id, eid, Duration{0});
    return status.ok() ? Json(*status) : Fail(status.status());
  }
  if (what == "wait" && req.method == "POST") {
    if (Status s = manager_.CheckExec(id); !s.ok()) return Fail(s);
    double seconds = 30;
    if (auto t = query("timeout")) {
      char* end = nullptr;
      seconds = std::strtod(t->c_str(), &end);
      if (t->empty() || *end || !(seconds >= 0 && seconds <= 3600)) return Fail(Error(EINVAL, "wait: timeout is 0-3600 seconds"));
    }
    auto status = manager_.ExecStatus(id, eid, std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000)));
    manager_.Touch(id);
    return status.ok() ? Json(*status) : Fail(status.status());
  }
  if (what == "signal" && req.method == "POST") {
    auto sig = ParseSignal(body.value("signal", json("TERM")));
    if (!sig.ok()) return Fail(sig.status());
    Status s = manager_.SignalExec(id, eid, *sig);
    return s.ok() ? Json(json::object()) : Fail(s);
  }
  if (what == "output" && req.method == "GET") {
    auto offset = number("offset", 0);
    if (!offset.ok()) return Fail(offset.status());
    auto out_off = number("stdout_offset", *offset), err_off = number("stderr_offset", *offset);
    if (!out_off.ok()) return Fail(out_off.status());
    if (!err_off.ok()) return Fail(err_off.status());
    const bool follow = query("follow").value_or("true") != "false";
    // Refused before the stream starts when there is no such command.
    if (auto status = manager_.ExecStatus(id, eid, Duration{0}); !status.ok()) return Fail(status.status());
    ExecFormat format = ExecFormat::kFrames;
    if (auto a = req.headers.find("accept"); a != req.headers.end() && a->second.find("application/x-ndjson") != std::string::npos) {
      format = ExecFormat::kNdjson;
    }
    auto watch = std::make_shared<UniqueFd>(req.connection_fd >= 0 ? ::fcntl(req.connection_fd, F_DUPFD_CLOEXEC, 0) : -1);
    Response r;
    r.content_type = ContentType(format);
    r.stream = [this, id, eid, format, watch, o = *out_off, e = *err_off, follow](const HttpServer::StreamWriter& write) {
      auto ended = manager_.Attach(id, eid, o, e, follow, [&](int stream, std::string_view b) { write(EncodePiece(format, stream, b)); },
                                   watch->get());
      manager_.Touch(id);
      if (!ended.ok()) {
        if (ended.status().code() != ECANCELED) write(EncodeEnd(format, ErrorJson(ended.status())));
        return;
      }
      if (*ended) {
        write(EncodeEnd(format, ExecResultJson(**ended)));
      } else if (format == ExecFormat::kNdjson) {
        write(Dump({{"state", "running"}}) + "\n");
      }
    };
    return r;
  }
  return Fail(Error(ENOENT, "no API " + req.method + " " + req.path));
}

// --- destroy and snapshot ----------------------------------------------------

Response LauncherServer::Destroy(const Request& req, const std::string& id, const Caller& caller) {
  KeyGuard guard;
  KeyClaim claim;
  if (auto reply = ClaimKey(manager_.keys(), req, caller.scope(), json::object(), json::object(), guard, &claim)) return *reply;
  const std::string& key = claim.key;
  if (claim.kind == IdempotencyKeys::Claim::kDone) return Json(claim.answer.body, claim.answer.status);
  const bool interrupted = claim.kind == IdempotencyKeys::Claim::kInterrupted;
  Status s = CheckOwner(id, caller);
  if (s.code() == ENOENT && interrupted) s = OkStatus();  // the dead daemon's destroy finished, or recovery did
  else if (s.ok()) s = manager_.Destroy(id);
  if (!key.empty()) {
    IdempotencyKeys& keys = guard.Settle();
    if (!s.ok() || !keys.Finish(caller.scope(), key, {200, json::object()}).ok()) keys.Release(caller.scope(), key);
  }
  return s.ok() ? Json(json::object()) : Fail(s);
}

Response LauncherServer::Snapshot(const Request& req, const std::string& id, const json& body, const Caller& caller) {
  std::vector<std::string> excludes;
  try {
    excludes = body.value("exclude", std::vector<std::string>{});
  } catch (const json::exception& e) {
    return Fail(Error(EINVAL, StrCat("snapshot: exclude: ", e.what())));
  }
  if (!body.contains("tag") || !body["tag"].is_string()) return Fail(Error(EINVAL, "snapshot: tag (NAME:VERSION) is required"));
  // A tenant publishes only under names its publish patterns allow (none
  // by default): moving a tag others use would change their sandboxes.
  if (caller.tenant && !PublishAllowed(caller.tenant->limits, body["tag"].get<std::string>())) {
    return Fail(Error(EPERM, StrCat("snapshot: tenant ", caller.scope(), " may not publish ", Quote(body["tag"].get<std::string>()))));
  }
  KeyGuard guard;
  KeyClaim claim;
  if (auto reply = ClaimKey(manager_.keys(), req, caller.scope(), body, json::object(), guard, &claim)) return *reply;
  const std::string& key = claim.key;
  if (claim.kind == IdempotencyKeys::Claim::kDone) return Json(claim.answer.body, claim.answer.status);
  if (body.contains("include_denied") && !body["include_denied"].is_boolean()) {
    return Fail(Error(EINVAL, "snapshot: include_denied must be true or false"));
  }
  auto r = manager_.Snapshot(id, body["tag"].get<std::string>(), std::move(excludes), body.value("include_denied", false));
  if (!key.empty()) {
    IdempotencyKeys& keys = guard.Settle();
    if (!r.ok() || !keys.Finish(caller.scope(), key, {201, *r}).ok()) keys.Release(caller.scope(), key);
  }
  return r.ok() ? Json(*r, 201) : Fail(r.status());
}

// --- uploads -----------------------------------------------------------------

namespace {

class FileUpload : public HttpServer::Upload {
 public:
  explicit FileUpload(std::unique_ptr<AgentClient::PutStream> stream) : stream_(std::move(stream)) {}
  Status Write(std::string_view piece) override { return stream_->Write(piece); }
  Response Finish() override {
    Status s = stream_->Finish();
    stream_.reset();
    return s.ok() ? Json(json::object()) : Fail(s);
  }
  void Abort() override { stream_.reset(); }  // the agent drops its temporary file

 private:
  std::unique_ptr<AgentClient::PutStream> stream_;
};

}  // namespace

std::unique_ptr<HttpServer::Upload> LauncherServer::StartUpload(const Request& req, std::optional<Response>* refusal) {
  const std::string prefix = "/v1/sandboxes/";
  if (req.method != "PUT" || !req.path.starts_with(prefix) || !req.path.ends_with("/files")) return nullptr;
  const std::string id = req.path.substr(prefix.size(), req.path.size() - prefix.size() - 6);
  auto refuse = [&](const Status& s) -> std::unique_ptr<HttpServer::Upload> {
    *refusal = Fail(s);
    return nullptr;
  };
  auto caller = auth_.Authenticate(req);
  if (!caller.ok()) {
    *refusal = AuthRefusal(caller.status());
    return nullptr;
  }
  if (id.empty() || id.find('/') != std::string::npos) return refuse(Error(ENOENT, "no API PUT " + req.path));
  if (Status s = CheckOwner(id, *caller); !s.ok()) return refuse(s);
  if (Status s = manager_.CheckExec(id); !s.ok()) return refuse(s);  // a frozen agent would never answer
  manager_.Touch(id);
  auto path = req.query.find("path");
  const std::string p = path == req.query.end() ? "" : path->second;
  if (Status s = CheckSandboxPath(p); !s.ok()) return refuse(s);
  uint32_t mode = 0644;
  if (auto m = req.query.find("mode"); m != req.query.end()) {
    char* end = nullptr;
    unsigned long v = std::strtoul(m->second.c_str(), &end, 8);
    if (m->second.empty() || *end || v > 07777) return refuse(Error(EINVAL, "files: mode must be octal, at most 7777"));
    mode = static_cast<uint32_t>(v);
  }
  if (auto f = req.query.find("format"); f != req.query.end() && f->second == "tar") {
    auto agent = manager_.AgentOf(id, "put a tree");
    if (!agent.ok()) return refuse(agent.status());
    auto tree = agent->BeginPutTree(p);
    if (!tree.ok()) return refuse(tree.status());
    (*tree)->Keep(manager_.Hold(id));
    auto upload = TarUpload(std::move(*tree));
    if (!upload.ok()) return refuse(upload.status());
    return std::move(*upload);
  } else if (f != req.query.end() && f->second != "file") {
    return refuse(Error(EINVAL, "files: format is file or tar"));
  }
  auto stream = manager_.BeginPut(id, p, mode);
  if (!stream.ok()) return refuse(stream.status());
  (*stream)->Keep(manager_.Hold(id));
  return std::make_unique<FileUpload>(std::move(*stream));
}

}  // namespace strata::launcher
