// LauncherServer: its listeners, who may call and what the node admits,
// health, and the routes of requests to SandboxManager calls (the calls
// themselves: create.cc, exec.cc, sandbox_calls.cc).
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
#include "launcher/api/wire.h"
#include "launcher/node/node_cgroup.h"

namespace strata::launcher {

using nlohmann::json;
using Response = HttpServer::Response;
using Request = HttpServer::Request;
using namespace api;  // (the wire: parsing, answers, keys)

namespace {

// Warm pools stop filling this far above the memory reserve.
constexpr uint64_t kWarmMemoryMargin = uint64_t{256} << 20;

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
  if (!options.tokens_file.empty() && !options.legacy_token_file.empty()) {
    return Error(EINVAL, "serve: give --tokens or the old --token-file, not both");
  }
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

void LauncherServer::SetPlane(std::shared_ptr<const Plane> plane) {
  std::lock_guard lock(plane_mu_);
  plane_ = std::move(plane);
}

std::shared_ptr<const LauncherServer::Plane> LauncherServer::plane() {
  std::lock_guard lock(plane_mu_);
  return plane_;
}

Response LauncherServer::Handle(const Request& req) {
  if (auto p = plane(); p && p->claims(req)) return p->handle(req);
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
  if (verb == "usage" && req.method == "GET") {  // (watching a sandbox does not keep it alive)
    auto r = manager_.Usage(id);
    return r.ok() ? Json(*r) : Fail(r.status());
  }
  manager_.Touch(id);  // every other call on a sandbox renews its ttl
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
  if (verb == "lifetime" && req.method == "POST") {
    auto deadline = DeadlineField(body.value("seconds", json()), "lifetime: seconds");
    if (!deadline.ok()) return Fail(deadline.status());
    return status_reply(manager_.SetDeadline(id, *deadline));
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

}  // namespace strata::launcher
