// HttpServer: the launcher daemon's HTTP/JSON API (libmicrohttpd on a socket
// we bind ourselves), on a unix socket or on TCP with TLS (GnuTLS, through
// libmicrohttpd). One thread per connection, so a handler may block (an
// exec streaming output, a snapshot); every TCP listener has caps on
// connections, header and body sizes, an idle timeout and a deadline for
// reading a request, so no client holds a thread it does not use.
#pragma once

#include <sys/types.h>

#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/units.h"

namespace strata {

class HttpServer {
 public:
  struct Request {
    std::string method;  // "GET", "POST", ...
    std::string path;    // "/v1/sandboxes"
    std::map<std::string, std::string> query;
    std::map<std::string, std::string> headers;  // names lowercased
    std::string body;    // empty for an upload (see UploadHandler)
    // How the client reached us. Only a unix-socket peer has credentials
    // (SO_PEERCRED); a TCP peer has an address and never a uid.
    bool unix_peer = false;
    uid_t peer_uid = static_cast<uid_t>(-1);
    gid_t peer_gid = static_cast<gid_t>(-1);
    pid_t peer_pid = 0;
    std::string peer_address;  // TCP: "127.0.0.1", "::1"
    // The client's connection, to notice it going away (poll it, or a dup
    // of it, for POLLHUP only: never read, write or close it).
    int connection_fd = -1;
  };

  // Writes a streamed body piece by piece; returns false once the client
  // has gone away.
  using StreamWriter = std::function<bool(std::string_view chunk)>;

  struct Response {
    int status = 200;
    std::string content_type = "application/json";
    std::vector<std::pair<std::string, std::string>> headers;  // extra ones ("Retry-After", "5")
    std::string body;
    // When set, the body is produced by this function (chunked encoding)
    // on the connection's thread after the headers are sent. A function
    // that throws cuts the connection: the client sees a broken body,
    // never a clean end of a short one.
    std::function<void(const StreamWriter&)> stream;
  };

  using Handler = std::function<Response(const Request&)>;

  // A request whose body is streamed to its destination as it arrives
  // instead of being collected (a file upload). Write() is called with
  // each piece, then Finish() once; an error from Write() ends the upload:
  // the rest of the body is read and dropped, Abort() is called, and the
  // error is the answer. Abort() is also called when the client goes away
  // or the upload passes Limits::max_upload_bytes.
  class Upload {
   public:
    virtual ~Upload() = default;
    virtual Status Write(std::string_view piece) = 0;
    virtual Response Finish() = 0;
    virtual void Abort() = 0;
    // The answer to a body refused part way (Write's or WritePart's
    // error, a form cut short): the server's own error body unless the
    // plane the upload belongs to words its errors otherwise.
    virtual Response Refused(const Status& s) { return ErrorResponse(s); }
    // A form upload (multipart/form-data or urlencoded): the body is
    // decoded by libmicrohttpd and handed to WritePart() piece by piece
    // instead of to Write(). A piece at offset 0 starts a part.
    struct FormPiece {
      std::string_view field;         // the part's name ("file")
      std::string_view filename;      // its file name, if any
      std::string_view content_type;  // its type, if given
      uint64_t offset = 0;            // of `data` within the part
      std::string_view data;
    };
    virtual bool form() const { return false; }
    virtual Status WritePart(const FormPiece&) { return Error(EINVAL, "not a form upload"); }
  };
  // Decides, once a request's headers are in, whether it is an upload:
  // returns nullptr for an ordinary request, an Upload to stream the body
  // into, or sets `*refusal` to answer at once (authentication, a missing
  // sandbox) without reading the body.
  using UploadHandler = std::function<std::unique_ptr<Upload>(const Request&, std::optional<Response>* refusal)>;

  struct Limits {
    unsigned max_connections = 1024;  // open connections in all
    unsigned max_per_client = 256;    // open connections from one client address (TCP)
    size_t max_header_bytes = 32 << 10;  // request line and headers: larger is answered 431
    size_t max_body_bytes = 16 << 20;    // a collected body: larger is answered 413
    uint64_t max_upload_bytes = uint64_t{4} << 30;  // a streamed upload: larger is answered 413
    // A connection with no request under way is closed after this long.
    Duration idle_timeout = std::chrono::seconds(60);
    // From a request's first line to its last body byte (an upload's body
    // excepted): a client that trickles a request (slowloris) is cut off.
    Duration request_timeout = std::chrono::seconds(10);
  };

  struct Options {
    // Exactly one of the two: a unix socket path (chmod'ed to `mode`), or
    // HOST:PORT for TCP ("127.0.0.1:8443", "[::1]:8443", "0.0.0.0:8443").
    std::string unix_path;
    mode_t mode = 0600;
    std::string tcp_address;
    // PEM text; both set: TLS.
    std::string tls_cert_pem, tls_key_pem;
    Limits limits;
    Handler handler;
    UploadHandler upload;  // optional
  };

  // Binds (a unix socket: replacing a stale socket file, refusing one a live
  // server answers on) and serves. The handlers must not throw (a thrown
  // exception becomes a 500 response).
  static Result<std::unique_ptr<HttpServer>> Listen(Options options);
  // Stops accepting, ends every connection, waits for handlers to return,
  // removes a unix socket file.
  ~HttpServer();

  // "unix:///run/strata/launcher.sock", "https://127.0.0.1:8443" (with the
  // port actually bound when 0 was asked for).
  const std::string& url() const { return url_; }
  uint16_t port() const { return port_; }

  // {"error": message, "errno": N} with the status for the error's errno.
  static Response ErrorResponse(const Status& status);
  static int HttpStatusFor(int err);

  struct Impl;  // defined in the .cc

 private:
  HttpServer() = default;
  std::string url_;
  std::string unix_path_;
  uint16_t port_ = 0;
  std::unique_ptr<Impl> impl_;
};

// Splits "HOST:PORT" or "[V6]:PORT".
Result<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view address);
// Whether `host` is a loopback address or "localhost".
bool IsLoopbackHost(std::string_view host);

}  // namespace strata
