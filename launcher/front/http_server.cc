// HttpServer over libmicrohttpd.
//
// Limits. libmicrohttpd enforces the connection caps (in all and per client
// address) and the header size (its per-connection memory pool); we enforce
// the body sizes in the access handler. Its own timeout counts only
// inactivity, so a client sending a byte every few seconds would hold a
// connection (and its thread) for ever, and it would also cut a streamed
// exec whose command is silent for a while. So timeouts are ours: every
// connection has a state (idle, reading a request, handling it) and a
// watchdog thread shuts down the socket of one that stays idle or reading
// for too long. It does that on a duplicate of the descriptor, which stays
// ours until libmicrohttpd says the connection closed, so it can never hit
// a reused descriptor.
#include "launcher/front/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "common/dynlib.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "common/units.h"
#include "common/unix_socket.h"

namespace strata {

namespace {

using Clock = std::chrono::steady_clock;

// libmicrohttpd (and the TLS library it brings) is loaded when a server
// starts, not at program start: the launcher is a client far more often
// than `launcher serve` (common/dynlib.h).
struct MhdApi {
  Status status;  // why loading failed
  decltype(&MHD_add_response_header) add_response_header = nullptr;
  decltype(&MHD_create_response_from_buffer) create_response_from_buffer = nullptr;
  decltype(&MHD_create_response_from_callback) create_response_from_callback = nullptr;
  decltype(&MHD_destroy_response) destroy_response = nullptr;
  decltype(&MHD_get_connection_info) get_connection_info = nullptr;
  decltype(&MHD_get_connection_values) get_connection_values = nullptr;
  decltype(&MHD_get_connection_values_n) get_connection_values_n = nullptr;
  decltype(&MHD_queue_response) queue_response = nullptr;
  decltype(&MHD_start_daemon) start_daemon = nullptr;
  decltype(&MHD_stop_daemon) stop_daemon = nullptr;
  decltype(&MHD_create_post_processor) create_post_processor = nullptr;
  decltype(&MHD_post_process) post_process = nullptr;
  decltype(&MHD_destroy_post_processor) destroy_post_processor = nullptr;
};

const MhdApi& Mhd() {
  static const MhdApi api = [] {
    MhdApi a;
    auto lib = DynamicLibrary::Open(STRATA_MICROHTTPD_SONAME, "libmicrohttpd12");
    if (!lib.ok()) {
      a.status = lib.status();
      return a;
    }
    auto get = [&](auto& fn, const char* name) {
      if (a.status.ok()) a.status = lib->Resolve(fn, name);
    };
    get(a.add_response_header, "MHD_add_response_header");
    get(a.create_response_from_buffer, "MHD_create_response_from_buffer");
    get(a.create_response_from_callback, "MHD_create_response_from_callback");
    get(a.destroy_response, "MHD_destroy_response");
    get(a.get_connection_info, "MHD_get_connection_info");
    get(a.get_connection_values, "MHD_get_connection_values");
    get(a.get_connection_values_n, "MHD_get_connection_values_n");
    get(a.queue_response, "MHD_queue_response");
    get(a.start_daemon, "MHD_start_daemon");
    get(a.stop_daemon, "MHD_stop_daemon");
    get(a.create_post_processor, "MHD_create_post_processor");
    get(a.post_process, "MHD_post_process");
    get(a.destroy_post_processor, "MHD_destroy_post_processor");
    return a;
  }();
  return api;
}

// One client connection, from libmicrohttpd's "started" to its "closed".
struct Conn {
  enum State { kIdle, kReading, kUpload, kHandling };
  UniqueFd watch;  // a duplicate of the socket, for the watchdog's shutdown
  State state = kIdle;
  Clock::time_point since = Clock::now();
  bool cut = false;
};

// One request across the access handler's calls (the body arrives in pieces).
struct Pending {
  Conn* conn = nullptr;
  bool headers_done = false;
  HttpServer::Request request;
  uint64_t declared = 0;  // Content-Length, if any
  bool too_large = false;
  std::unique_ptr<HttpServer::Upload> upload;
  uint64_t uploaded = 0;
  Status upload_error;
  bool finished = false;  // Finish() or Abort() was called
  MHD_PostProcessor* form = nullptr;  // a form upload's decoder
  ~Pending() {
    if (form) Mhd().destroy_post_processor(form);
  }
};

// Hands a form upload's decoded pieces to its Upload; stops at an error.
MHD_Result FormPiece(void* cls, MHD_ValueKind, const char* key, const char* filename, const char* content_type,
                     const char*, const char* data, uint64_t off, size_t size) {
  auto* pending = static_cast<Pending*>(cls);
  HttpServer::Upload::FormPiece piece{.field = key ? key : "", .filename = filename ? filename : "",
                                      .content_type = content_type ? content_type : "", .offset = off,
                                      .data = std::string_view(data ? data : "", size)};
  try {
    pending->upload_error = pending->upload->WritePart(piece);
  } catch (const std::exception& e) {
    pending->upload_error = Error(EIO, StrCat("upload: ", e.what()));
  }
  return pending->upload_error.ok() ? MHD_YES : MHD_NO;
}

}  // namespace

struct HttpServer::Impl {
  Options options;
  MHD_Daemon* daemon = nullptr;
  std::mutex mu;  // guards conns and their states
  std::set<Conn*> conns;
  std::condition_variable cv;
  bool stopping = false;
  std::thread watchdog;

  void SetState(Conn* c, Conn::State s) {
    if (!c) return;
    std::lock_guard lock(mu);
    c->state = s;
    c->since = Clock::now();
  }

  void Watch() {
    std::unique_lock lock(mu);
    const auto& l = options.limits;
    while (!cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopping; })) {
      const auto now = Clock::now();
      for (Conn* c : conns) {
        if (c->cut) continue;
        // An upload has no deadline as a whole, but goes idle like a
        // connection when no byte of it arrives (its state is renewed by
        // every piece).
        bool late = ((c->state == Conn::kIdle || c->state == Conn::kUpload) && l.idle_timeout.count() > 0 &&
                     now - c->since > l.idle_timeout) ||
                    (c->state == Conn::kReading && l.request_timeout.count() > 0 && now - c->since > l.request_timeout);
        if (late) {
          ::shutdown(c->watch.get(), SHUT_RDWR);
          c->cut = true;
        }
      }
    }
  }
};

namespace {

std::string DumpJson(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

// The state of a streamed body: the handler's stream function runs on its
// own thread and hands pieces to MHD's content reader.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pieces;
  size_t offset = 0;  // into pieces.front()
  bool done = false;
  bool failed = false;  // the producer threw: the body is cut, not ended
  bool closed = false;  // the client went away
  std::thread producer;
};

ssize_t StreamRead(void* cls, uint64_t, char* buf, size_t max) {
  auto* s = static_cast<Stream*>(cls);
  std::unique_lock lock(s->mu);
  s->cv.wait(lock, [&] { return !s->pieces.empty() || s->done; });
  if (s->pieces.empty()) return s->failed ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
  std::string& front = s->pieces.front();
  size_t n = std::min(max, front.size() - s->offset);
  std::memcpy(buf, front.data() + s->offset, n);
  s->offset += n;
  if (s->offset == front.size()) {
    s->pieces.pop_front();
    s->offset = 0;
    s->cv.notify_all();
  }
  return static_cast<ssize_t>(n);
}

void StreamFree(void* cls) {
  auto* s = static_cast<Stream*>(cls);
  {
    std::lock_guard lock(s->mu);
    s->closed = true;
    s->pieces.clear();
  }
  s->cv.notify_all();
  if (s->producer.joinable()) s->producer.join();
  delete s;
}

// With the lengths: a value with an escaped NUL ("%00") keeps it, so a
// handler can refuse it instead of seeing the value cut short.
MHD_Result CollectArg(void* cls, MHD_ValueKind, const char* key, size_t key_size, const char* value, size_t value_size) {
  auto* map = static_cast<std::map<std::string, std::string>*>(cls);
  std::string k = key ? std::string(key, key_size) : "";
  (*map)[k] = value ? std::string(value, value_size) : "";
  return MHD_YES;
}

MHD_Result CollectHeader(void* cls, MHD_ValueKind, const char* key, const char* value) {
  auto* map = static_cast<std::map<std::string, std::string>*>(cls);
  std::string k = key ? key : "";
  std::transform(k.begin(), k.end(), k.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  (*map)[k] = value ? value : "";
  return MHD_YES;
}

// Queues `response`; never throws (it runs inside libmicrohttpd's C
// frames): a failure closes the connection instead.
MHD_Result SendOrClose(MHD_Connection* connection, HttpServer::Response response);

MHD_Result Send(MHD_Connection* connection, HttpServer::Response response) {
  try {
    return SendOrClose(connection, std::move(response));
  } catch (const std::exception& e) {
    STRATA_LOG(kError) << "http: could not answer: " << e.what();
    return MHD_NO;
  }
}

MHD_Result SendOrClose(MHD_Connection* connection, HttpServer::Response response) {
  MHD_Response* r;
  if (response.stream) {
    // The response first: if it cannot be made, no producer is left
    // waiting on a reader that never comes.
    auto* s = new Stream();
    r = Mhd().create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, StreamRead, s, StreamFree);
    if (!r) {
      delete s;
      return MHD_NO;
    }
    auto produce = std::move(response.stream);
    s->producer = std::thread([s, produce] {
      HttpServer::StreamWriter write = [s](std::string_view chunk) {
        std::unique_lock lock(s->mu);
        // Bounded buffering: wait while the client is slow.
        s->cv.wait(lock, [&] { return s->pieces.size() < 64 || s->closed; });
        if (s->closed) return false;
        if (!chunk.empty()) s->pieces.emplace_back(chunk);
        s->cv.notify_all();
        return true;
      };
      bool failed = false;
      try {
        produce(write);
      } catch (const std::exception& e) {
        STRATA_LOG(kWarn) << "http stream cut: " << e.what();
        failed = true;
      }
      std::lock_guard lock(s->mu);
      s->failed = failed;
      s->done = true;
      s->cv.notify_all();
    });
  } else {
    r = Mhd().create_response_from_buffer(response.body.size(), response.body.data(), MHD_RESPMEM_MUST_COPY);
  }
  if (!r) return MHD_NO;
  Mhd().add_response_header(r, "Content-Type", response.content_type.c_str());
  for (const auto& [name, value] : response.headers) Mhd().add_response_header(r, name.c_str(), value.c_str());
  MHD_Result ret = Mhd().queue_response(connection, static_cast<unsigned>(response.status), r);
  Mhd().destroy_response(r);
  return ret;
}

HttpServer::Response TooLarge(std::string_view what, uint64_t cap) {
  return HttpServer::ErrorResponse(Error(EFBIG, StrCat(what, " is larger than the server takes (", FormatBytes(cap), ")")));
}

void FillPeer(MHD_Connection* connection, HttpServer::Request* request) {
  if (const MHD_ConnectionInfo* info = Mhd().get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD)) {
    request->connection_fd = info->connect_fd;
  }
  const MHD_ConnectionInfo* addr = Mhd().get_connection_info(connection, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  const sockaddr* sa = addr ? addr->client_addr : nullptr;
  if (sa && (sa->sa_family == AF_INET || sa->sa_family == AF_INET6)) {
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = sa->sa_family == AF_INET ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(sa)->sin_addr)
                                               : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr);
    ::inet_ntop(sa->sa_family, raw, text, sizeof text);
    request->peer_address = text;
    return;
  }
  // A unix socket: the peer's credentials, checked by the kernel.
  ucred cred{};
  socklen_t len = sizeof cred;
  if (request->connection_fd >= 0 && ::getsockopt(request->connection_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    request->unix_peer = true;
    request->peer_uid = cred.uid;
    request->peer_gid = cred.gid;
    request->peer_pid = cred.pid;
  }
}

MHD_Result Access(void* cls, MHD_Connection* connection, const char* url, const char* method, const char*,
                  const char* upload_data, size_t* upload_size, void** con_cls) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  const auto& limits = impl->options.limits;
  auto* pending = static_cast<Pending*>(*con_cls);
  if (!pending) {  // (the URI callback makes one; this is only defensive)
    pending = new Pending();
    *con_cls = pending;
  }
  if (!pending->headers_done) {
    pending->headers_done = true;
    HttpServer::Request& request = pending->request;
    request.method = method;
    request.path = url;
    Mhd().get_connection_values_n(connection, MHD_GET_ARGUMENT_KIND, CollectArg, &request.query);
    Mhd().get_connection_values(connection, MHD_HEADER_KIND, CollectHeader, &request.headers);
    FillPeer(connection, &request);
    if (auto it = request.headers.find("content-length"); it != request.headers.end()) {
      pending->declared = std::strtoull(it->second.c_str(), nullptr, 10);
    }
    if (impl->options.upload) {
      std::optional<HttpServer::Response> refusal;
      try {
        pending->upload = impl->options.upload(request, &refusal);
      } catch (const std::exception& e) {
        refusal = HttpServer::ErrorResponse(Error(EIO, StrCat("internal error: ", e.what())));
      }
      if (refusal) {
        pending->finished = true;
        return Send(connection, std::move(*refusal));
      }
    }
    if (pending->upload && pending->upload->form()) {
      pending->form = Mhd().create_post_processor(connection, 64 << 10, FormPiece, pending);
      if (!pending->form) {
        pending->upload->Abort();
        pending->finished = true;
        return Send(connection, HttpServer::ErrorResponse(Error(EINVAL, StrCat(request.method, " ", request.path,
                                                                                ": the body is not a form (multipart/form-data)"))));
      }
    }
    if (pending->upload && pending->declared > limits.max_upload_bytes) {
      pending->upload->Abort();
      pending->finished = true;
      return Send(connection, TooLarge("upload", limits.max_upload_bytes));
    }
    if (!pending->upload && pending->declared > limits.max_body_bytes) {
      return Send(connection, TooLarge("request body", limits.max_body_bytes));
    }
    impl->SetState(pending->conn, pending->upload ? Conn::kUpload : Conn::kReading);
    return MHD_YES;
  }
  if (*upload_size > 0) {
    const size_t n = *upload_size;
    *upload_size = 0;
    if (pending->upload) {
      impl->SetState(pending->conn, Conn::kUpload);  // it is moving
      pending->uploaded += n;
      // After an error the rest is read and dropped, so the error can be
      // the answer, but only up to the upload cap: past it the connection
      // closes (an endless body must not keep a thread reading).
      if (!pending->upload_error.ok()) return pending->uploaded > limits.max_upload_bytes ? MHD_NO : MHD_YES;
      if (pending->uploaded > limits.max_upload_bytes) {
        pending->upload_error = Error(EFBIG, StrCat("upload is larger than the server takes (", FormatBytes(limits.max_upload_bytes), ")"));
      } else {
        if (pending->form) {
          if (Mhd().post_process(pending->form, upload_data, n) != MHD_YES && pending->upload_error.ok()) {
            pending->upload_error = Error(EINVAL, StrCat(pending->request.method, " ", pending->request.path, ": a malformed form"));
          }
        } else {
          try {
            pending->upload_error = pending->upload->Write(std::string_view(upload_data, n));
          } catch (const std::exception& e) {
            pending->upload_error = Error(EIO, StrCat("upload: ", e.what()));
          }
        }
      }
      if (!pending->upload_error.ok()) {
        pending->upload->Abort();
        pending->finished = true;
      }
      return MHD_YES;
    }
    if (pending->too_large) return MHD_YES;
    if (pending->request.body.size() + n > limits.max_body_bytes) {
      pending->too_large = true;  // (a chunked body with no length said)
      std::string().swap(pending->request.body);
      return MHD_YES;
    }
    pending->request.body.append(upload_data, n);
    return MHD_YES;
  }
  // The whole request is in.
  impl->SetState(pending->conn, Conn::kHandling);
  if (pending->too_large) return Send(connection, TooLarge("request body", limits.max_body_bytes));
  HttpServer::Response response;
  try {
    if (pending->upload) {
      if (pending->form && pending->upload_error.ok()) {
        // (It hands over what it held back, and says whether the body ended where a form may.)
        MHD_PostProcessor* form = std::exchange(pending->form, nullptr);
        if (Mhd().destroy_post_processor(form) != MHD_YES && pending->upload_error.ok()) {
          pending->upload_error = Error(EINVAL, StrCat(pending->request.method, " ", pending->request.path, ": the form is cut short"));
        }
        if (!pending->upload_error.ok()) pending->upload->Abort();
      }
      if (!pending->upload_error.ok()) {
        response = pending->upload->Refused(pending->upload_error);
      } else {
        pending->finished = true;
        response = pending->upload->Finish();
      }
    } else {
      response = impl->options.handler(pending->request);
    }
  } catch (const std::exception& e) {
    response = HttpServer::ErrorResponse(Error(EIO, StrCat("internal error: ", e.what())));
  }
  return Send(connection, std::move(response));
}

void* UriStarted(void* cls, const char*, MHD_Connection* connection) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  auto* pending = new Pending();
  if (const MHD_ConnectionInfo* info = Mhd().get_connection_info(connection, MHD_CONNECTION_INFO_SOCKET_CONTEXT)) {
    pending->conn = static_cast<Conn*>(info->socket_context);
  }
  impl->SetState(pending->conn, Conn::kReading);
  return pending;
}

void Completed(void* cls, MHD_Connection*, void** con_cls, MHD_RequestTerminationCode) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  auto* pending = static_cast<Pending*>(*con_cls);
  if (!pending) return;
  if (pending->upload && !pending->finished) pending->upload->Abort();  // the client went away mid-upload
  impl->SetState(pending->conn, Conn::kIdle);
  delete pending;
  *con_cls = nullptr;
}

void ConnectionEvent(void* cls, MHD_Connection* connection, void** socket_context, MHD_ConnectionNotificationCode code) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    auto* c = new Conn();
    if (const MHD_ConnectionInfo* info = Mhd().get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD)) {
      c->watch.reset(::fcntl(info->connect_fd, F_DUPFD_CLOEXEC, 0));
    }
    std::lock_guard lock(impl->mu);
    impl->conns.insert(c);
    *socket_context = c;
    return;
  }
  auto* c = static_cast<Conn*>(*socket_context);
  if (!c) return;
  {
    std::lock_guard lock(impl->mu);
    impl->conns.erase(c);
  }
  delete c;
  *socket_context = nullptr;
}

Result<UniqueFd> ListenTcp(const std::string& address, uint16_t* bound_port) {
  STRATA_ASSIGN_OR_RETURN(auto hp, ParseHostPort(address));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(hp.second);
  int rc = ::getaddrinfo(hp.first.empty() ? nullptr : hp.first.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) return Error(EINVAL, StrCat("listen on ", address, ": ", ::gai_strerror(rc)));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, ::freeaddrinfo);
  int last = EADDRNOTAVAIL;
  for (addrinfo* ai = found; ai; ai = ai->ai_next) {
    UniqueFd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd) {
      last = errno;
      continue;
    }
    int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(fd.get(), 1024) != 0) {
      last = errno;
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len);
    *bound_port = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in*>(&ss)->sin_port
                                                : reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
    return fd;
  }
  return ErrnoError(last, "listen on " + address);
}

}  // namespace

Result<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view address) {
  std::string_view host, port;
  if (address.starts_with("[")) {
    size_t close = address.find(']');
    if (close == std::string_view::npos || close + 1 >= address.size() || address[close + 1] != ':') {
      return Error(EINVAL, StrCat("address ", Quote(address), ": expected [V6ADDRESS]:PORT"));
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) return Error(EINVAL, StrCat("address ", Quote(address), ": expected HOST:PORT"));
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
  }
  char* end = nullptr;
  std::string p(port);
  unsigned long n = std::strtoul(p.c_str(), &end, 10);
  if (p.empty() || *end || n > 65535) return Error(EINVAL, StrCat("address ", Quote(address), ": bad port ", Quote(port)));
  return std::make_pair(std::string(host), static_cast<uint16_t>(n));
}

bool IsLoopbackHost(std::string_view host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  std::string h(host);
  return ::inet_pton(AF_INET, h.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

int HttpServer::HttpStatusFor(int err) {
  switch (err) {
    case ENOENT: return 404;
    case EINVAL: return 400;
    case EACCES:
    case EPERM: return 403;
    case EEXIST:
    case EBUSY:
    case EBADSLT: return 409;  // (a state that does not allow the change)
    case EFBIG: return 413;
    case EUSERS: return 429;   // a tenant's limit
    case EDQUOT:
    case ENOSPC: return 507;   // a sandbox's disk quota, a full disk
    case ENOKEY:               // no token
    case EKEYREJECTED: return 401;  // an unknown or revoked token
    case ETIMEDOUT: return 504;
    case ENOTSUP: return 501;
    case EAGAIN: return 503;
    default: return 500;
  }
}

HttpServer::Response HttpServer::ErrorResponse(const Status& status) {
  Response r;
  r.status = HttpStatusFor(status.code());
  r.body = DumpJson({{"error", status.ToString()}, {"errno", status.code()}});
  return r;
}

Result<std::unique_ptr<HttpServer>> HttpServer::Listen(Options options) {
  const bool tcp = !options.tcp_address.empty();
  const std::string where = tcp ? options.tcp_address : options.unix_path;
  if (tcp == !options.unix_path.empty()) return Error(EINVAL, "HTTP server: give a unix socket path or a TCP address");
  const bool tls = !options.tls_cert_pem.empty() || !options.tls_key_pem.empty();
  if (tls && (options.tls_cert_pem.empty() || options.tls_key_pem.empty())) {
    return Error(EINVAL, "HTTP server on " + where + ": TLS needs both a certificate and a key");
  }
  STRATA_RETURN_IF_ERROR(Mhd().status.Annotate("start HTTP server on " + where));
  std::unique_ptr<HttpServer> server(new HttpServer());
  UniqueFd fd;
  if (tcp) {
    STRATA_ASSIGN_OR_RETURN(fd, ListenTcp(options.tcp_address, &server->port_));
    auto hp = ParseHostPort(options.tcp_address);
    std::string host = hp->first.find(':') != std::string::npos ? "[" + hp->first + "]" : hp->first;
    server->url_ = StrCat(tls ? "https://" : "http://", host.empty() ? "0.0.0.0" : host, ":", server->port_);
  } else {
    STRATA_ASSIGN_OR_RETURN(fd, strata::ListenUnix(options.unix_path, options.mode));
    server->unix_path_ = options.unix_path;
    server->url_ = "unix://" + options.unix_path;
  }
  server->impl_ = std::make_unique<Impl>();
  Impl* impl = server->impl_.get();
  impl->options = std::move(options);
  const Limits& l = impl->options.limits;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC;
  if (tls) flags |= MHD_USE_TLS;
  // The pool holds the request line and headers (and the reply's headers):
  // twice the header cap leaves room for both.
  const size_t pool = std::max<size_t>(l.max_header_bytes * 2, 8192);
  const unsigned per_client = tcp ? l.max_per_client : 0;  // (0: none)
  // TLS's options, when there is TLS, through one option array.
  MHD_OptionItem tls_options[] = {
      {tls ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, const_cast<char*>(impl->options.tls_cert_pem.c_str())},
      {MHD_OPTION_HTTPS_MEM_KEY, 0, const_cast<char*>(impl->options.tls_key_pem.c_str())},
      {MHD_OPTION_END, 0, nullptr}};
  impl->daemon = Mhd().start_daemon(flags, 0, nullptr, nullptr, Access, impl,
                                    MHD_OPTION_LISTEN_SOCKET, fd.get(),
                                    MHD_OPTION_NOTIFY_COMPLETED, Completed, impl,
                                    MHD_OPTION_NOTIFY_CONNECTION, ConnectionEvent, impl,
                                    MHD_OPTION_URI_LOG_CALLBACK, UriStarted, impl,
                                    MHD_OPTION_CONNECTION_TIMEOUT, 0u,
                                    MHD_OPTION_CONNECTION_LIMIT, l.max_connections,
                                    MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_client,
                                    MHD_OPTION_CONNECTION_MEMORY_LIMIT, pool,
                                    MHD_OPTION_ARRAY, tls_options,
                                    MHD_OPTION_END);
  if (!impl->daemon) {
    if (!server->unix_path_.empty()) ::unlink(server->unix_path_.c_str());
    server->unix_path_.clear();
    return Error(EIO, StrCat("start HTTP server on ", where, tls ? " (is the TLS certificate or key malformed?)" : ""));
  }
  fd.release();  // MHD owns it now
  impl->watchdog = std::thread([impl] { impl->Watch(); });
  return server;
}

HttpServer::~HttpServer() {
  if (impl_) {
    {
      std::lock_guard lock(impl_->mu);
      impl_->stopping = true;
    }
    impl_->cv.notify_all();
    if (impl_->watchdog.joinable()) impl_->watchdog.join();
    if (impl_->daemon) Mhd().stop_daemon(impl_->daemon);
  }
  if (!unix_path_.empty()) ::unlink(unix_path_.c_str());
}

}  // namespace strata
