// envd's directory watches on the agent's (protocol 7, kWatch): WatchDir
// streams a watch's events as they come; CreateWatcher, GetWatcherEvents
// and RemoveWatcher keep one on the node for a client that polls (E2B's
// Python SDK does), its events queued until asked for.
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <thread>

#include "common/crypto.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "launcher/e2b/connect.h"
#include "launcher/e2b/filesystem.pb.h"
#include "launcher/e2b/plane.h"
#include "launcher/e2b/routes.h"

namespace strata::launcher::e2b {

using nlohmann::json;
using Request = HttpServer::Request;
using Response = HttpServer::Response;

namespace {

// The most events a polled watcher keeps between two asks; past them it
// ends, and the next ask says events were lost.
constexpr size_t kMaxQueuedEvents = 10000;
// The most polled watchers one sandbox has at once.
constexpr size_t kMaxWatchersPerSandbox = 64;
// How long CreateWatcher waits for the agent to set the watch up.
constexpr auto kWatchStartTimeout = std::chrono::seconds(10);

filesystem::EventType EventTypeOf(const std::string& type) {
  if (type == "create") return filesystem::EVENT_TYPE_CREATE;
  if (type == "write") return filesystem::EVENT_TYPE_WRITE;
  if (type == "remove") return filesystem::EVENT_TYPE_REMOVE;
  if (type == "rename") return filesystem::EVENT_TYPE_RENAME;
  if (type == "chmod") return filesystem::EVENT_TYPE_CHMOD;
  return filesystem::EVENT_TYPE_UNSPECIFIED;
}

filesystem::FilesystemEvent EventOf(const json& e) {
  filesystem::FilesystemEvent out;
  out.set_name(e.value("name", ""));
  out.set_type(EventTypeOf(e.value("type", "")));
  return out;
}

// An older agent answers a watch as a request it does not know.
Status WatchError(Status s, const std::string& id) {
  if (s.code() == EPROTO && s.message().find("unknown request") != std::string::npos) {
    return Error(ENOTSUP, "sandbox " + id + ": its agent is older than protocol 7 (no directory watches)");
  }
  return s;
}

}  // namespace

// A polled watch: the agent's watch on a thread of its own, its events
// queued; destroying it cuts the watch (its cancel pipe closes) and joins.
class Watcher {
 public:
  Watcher(std::string sandbox, AgentClient agent, std::string path, bool recursive) : sandbox_(std::move(sandbox)) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) {
      Finish(ErrnoError(errno, "watch: pipe"));
      return;
    }
    cancel_r_.reset(p[0]);
    cancel_w_.reset(p[1]);
    thread_ = std::thread([this, agent = std::move(agent), path = std::move(path), recursive]() mutable {
      Status s = agent.Watch(
          path, recursive,
          [&] {
            std::lock_guard lock(mu_);
            started_ = true;
            cv_.notify_all();
          },
          [&](const json& e) {
            std::lock_guard lock(mu_);
            if (events_.size() >= kMaxQueuedEvents) {
              error_ = Error(EOVERFLOW, StrCat("watcher: more than ", kMaxQueuedEvents, " events were not asked for; the rest were lost"));
              return false;
            }
            events_.push_back(e);
            return true;
          },
          cancel_r_.get());
      Finish(std::move(s));
    });
  }
  ~Watcher() {
    cancel_w_.reset();
    if (thread_.joinable()) thread_.join();
  }
  const std::string& sandbox() const { return sandbox_; }

  // Until the watch is in place (ok) or failed.
  Status AwaitStart() {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, kWatchStartTimeout, [&] { return started_ || done_; })) {
      return Error(ETIMEDOUT, "watcher: the sandbox's agent did not set the watch up");
    }
    return started_ ? OkStatus() : error_;
  }
  // The events since the last ask; once none are left, why it ended.
  Result<std::vector<json>> Take() {
    std::lock_guard lock(mu_);
    std::vector<json> out(events_.begin(), events_.end());
    events_.clear();
    if (out.empty() && done_) return error_.ok() ? Error(ENOENT, "watcher: the watched directory is gone") : error_;
    return out;
  }

 private:
  void Finish(Status s) {
    std::lock_guard lock(mu_);
    if (error_.ok()) error_ = std::move(s);
    done_ = true;
    cv_.notify_all();
  }

  std::string sandbox_;
  UniqueFd cancel_r_, cancel_w_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, done_ = false;
  Status error_;
  std::deque<json> events_;
  std::thread thread_;
};

Response Plane::Watch(const Request& request, const Call& call, const std::string& id) {
  SandboxManager& manager = server_.manager();
  const std::string user = EnvdUser(request);
  auto agent = manager.AgentOf(id, "watch a directory");
  if (!agent.ok()) return ErrorFor(request, CodeOf(agent.status()), agent.status().message());
  if (call.method == "WatchDir") {
    if (!call.streaming) return ErrorReply(Code::kInvalidArgument, "filesystem: WatchDir is a streaming call (application/connect+json)");
    filesystem::WatchDirRequest in;
    if (Status s = Decode(call, 0, &in); !s.ok()) return ErrorFor(request, CodeOf(s), s.message());
    auto path = EnvdPath(in.path(), user);
    if (!path.ok()) return ErrorFor(request, Code::kInvalidArgument, "filesystem: WatchDir: " + path.status().message());
    auto watch = CallerConnection(request);
    const int64_t keepalive = KeepAliveInterval(request);
    Response r;
    r.content_type = StreamContentType(call);
    r.stream = [agent = *agent, id, path = *path, recursive = in.recursive(), watch, keepalive, c = call](
                   const HttpServer::StreamWriter& write) mutable {
      auto event = [&](const filesystem::WatchDirResponse& e) { return write(StreamMessage(c, e)); };
      std::optional<KeepAlive> ticking;
      Status s = agent.Watch(
          path, recursive,
          [&] {
            filesystem::WatchDirResponse start;
            start.mutable_start();
            event(start);
            ticking.emplace(keepalive, [&] {
              filesystem::WatchDirResponse alive;
              alive.mutable_keepalive();
              event(alive);
            });
          },
          [&](const json& e) {
            filesystem::WatchDirResponse out;
            *out.mutable_filesystem() = EventOf(e);
            return event(out);
          },
          watch->get());
      ticking.reset();
      if (s.code() == ECANCELED) return;  // (nobody hears it)
      write(s.ok() ? StreamEnd() : StreamEnd(WatchError(s, id)));
    };
    return r;
  }
  if (call.streaming) return ErrorFor(request, Code::kInvalidArgument, "filesystem: " + call.method + " is not a streaming call");
  if (call.method == "CreateWatcher") {
    filesystem::CreateWatcherRequest in;
    if (Status s = Decode(call, 0, &in); !s.ok()) return ErrorReply(s);
    auto path = EnvdPath(in.path(), user);
    if (!path.ok()) return ErrorReply(Code::kInvalidArgument, "filesystem: CreateWatcher: " + path.status().message());
    std::vector<std::shared_ptr<Watcher>> gone;  // (stopped outside the lock)
    {
      std::lock_guard lock(watchers_mu_);
      size_t theirs = 0;
      for (auto it = watchers_.begin(); it != watchers_.end();) {
        if (!manager.Live(it->second->sandbox())) {
          gone.push_back(std::move(it->second));
          it = watchers_.erase(it);
          continue;
        }
        theirs += it->second->sandbox() == id ? 1 : 0;
        ++it;
      }
      if (theirs >= kMaxWatchersPerSandbox) {
        return ErrorReply(Code::kResourceExhausted, StrCat("filesystem: sandbox ", id, " has ", kMaxWatchersPerSandbox, " watchers already"));
      }
    }
    gone.clear();
    auto w = std::make_shared<Watcher>(id, *agent, *path, in.recursive());
    if (Status s = w->AwaitStart(); !s.ok()) return ErrorReply(WatchError(s, id));
    auto random = RandomBytes(8);
    if (!random.ok()) return ErrorReply(random.status());
    const std::string wid = "w-" + HexEncode(std::span(reinterpret_cast<const uint8_t*>(random->data()), random->size()));
    {
      std::lock_guard lock(watchers_mu_);
      watchers_[wid] = w;
    }
    filesystem::CreateWatcherResponse out;
    out.set_watcher_id(wid);
    return UnaryReply(call, out);
  }
  // GetWatcherEvents and RemoveWatcher name a watcher of this sandbox.
  filesystem::GetWatcherEventsRequest in;  // (RemoveWatcherRequest is the same shape)
  if (Status s = Decode(call, 0, &in); !s.ok()) return ErrorReply(s);
  std::shared_ptr<Watcher> w;
  {
    std::lock_guard lock(watchers_mu_);
    auto it = watchers_.find(in.watcher_id());
    if (it == watchers_.end() || it->second->sandbox() != id) {
      return ErrorReply(Code::kNotFound, "filesystem: watcher " + Quote(in.watcher_id()) + " not found");
    }
    w = it->second;
    if (call.method == "RemoveWatcher") watchers_.erase(it);
  }
  if (call.method == "RemoveWatcher") {
    w.reset();  // (the last one stops it)
    return UnaryReply(call, filesystem::RemoveWatcherResponse());
  }
  auto events = w->Take();
  if (!events.ok()) {
    std::lock_guard lock(watchers_mu_);
    watchers_.erase(in.watcher_id());  // (ended: told once)
    return ErrorReply(WatchError(events.status(), id));
  }
  filesystem::GetWatcherEventsResponse out;
  for (const auto& e : *events) *out.add_events() = EventOf(e);
  return UnaryReply(call, out);
}

}  // namespace strata::launcher::e2b
