// A forwarded call runs on a thread of its own (libcurl's easy interface
// blocks), handing the answer to the caller's connection thread through a
// Relay: the status and headers first, then the body in bounded pieces.
#include "launcher/cluster/forward.h"

#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <thread>

#include "cache/http_client.h"
#include "common/strings.h"

namespace strata::launcher {

namespace {

// Body bytes a relay holds before the node's side waits for the caller's.
constexpr size_t kRelayBytes = size_t{1} << 20;
// The headers of a node's answer a caller may need.
constexpr const char* kPassedHeaders[] = {"retry-after", "www-authenticate", "x-strata-file-size", "x-next-token"};

bool Gone(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

// One forwarded call's hand-over between the thread that talks to the node
// and the caller's connection thread.
struct Relay {
  std::mutex mu;
  std::condition_variable cv;
  bool headed = false, done = false;
  std::atomic<bool> cancel{false};
  cache::HttpResponse head;
  std::deque<std::string> pieces;
  size_t queued = 0;
  Status error;  // set with done when no answer came
  // The upload's side (ForwardUpload): pieces for the node, then the end.
  std::deque<std::string> upload;
  size_t upload_queued = 0;
  bool upload_end = false;
  std::string upload_current;
  size_t upload_pos = 0;

  bool OnHeaders(const cache::HttpResponse& h) {
    std::lock_guard lock(mu);
    head = h;
    headed = true;
    cv.notify_all();
    return !cancel;
  }
  bool OnBody(std::string_view piece) {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return queued < kRelayBytes || cancel; });
    if (cancel) return false;
    pieces.emplace_back(piece);
    queued += piece.size();
    cv.notify_all();
    return true;
  }
  size_t Source(char* buf, size_t n) {
    std::unique_lock lock(mu);
    while (upload_pos == upload_current.size()) {
      cv.wait(lock, [&] { return !upload.empty() || upload_end || cancel; });
      if (cancel) return cache::HttpRequest::kAbortSource;
      if (upload.empty()) return 0;  // the end
      upload_current = std::move(upload.front());
      upload.pop_front();
      upload_queued -= upload_current.size();
      upload_pos = 0;
      cv.notify_all();
    }
    const size_t copy = std::min(n, upload_current.size() - upload_pos);
    std::memcpy(buf, upload_current.data() + upload_pos, copy);
    upload_pos += copy;
    return copy;
  }
  void Finish(Result<cache::HttpResponse> r) {
    std::lock_guard lock(mu);
    if (!r.ok()) error = r.status();
    done = true;
    cv.notify_all();
  }
};

// Owns the node-side thread: cancels and joins it when the last user of
// the call (its stream, an upload) lets go.
struct RelayThread {
  std::shared_ptr<Relay> relay;
  std::thread thread;
  ~RelayThread() {
    relay->cancel = true;
    relay->cv.notify_all();
    if (thread.joinable()) thread.join();
  }
};

bool IsJson(const cache::HttpResponse& h) {
  auto type = h.Header("content-type");
  return type && type->starts_with("application/json");
}

void CopyHead(const cache::HttpResponse& head, HttpServer::Response* r) {
  r->status = static_cast<int>(head.status);
  if (auto type = head.Header("content-type")) r->content_type = std::string(*type);
  for (const char* name : kPassedHeaders) {
    if (auto v = head.Header(name)) r->headers.emplace_back(name, std::string(*v));
  }
}

// What a node answered with no error: reached; a connection that was never
// made: not reached (nothing was sent).
bool Reached(const Status& s) {
  return !(s.code() == ECONNREFUSED || s.code() == EHOSTUNREACH || s.code() == ENETUNREACH || s.code() == EACCES);
}

}  // namespace

Forwarder::Forwarder(Options options) : options_(std::move(options)) {}
Forwarder::~Forwarder() = default;

cache::HttpClient& Forwarder::ClientFor(const std::string& node_url) {
  std::lock_guard lock(mu_);
  auto& c = clients_[node_url];
  if (!c) {
    cache::HttpOptions o;
    o.connect_timeout = options_.connect_timeout;
    // A forwarded call lasts as long as the node's answer (an exec runs
    // for as long as its command); the caller's hang-up cuts it.
    o.attempt_timeout = o.deadline = std::chrono::hours(24 * 7);
    o.attempts = 1;
    o.ca_file = options_.ca_file;
    c = std::make_unique<cache::HttpClient>("node " + node_url, o);
  }
  return *c;
}

namespace {

std::shared_ptr<RelayThread> Start(cache::HttpClient& client, const std::string& credential, Forwarder::Call& call, bool upload) {
  auto owner = std::make_shared<RelayThread>();
  owner->relay = std::make_shared<Relay>();
  owner->thread = std::thread([&client, relay = owner->relay, call = std::move(call), credential, upload] {
    cache::HttpRequest request;
    request.method = call.method;
    request.url = call.node_url + call.target;
    if (call.as_gateway) {
      request.headers.push_back("Authorization: Bearer " + credential);
      if (!call.tenant.empty()) request.headers.push_back("X-Strata-Tenant: " + call.tenant);
    }
    for (const auto& [k, v] : call.headers) request.headers.push_back(k + ": " + v);
    request.body = call.body;
    request.any_status = true;
    request.cancel = &relay->cancel;
    request.on_headers = [&](const cache::HttpResponse& h) { return relay->OnHeaders(h); };
    request.sink = [&](std::string_view piece) { return relay->OnBody(piece); };
    if (upload) request.source = [&](char* buf, size_t n) { return relay->Source(buf, n); };
    relay->Finish(client.Perform(request, call.method + " " + call.target));
  });
  return owner;
}

}  // namespace

Forwarder::Outcome Forwarder::Forward(Call call) {
  Outcome out;
  std::shared_ptr<int> client_fd = call.client_fd;
  const auto deadline = call.timeout.count() > 0 ? std::chrono::steady_clock::now() + call.timeout
                                                  : std::chrono::steady_clock::time_point::max();
  auto owner = Start(ClientFor(call.node_url), options_.credential, call, false);
  Relay& relay = *owner->relay;
  std::unique_lock lock(relay.mu);
  // Waits for `ready`, waking each second to notice a caller that hung up
  // or a deadline that passed: the node's call is cut then (ECANCELED,
  // ETIMEDOUT).
  auto await = [&](const auto& ready) -> Status {
    while (!relay.cv.wait_for(lock, std::chrono::seconds(1), ready)) {
      if (Gone(client_fd ? *client_fd : -1)) return Error(ECANCELED, "the caller hung up");
      if (std::chrono::steady_clock::now() >= deadline) {
        return Error(ETIMEDOUT, StrCat("node ", call.node_url, " did not answer within ",
                                       std::chrono::duration_cast<std::chrono::seconds>(call.timeout).count(), " s"));
      }
    }
    return OkStatus();
  };
  if (Status s = await([&] { return relay.headed || relay.done; }); !s.ok()) {
    out.error = s;
    out.reached = true;
    return out;  // (~RelayThread cancels the node's call)
  }
  if (!relay.headed) {  // no answer at all
    out.error = relay.error.ok() ? Error(EPROTO, "node " + call.node_url + " answered nothing") : relay.error;
    out.reached = Reached(out.error);
    return out;
  }
  CopyHead(relay.head, &out.response);
  if (IsJson(relay.head) || relay.head.status >= 300) {
    // A JSON answer (or an error) is read whole, so the gateway can read
    // it; the relay's bound only paces the node's side.
    while (true) {
      if (Status s = await([&] { return relay.done || !relay.pieces.empty(); }); !s.ok()) {
        out.error = s;
        out.reached = true;
        return out;
      }
      for (auto& p : relay.pieces) out.response.body += p;
      relay.pieces.clear();
      relay.queued = 0;
      relay.cv.notify_all();
      if (relay.done && relay.pieces.empty()) break;
    }
    if (!relay.error.ok()) {  // cut short: a part of an answer is no answer
      out.error = relay.error;
      out.reached = true;
    }
    return out;
  }
  lock.unlock();
  out.response.stream = [owner, client_fd](const HttpServer::StreamWriter& write) {
    Relay& r = *owner->relay;
    std::unique_lock held(r.mu);
    while (true) {
      // Wakes each second to notice a caller that hung up while the node
      // says nothing (a quiet command): the node's call is cut then.
      r.cv.wait_for(held, std::chrono::seconds(1), [&] { return !r.pieces.empty() || r.done; });
      if (r.pieces.empty()) {
        if (r.done) {
          // A node that failed mid-answer: the caller's body is cut too,
          // never ended as if it were whole.
          if (!r.error.ok()) throw std::runtime_error("relay from the node broke: " + r.error.ToString());
          return;
        }
        if (Gone(client_fd ? *client_fd : -1)) return;  // (~RelayThread cancels)
        continue;
      }
      std::string piece = std::move(r.pieces.front());
      r.pieces.pop_front();
      r.queued -= piece.size();
      r.cv.notify_all();
      held.unlock();
      const bool more = write(piece);
      held.lock();
      if (!more) return;
    }
  };
  return out;
}

namespace {

class RelayedUpload : public HttpServer::Upload {
 public:
  explicit RelayedUpload(std::shared_ptr<RelayThread> owner) : owner_(std::move(owner)) {}
  Status Write(std::string_view piece) override {
    Relay& r = *owner_->relay;
    std::unique_lock lock(r.mu);
    r.cv.wait(lock, [&] { return r.upload_queued < kRelayBytes || r.done; });
    // A node that answered before the body ended (a refusal: another
    // tenant's sandbox, no space) has its answer; the rest of the body is
    // dropped and Finish() gives the caller that answer.
    if (r.done) return r.headed ? OkStatus() : r.error;
    r.upload.emplace_back(piece);
    r.upload_queued += piece.size();
    r.cv.notify_all();
    return OkStatus();
  }
  HttpServer::Response Finish() override {
    Relay& r = *owner_->relay;
    std::unique_lock lock(r.mu);
    r.upload_end = true;
    r.cv.notify_all();
    r.cv.wait(lock, [&] { return r.done; });
    if (!r.headed) return HttpServer::ErrorResponse(r.error.ok() ? Error(EPROTO, "the node answered nothing") : r.error);
    HttpServer::Response response;
    CopyHead(r.head, &response);
    for (auto& p : r.pieces) response.body += p;
    return response;
  }
  void Abort() override { owner_.reset(); }

 private:
  std::shared_ptr<RelayThread> owner_;
};

}  // namespace

std::unique_ptr<HttpServer::Upload> Forwarder::ForwardUpload(Call call) {
  return std::make_unique<RelayedUpload>(Start(ClientFor(call.node_url), options_.credential, call, true));
}

}  // namespace strata::launcher
