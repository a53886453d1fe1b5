#include "launcher/e2b/connect.h"

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

#include "common/strings.h"

namespace strata::launcher::e2b {

namespace {

struct CodeInfo {
  const char* name;
  int http;
};

constexpr CodeInfo kCodes[] = {
    {"canceled", 499},        {"unknown", 500},          {"invalid_argument", 400}, {"deadline_exceeded", 504},
    {"not_found", 404},       {"already_exists", 409},   {"permission_denied", 403}, {"resource_exhausted", 429},
    {"failed_precondition", 400}, {"aborted", 409},      {"out_of_range", 400},     {"unimplemented", 501},
    {"internal", 500},        {"unavailable", 503},      {"data_loss", 500},        {"unauthenticated", 401},
};

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string ErrorJson(Code code, std::string_view message) {
  return nlohmann::json{{"code", CodeName(code)}, {"message", std::string(message)}}.dump(
      -1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

const char* CodeName(Code code) { return kCodes[static_cast<int>(code)].name; }
int HttpStatusOf(Code code) { return kCodes[static_cast<int>(code)].http; }

Code CodeOf(const Status& status) {
  switch (status.code()) {
    case ENOENT: case ESRCH: return Code::kNotFound;
    case EEXIST: return Code::kAlreadyExists;
    case EACCES: case EPERM: return Code::kPermissionDenied;
    case EINVAL: case ENOTDIR: case EISDIR: case ENAMETOOLONG: case ELOOP: return Code::kInvalidArgument;
    case EAGAIN: case EBUSY: return Code::kUnavailable;
    case EDQUOT: case ENOSPC: case EFBIG: case E2BIG: return Code::kResourceExhausted;
    case ENOTEMPTY: case EBADSLT: case EROFS: return Code::kFailedPrecondition;
    case ETIMEDOUT: return Code::kDeadlineExceeded;
    case ECANCELED: return Code::kCanceled;
    case ENOSYS: case EOPNOTSUPP: return Code::kUnimplemented;
    default: return Code::kInternal;
  }
}

std::string Envelope(uint8_t flags, std::string_view data) {
  std::string out;
  out.reserve(5 + data.size());
  out.push_back(static_cast<char>(flags));
  const uint32_t n = static_cast<uint32_t>(data.size());
  for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<char>((n >> shift) & 0xff));
  out.append(data);
  return out;
}

std::string MediaType(const HttpServer::Request& request) {
  auto it = request.headers.find("content-type");
  std::string type = it == request.headers.end() ? "" : Lower(it->second);
  type = type.substr(0, type.find(';'));
  while (!type.empty() && type.back() == ' ') type.pop_back();
  return type;
}

HttpServer::Response ErrorFor(const HttpServer::Request& request, Code code, std::string_view message) {
  const std::string type = MediaType(request);
  if (!type.starts_with("application/connect+")) return ErrorReply(code, message);
  HttpServer::Response r;
  r.content_type = type == "application/connect+proto" ? "application/connect+proto" : "application/connect+json";
  r.body = StreamEnd(code, message);
  return r;
}

Result<Call> ParseCall(const HttpServer::Request& request) {
  Call call;
  const std::string where = "connect " + request.path;
  if (request.method != "POST") return Error(EOPNOTSUPP, where + ": calls are POST, not " + request.method);
  // "/process.Process/Start"
  const size_t slash = request.path.find('/', 1);
  if (request.path.size() < 4 || request.path[0] != '/' || slash == std::string::npos || slash + 1 >= request.path.size() ||
      request.path.find('/', slash + 1) != std::string::npos) {
    return Error(ENOENT, where + ": not a /<service>/<method> path");
  }
  call.service = request.path.substr(1, slash - 1);
  call.method = request.path.substr(slash + 1);
  auto header = [&](const char* name) -> std::string {
    auto it = request.headers.find(name);
    return it == request.headers.end() ? "" : Lower(it->second);
  };
  const std::string type = MediaType(request);
  if (type == "application/json") {
  } else if (type == "application/proto") {
    call.binary = true;
  } else if (type == "application/connect+json") {
    call.streaming = true;
  } else if (type == "application/connect+proto") {
    call.streaming = call.binary = true;
  } else {
    return Error(EOPNOTSUPP, where + ": content type " + Quote(type) +
                                 " is not Connect's (application/json, application/proto, application/connect+json or +proto)");
  }
  if (!call.streaming) {
    const std::string encoding = header("content-encoding");
    if (!encoding.empty() && encoding != "identity") {
      return Error(EOPNOTSUPP, where + ": content encoding " + Quote(encoding) + " is not served (send it uncompressed)");
    }
    if (request.body.size() > kMaxMessageBytes) {
      return Error(EFBIG, StrCat(where, ": a message of ", request.body.size(), " bytes is more than ", kMaxMessageBytes));
    }
    call.messages.push_back(request.body);
    return call;
  }
  const std::string encoding = header("connect-content-encoding");
  const bool compressed = !encoding.empty() && encoding != "identity";
  std::string_view body = request.body;
  while (!body.empty()) {
    if (body.size() < 5) return Error(EINVAL, where + ": an envelope cut short (fewer than 5 bytes of its header)");
    const uint8_t flags = static_cast<uint8_t>(body[0]);
    uint32_t n = 0;
    for (int i = 1; i <= 4; ++i) n = (n << 8) | static_cast<uint8_t>(body[i]);
    if (n > kMaxMessageBytes) return Error(EFBIG, StrCat(where, ": an envelope of ", n, " bytes is more than ", kMaxMessageBytes));
    if (body.size() - 5 < n) return Error(EINVAL, StrCat(where, ": an envelope of ", n, " bytes holds only ", body.size() - 5));
    if (flags & 0x01) {
      if (!compressed) return Error(EINVAL, where + ": a compressed envelope without Connect-Content-Encoding");
      return Error(EOPNOTSUPP, where + ": compressed messages (" + encoding + ") are not served");
    }
    if (flags & ~0x01) return Error(EINVAL, StrCat(where, ": envelope flags ", int{flags}, " in a request"));
    call.messages.emplace_back(body.substr(5, n));
    body.remove_prefix(5 + n);
  }
  return call;
}

Status Decode(const Call& call, size_t index, google::protobuf::Message* out) {
  const std::string where = "connect /" + call.service + "/" + call.method;
  if (index >= call.messages.size()) return Error(EINVAL, where + ": the request holds no message");
  const std::string& data = call.messages[index];
  if (call.binary) {
    if (!out->ParseFromString(data)) return Error(EINVAL, where + ": the message is not a " + out->GetTypeName());
    return OkStatus();
  }
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto s = google::protobuf::util::JsonStringToMessage(data.empty() ? "{}" : data, out, options);
  if (!s.ok()) return Error(EINVAL, where + ": the message is not a " + out->GetTypeName() + ": " + std::string(s.message()));
  return OkStatus();
}

std::string Encode(const Call& call, const google::protobuf::Message& message) {
  std::string out;
  if (call.binary) {
    message.SerializeToString(&out);
  } else {
    google::protobuf::util::JsonPrintOptions options;
    options.preserve_proto_field_names = false;
    (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  }
  return out;
}

HttpServer::Response UnaryReply(const Call& call, const google::protobuf::Message& message) {
  HttpServer::Response r;
  r.content_type = call.binary ? "application/proto" : "application/json";
  r.body = Encode(call, message);
  return r;
}

HttpServer::Response ErrorReply(Code code, std::string_view message) {
  HttpServer::Response r;
  r.status = HttpStatusOf(code);
  r.content_type = "application/json";
  r.body = ErrorJson(code, message);
  return r;
}

HttpServer::Response ErrorReply(const Status& status) { return ErrorReply(CodeOf(status), status.message()); }

std::string StreamMessage(const Call& call, const google::protobuf::Message& message) {
  return Envelope(0, Encode(call, message));
}

std::string StreamEnd(const Status& status) {
  if (status.ok()) return Envelope(0x02, "{}");
  return StreamEnd(CodeOf(status), status.message());
}

std::string StreamEnd(Code code, std::string_view message) {
  return Envelope(0x02, "{\"error\":" + ErrorJson(code, message) + "}");
}

std::string StreamContentType(const Call& call) {
  return call.binary ? "application/connect+proto" : "application/connect+json";
}

int64_t KeepAliveInterval(const HttpServer::Request& request) {
  auto it = request.headers.find("keepalive-ping-interval");
  return it == request.headers.end() ? 0 : std::clamp<int64_t>(std::atoll(it->second.c_str()), 0, 3600);
}

std::shared_ptr<UniqueFd> CallerConnection(const HttpServer::Request& request) {
  return std::make_shared<UniqueFd>(request.connection_fd >= 0 ? ::fcntl(request.connection_fd, F_DUPFD_CLOEXEC, 0) : -1);
}

}  // namespace strata::launcher::e2b
