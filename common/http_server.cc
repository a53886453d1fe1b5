// HttpServer over libmicrohttpd.
#include "common/http_server.h"

#include <microhttpd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "common/dynlib.h"
#include "common/log.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"

namespace strata {

struct HttpServer::Impl {
  Handler handler;
  MHD_Daemon* daemon = nullptr;
};

namespace {

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
  decltype(&MHD_queue_response) queue_response = nullptr;
  decltype(&MHD_start_daemon) start_daemon = nullptr;
  decltype(&MHD_stop_daemon) stop_daemon = nullptr;
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
    get(a.queue_response, "MHD_queue_response");
    get(a.start_daemon, "MHD_start_daemon");
    get(a.stop_daemon, "MHD_stop_daemon");
    return a;
  }();
  return api;
}

// Per-request state across MHD's access-handler calls (body arrives in pieces).
struct Pending {
  std::string body;
};

// The state of a streamed body: the handler's stream function runs on its
// own thread and hands pieces to MHD's content reader.
struct Stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> pieces;
  size_t offset = 0;  // into pieces.front()
  bool done = false;
  bool closed = false;  // the client went away
  std::thread producer;
};

ssize_t StreamRead(void* cls, uint64_t, char* buf, size_t max) {
  auto* s = static_cast<Stream*>(cls);
  std::unique_lock lock(s->mu);
  s->cv.wait(lock, [&] { return !s->pieces.empty() || s->done; });
  if (s->pieces.empty()) return MHD_CONTENT_READER_END_OF_STREAM;
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

MHD_Result CollectArg(void* cls, MHD_ValueKind, const char* key, const char* value) {
  auto* map = static_cast<std::map<std::string, std::string>*>(cls);
  std::string k = key ? key : "";
  (*map)[k] = value ? value : "";
  return MHD_YES;
}

MHD_Result CollectHeader(void* cls, MHD_ValueKind, const char* key, const char* value) {
  auto* map = static_cast<std::map<std::string, std::string>*>(cls);
  std::string k = key ? key : "";
  std::transform(k.begin(), k.end(), k.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  (*map)[k] = value ? value : "";
  return MHD_YES;
}

MHD_Result Send(MHD_Connection* connection, HttpServer::Response response) {
  MHD_Response* r;
  if (response.stream) {
    auto* s = new Stream();
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
      try {
        produce(write);
      } catch (const std::exception& e) {
        STRATA_LOG(kError) << "http stream: " << e.what();
      }
      std::lock_guard lock(s->mu);
      s->done = true;
      s->cv.notify_all();
    });
    r = Mhd().create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, StreamRead, s, StreamFree);
  } else {
    r = Mhd().create_response_from_buffer(response.body.size(), response.body.data(), MHD_RESPMEM_MUST_COPY);
  }
  Mhd().add_response_header(r, "Content-Type", response.content_type.c_str());
  MHD_Result ret = Mhd().queue_response(connection, static_cast<unsigned>(response.status), r);
  Mhd().destroy_response(r);
  return ret;
}

MHD_Result Access(void* cls, MHD_Connection* connection, const char* url, const char* method, const char*,
                  const char* upload_data, size_t* upload_size, void** con_cls) {
  auto* impl = static_cast<HttpServer::Impl*>(cls);
  if (*con_cls == nullptr) {
    *con_cls = new Pending();
    return MHD_YES;
  }
  auto* pending = static_cast<Pending*>(*con_cls);
  if (*upload_size > 0) {
    pending->body.append(upload_data, *upload_size);
    *upload_size = 0;
    return MHD_YES;
  }
  HttpServer::Request request;
  request.method = method;
  request.path = url;
  request.body = std::move(pending->body);
  Mhd().get_connection_values(connection, MHD_GET_ARGUMENT_KIND, CollectArg, &request.query);
  Mhd().get_connection_values(connection, MHD_HEADER_KIND, CollectHeader, &request.headers);
  if (const MHD_ConnectionInfo* info = Mhd().get_connection_info(connection, MHD_CONNECTION_INFO_CONNECTION_FD)) {
    request.connection_fd = info->connect_fd;
    ucred cred{};
    socklen_t len = sizeof cred;
    if (::getsockopt(info->connect_fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
      request.peer_uid = cred.uid;
      request.peer_gid = cred.gid;
      request.peer_pid = cred.pid;
    }
  }
  HttpServer::Response response;
  try {
    response = impl->handler(request);
  } catch (const std::exception& e) {
    response = HttpServer::ErrorResponse(Error(EIO, StrCat("internal error: ", e.what())));
  }
  return Send(connection, std::move(response));
}

void Completed(void*, MHD_Connection*, void** con_cls, MHD_RequestTerminationCode) {
  delete static_cast<Pending*>(*con_cls);
  *con_cls = nullptr;
}

}  // namespace

int HttpServer::HttpStatusFor(int err) {
  switch (err) {
    case ENOENT: return 404;
    case EINVAL: return 400;
    case EACCES:
    case EPERM: return 403;
    case EEXIST:
    case EBUSY: return 409;
    case ETIMEDOUT: return 504;
    case ENOTSUP: return 501;
    case EAGAIN: return 503;
    default: return 500;
  }
}

HttpServer::Response HttpServer::ErrorResponse(const Status& status) {
  Response r;
  r.status = HttpStatusFor(status.code());
  r.body = nlohmann::json{{"error", status.ToString()}, {"errno", status.code()}}.dump();
  return r;
}

Result<std::unique_ptr<HttpServer>> HttpServer::ListenUnix(const std::string& socket_path, mode_t mode, Handler handler) {
  STRATA_RETURN_IF_ERROR(Mhd().status.Annotate("start HTTP server on " + socket_path));
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, strata::ListenUnix(socket_path, mode));
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->socket_path_ = socket_path;
  server->impl_ = std::make_unique<Impl>();
  server->impl_->handler = std::move(handler);
  server->impl_->daemon = Mhd().start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC, 0, nullptr, nullptr, Access,
      server->impl_.get(), MHD_OPTION_LISTEN_SOCKET, fd.get(), MHD_OPTION_NOTIFY_COMPLETED, Completed, nullptr,
      MHD_OPTION_CONNECTION_TIMEOUT, 0u, MHD_OPTION_END);
  if (!server->impl_->daemon) {
    ::unlink(socket_path.c_str());
    return Error(EIO, StrCat("start HTTP server on ", socket_path));
  }
  fd.release();  // MHD owns it now
  return server;
}

HttpServer::~HttpServer() {
  if (impl_ && impl_->daemon) Mhd().stop_daemon(impl_->daemon);
  if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
}

}  // namespace strata
