// AgentClient: requests over the agent's unix socket.
#include "launcher/sandbox/agent_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "common/fs.h"
#include "common/strings.h"
#include "common/unique_fd.h"
#include "common/unix_socket.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

// A ping or shutdown the agent does not answer in this long: it is stuck
// (or frozen), and the caller must not hang on it.
constexpr Duration kControlReplyTimeout = std::chrono::seconds(10);

}  // namespace

short HangupEvents(int fd) {
  int domain = 0;
  socklen_t len = sizeof domain;
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 && (domain == AF_INET || domain == AF_INET6)) return POLLRDHUP;
  return 0;
}

bool HungUp(const pollfd& p) { return p.revents & (POLLHUP | POLLERR | POLLNVAL | (p.events & POLLRDHUP)); }

// Waits until the agent's side of `fd` has something to read; true if
// `cancel_fd` (>= 0) hung up first. Only a full close counts (POLLHUP;
// always reported): a caller that half-closes after its request still
// wants the answer.
bool CallerLeft(int fd, int cancel_fd) {
  if (cancel_fd < 0) return false;
  pollfd p[2] = {{fd, POLLIN, 0}, {cancel_fd, HangupEvents(cancel_fd), 0}};
  while (::poll(p, 2, -1) < 0 && errno == EINTR) {
  }
  return !(p[0].revents & POLLIN) && HungUp(p[1]);
}

json ExecResultJson(const ExecResult& r) {
  return {{"exit_code", r.exit_code},           {"signal", r.signal},
          {"timed_out", r.timed_out},           {"stdout_bytes", r.stdout_bytes},
          {"stderr_bytes", r.stderr_bytes},     {"stdout_truncated", r.stdout_truncated},
          {"stderr_truncated", r.stderr_truncated}, {"duration_ms", r.duration_ms},
          {"oom_killed", r.oom_killed}};
}

Result<ExecResult> ParseExitFrame(std::string_view payload) {
  json j = json::parse(payload, nullptr, false);
  if (!j.is_object()) return Error(EPROTO, "agent: malformed exit report");
  ExecResult r;
  r.exit_code = j.value("exit_code", -1);
  r.signal = j.value("signal", 0);
  r.timed_out = j.value("timed_out", false);
  r.stdout_bytes = j.value("stdout_bytes", uint64_t{0});
  r.stderr_bytes = j.value("stderr_bytes", uint64_t{0});
  r.stdout_truncated = j.value("stdout_truncated", false);
  r.stderr_truncated = j.value("stderr_truncated", false);
  r.duration_ms = j.value("duration_ms", int64_t{0});
  r.oom_killed = j.value("oom_killed", false);
  return r;
}

Status ParseErrorFrame(std::string_view payload) {
  json j = json::parse(payload, nullptr, false);
  if (!j.is_object()) return Error(EIO, "agent: error without a message");
  return Error(j.value("errno", EIO), j.value("error", std::string("unknown error")));
}

Result<int> AgentClient::Connect(Duration reply_timeout) {
  auto fd = ConnectUnix(socket_path_, reply_timeout);
  if (!fd.ok()) return fd.status().Annotate("the sandbox's agent");
  return fd->release();
}

Status AgentClient::WaitReady(Duration wait) {
  // The socket is bound before the agent runs: a ping queues until the
  // agent accepts it, and fails at once if everyone holding the socket died.
  STRATA_ASSIGN_OR_RETURN(int raw, Connect(wait));
  UniqueFd fd(raw);
  STRATA_RETURN_IF_ERROR(WriteFrame(fd.get(), Frame::kPing, "{}"));
  Frame type;
  std::string payload;
  Status read = ReadFrame(fd.get(), &type, &payload);
  if (!read.ok()) {
    if (read.code() == EAGAIN) return Error(ETIMEDOUT, StrCat("the sandbox's agent did not answer within ", std::chrono::duration_cast<std::chrono::milliseconds>(wait).count(), " ms"));
    return read.Annotate("the sandbox's agent ended before it answered");
  }
  if (type != Frame::kOk) return ParseErrorFrame(payload);
  return OkStatus();
}

namespace {

json ExecRequestJson(const ExecRequest& request) {
  json j = {{"argv", request.argv},
          {"env", request.env},
          {"cwd", request.cwd},
          {"timeout_ms", std::chrono::duration_cast<std::chrono::milliseconds>(request.timeout).count()},
          {"stdout_cap", request.stdout_cap},
          {"stderr_cap", request.stderr_cap},
          {"stdin", request.stdin_data.has_value()},
          {"isolate", request.isolate},
          {"isolate_network", request.isolate_network},
          {"kill_leftovers", request.kill_leftovers.value_or(false)}};
  if (!request.files.empty()) j["files"] = request.files.ToJson();
  if (request.grader) j["grader"] = true;
  if (!request.user.empty()) j["user"] = request.user;
  if (request.user_optional) j["user_optional"] = true;
  if (request.pty) j["pty"] = {{"cols", request.pty->cols}, {"rows", request.pty->rows}};
  return j;
}

}  // namespace

void AgentClient::SetRulePaths(const FileRules& rules) {
  rule_paths_ = rules.deny;
  rule_paths_.insert(rule_paths_.end(), rules.read_only.begin(), rules.read_only.end());
}

Result<ExecResult> AgentClient::Exec(const ExecRequest& request, const OutputSink& sink) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect());
  UniqueFd fd(raw);
  json req = ExecRequestJson(request);
  STRATA_RETURN_IF_ERROR(WriteFrame(fd.get(), Frame::kExec, req.dump()));
  // Stdin goes on its own thread while output comes back on this one: the
  // command may answer before it has read everything.
  std::thread feeder;
  if (request.stdin_data) {
    feeder = std::thread([&request, conn = fd.get()] {
      std::string_view in = *request.stdin_data;
      for (size_t off = 0; off < in.size(); off += kMaxFrame) {
        if (!WriteFrame(conn, Frame::kStdin, in.substr(off, kMaxFrame)).ok()) return;
      }
      WriteFrame(conn, Frame::kStdinEof, "").IgnoreError();
    });
  }
  struct Joiner {
    std::thread& t;
    int fd;
    ~Joiner() {
      if (t.joinable()) {
        ::shutdown(fd, SHUT_WR);  // unblocks a feeder stuck on a full socket
        t.join();
      }
    }
  } joiner{feeder, fd.get()};
  while (true) {
    if (CallerLeft(fd.get(), request.cancel_fd)) {
      return Error(ECANCELED, StrCat("exec ", request.argv[0], ": abandoned, the caller went away"));
    }
    Frame type;
    std::string payload;
    Status s = ReadFrame(fd.get(), &type, &payload);
    if (!s.ok()) return s.Annotate("exec " + request.argv[0] + ": the agent went away (the sandbox ended?)");
    switch (type) {
      case Frame::kStdout: sink(1, payload); break;
      case Frame::kStderr: sink(2, payload); break;
      case Frame::kError: return ParseErrorFrame(payload);
      case Frame::kExit: return ParseExitFrame(payload);
      default: return Error(EPROTO, StrCat("agent: unexpected frame ", static_cast<int>(type), " during exec"));
    }
  }
}

Result<std::unique_ptr<AgentClient::PutStream>> AgentClient::BeginPut(const std::string& path, uint32_t mode,
                                                                       std::optional<std::pair<uint32_t, uint32_t>> owner,
                                                                       const std::string& user) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect());
  auto stream = std::make_unique<PutStream>();
  stream->fd_.reset(raw);
  stream->path_ = path;
  json req = {{"path", path}, {"mode", mode}};
  std::string normal;
  for (const auto& part : Split(path, '/')) {
    if (!part.empty() && part != ".") normal += "/" + part;
  }
  if (std::find(rule_paths_.begin(), rule_paths_.end(), normal) != rule_paths_.end()) req["in_place"] = true;
  if (owner) {
    req["uid"] = owner->first;
    req["gid"] = owner->second;
  } else if (!user.empty()) {
    req["user"] = user;
  }
  STRATA_RETURN_IF_ERROR(WriteFrame(stream->fd_.get(), Frame::kPut, req.dump()));
  return stream;
}

Status AgentClient::PutStream::Write(std::string_view data) {
  for (size_t off = 0; off < data.size(); off += kMaxFrame) {
    Status s = WriteFrame(fd_.get(), Frame::kData, data.substr(off, kMaxFrame));
    if (!s.ok()) return s.Annotate("put " + path_ + ": the agent went away");
  }
  return OkStatus();
}

Status AgentClient::PutStream::Finish() {
  STRATA_RETURN_IF_ERROR(WriteFrame(fd_.get(), Frame::kDataEnd, "").Annotate("put " + path_));
  Frame type;
  std::string payload;
  STRATA_RETURN_IF_ERROR(ReadFrame(fd_.get(), &type, &payload).Annotate("put " + path_ + ": no answer from the agent"));
  if (type == Frame::kError) return ParseErrorFrame(payload);
  return OkStatus();
}

Result<std::unique_ptr<AgentClient::TreeStream>> AgentClient::BeginPutTree(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect());
  auto stream = std::make_unique<TreeStream>();
  stream->fd_.reset(raw);
  stream->path_ = path;
  STRATA_RETURN_IF_ERROR(WriteFrame(stream->fd_.get(), Frame::kPutTree, json{{"path", path}}.dump()));
  return stream;
}

Status AgentClient::TreeStream::Entry(const json& entry) {
  return WriteFrame(fd_.get(), Frame::kTreeEntry, entry.dump(-1, ' ', false, json::error_handler_t::replace))
      .Annotate("put tree " + path_ + ": the agent went away");
}

Status AgentClient::TreeStream::Data(std::string_view data) {
  for (size_t off = 0; off < data.size(); off += kMaxFrame) {
    STRATA_RETURN_IF_ERROR(WriteFrame(fd_.get(), Frame::kData, data.substr(off, kMaxFrame)).Annotate("put tree " + path_));
  }
  return OkStatus();
}

Status AgentClient::TreeStream::EndFile() { return WriteFrame(fd_.get(), Frame::kDataEnd, "").Annotate("put tree " + path_); }

Result<json> AgentClient::TreeStream::Finish() {
  STRATA_RETURN_IF_ERROR(WriteFrame(fd_.get(), Frame::kTreeEnd, "").Annotate("put tree " + path_));
  Frame type;
  std::string payload;
  STRATA_RETURN_IF_ERROR(ReadFrame(fd_.get(), &type, &payload).Annotate("put tree " + path_ + ": no answer from the agent"));
  if (type == Frame::kError) return ParseErrorFrame(payload);
  json j = json::parse(payload, nullptr, false);
  return j.is_object() ? j : json::object();
}

Status AgentClient::GetTree(const std::string& path, const std::function<Status(const json&)>& on_entry,
                            const std::function<Status(std::string_view)>& on_data) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect());
  UniqueFd fd(raw);
  STRATA_RETURN_IF_ERROR(WriteFrame(fd.get(), Frame::kGetTree, json{{"path", path}}.dump()));
  while (true) {
    Frame type;
    std::string payload;
    STRATA_RETURN_IF_ERROR(ReadFrame(fd.get(), &type, &payload).Annotate("get tree " + path + ": the agent went away"));
    switch (type) {
      case Frame::kOk: break;
      case Frame::kError: return ParseErrorFrame(payload);
      case Frame::kTreeEnd: return OkStatus();
      case Frame::kTreeEntry: {
        json entry = json::parse(payload, nullptr, false);
        if (!entry.is_object()) return Error(EPROTO, "get tree: malformed entry");
        STRATA_RETURN_IF_ERROR(on_entry(entry));
        break;
      }
      case Frame::kData: STRATA_RETURN_IF_ERROR(on_data(payload)); break;
      case Frame::kDataEnd: break;
      default: return Error(EPROTO, StrCat("agent: unexpected frame ", static_cast<int>(type), " in a tree"));
    }
  }
}

Status AgentClient::Put(const std::string& path, std::string_view data, uint32_t mode,
                        std::optional<std::pair<uint32_t, uint32_t>> owner) {
  STRATA_ASSIGN_OR_RETURN(auto stream, BeginPut(path, mode, owner));
  STRATA_RETURN_IF_ERROR(stream->Write(data));
  return stream->Finish();
}

Result<std::unique_ptr<AgentClient::GetStream>> AgentClient::OpenGet(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect());
  auto stream = std::make_unique<GetStream>();
  stream->fd_.reset(raw);
  stream->path_ = path;
  STRATA_RETURN_IF_ERROR(WriteFrame(raw, Frame::kGet, json{{"path", path}}.dump()));
  Frame type;
  std::string payload;
  STRATA_RETURN_IF_ERROR(ReadFrame(raw, &type, &payload).Annotate("get " + path + ": no answer from the agent"));
  if (type == Frame::kError) return ParseErrorFrame(payload);
  json head = json::parse(payload, nullptr, false);
  if (head.is_object()) stream->size_ = head.value("size", uint64_t{0});
  return stream;
}

Result<bool> AgentClient::GetStream::Next(std::string* piece) {
  Frame type;
  STRATA_RETURN_IF_ERROR(ReadFrame(fd_.get(), &type, piece).Annotate("get " + path_ + ": the agent went away"));
  if (type == Frame::kDataEnd) return false;
  if (type == Frame::kError) return ParseErrorFrame(*piece);
  if (type != Frame::kData) return Error(EPROTO, "get " + path_ + ": unexpected frame");
  return true;
}

Result<std::string> AgentClient::Get(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto stream, OpenGet(path));
  std::string data, piece;
  while (true) {
    STRATA_ASSIGN_OR_RETURN(bool more, stream->Next(&piece));
    if (!more) return data;
    data += piece;
  }
}

Result<std::string> AgentClient::StartDetached(const ExecRequest& request, const std::string& exec_id, uint32_t* pid) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect(kControlReplyTimeout));
  UniqueFd fd(raw);
  json req = ExecRequestJson(request);
  req["stdin"] = request.open_stdin && !request.stdin_data;
  req["detach"] = true;
  if (!exec_id.empty()) req["exec_id"] = exec_id;
  if (request.stdin_data) req["stdin_b64"] = Base64Encode(*request.stdin_data);
  STRATA_RETURN_IF_ERROR(WriteFrame(fd.get(), Frame::kExec, req.dump(-1, ' ', false, json::error_handler_t::replace)));
  Frame type;
  std::string payload;
  STRATA_RETURN_IF_ERROR(ReadFrame(fd.get(), &type, &payload).Annotate("exec " + request.argv[0] + ": no answer from the agent"));
  if (type != Frame::kOk) return ParseErrorFrame(payload);
  json j = json::parse(payload, nullptr, false);
  if (!j.is_object() || !j.contains("exec_id") || !j["exec_id"].is_string()) return Error(EPROTO, "agent: detached exec without an id");
  if (pid) *pid = j.value("pid", 0u);  // (0 from an agent before version 6)
  return j["exec_id"].get<std::string>();
}

Result<std::optional<ExecResult>> AgentClient::Attach(const std::string& exec_id, uint64_t stdout_offset, uint64_t stderr_offset,
                                                      bool follow, const OutputSink& sink, int cancel_fd) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect());
  UniqueFd fd(raw);
  json req = {{"exec_id", exec_id}, {"stdout_offset", stdout_offset}, {"stderr_offset", stderr_offset}, {"follow", follow}};
  STRATA_RETURN_IF_ERROR(WriteFrame(fd.get(), Frame::kAttach, req.dump()));
  while (true) {
    if (CallerLeft(fd.get(), cancel_fd)) return Error(ECANCELED, "attach " + exec_id + ": the caller went away");  // the command runs on
    Frame type;
    std::string payload;
    Status s = ReadFrame(fd.get(), &type, &payload);
    if (!s.ok()) return s.Annotate("attach " + exec_id + ": the agent went away (the sandbox ended?)");
    switch (type) {
      case Frame::kStdout: sink(1, payload); break;
      case Frame::kStderr: sink(2, payload); break;
      case Frame::kError: return ParseErrorFrame(payload);
      case Frame::kOk: return std::optional<ExecResult>();
      case Frame::kExit: {
        STRATA_ASSIGN_OR_RETURN(ExecResult r, ParseExitFrame(payload));
        return std::optional<ExecResult>(r);
      }
      default: return Error(EPROTO, StrCat("agent: unexpected frame ", static_cast<int>(type), " during attach"));
    }
  }
}

namespace {
Result<json> ControlCall(int fd, Frame request, const json& body) {
  STRATA_RETURN_IF_ERROR(WriteFrame(fd, request, body.dump()));
  Frame type;
  std::string payload;
  STRATA_RETURN_IF_ERROR(ReadFrame(fd, &type, &payload).Annotate("no answer from the sandbox's agent"));
  if (type != Frame::kOk) return ParseErrorFrame(payload);
  json j = json::parse(payload, nullptr, false);
  if (!j.is_object()) return Error(EPROTO, "agent: answer is not a JSON object");
  return j;
}
}  // namespace

Result<json> AgentClient::ExecStatus(const std::string& exec_id, Duration wait) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect());
  UniqueFd fd(raw);
  return ControlCall(fd.get(), Frame::kExecStatus,
                     {{"exec_id", exec_id}, {"wait_ms", std::chrono::duration_cast<std::chrono::milliseconds>(wait).count()}});
}

Result<json> AgentClient::ListExecs() {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect(kControlReplyTimeout));
  UniqueFd fd(raw);
  return ControlCall(fd.get(), Frame::kListExecs, json::object());
}

Result<json> AgentClient::Fs(const json& request) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect(kControlReplyTimeout));
  UniqueFd fd(raw);
  return ControlCall(fd.get(), Frame::kFs, request);
}

Status AgentClient::ExecInput(const std::string& exec_id, std::string_view data, bool close) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect(kControlReplyTimeout));
  UniqueFd fd(raw);
  json req = {{"exec_id", exec_id}, {"close", close}};
  if (!data.empty()) req["data_b64"] = Base64Encode(data);
  return ControlCall(fd.get(), Frame::kExecInput, req).status();
}

Status AgentClient::Watch(const std::string& path, bool recursive, const std::function<void()>& started,
                          const std::function<bool(const json&)>& on_event, int cancel_fd) {
  // (No reply timeout: a watch is quiet for as long as nothing changes.)
  STRATA_ASSIGN_OR_RETURN(int raw, Connect());
  UniqueFd fd(raw);
  STRATA_RETURN_IF_ERROR(WriteFrame(fd.get(), Frame::kWatch, json{{"path", path}, {"recursive", recursive}}.dump()));
  bool running = false;
  while (true) {
    if (CallerLeft(fd.get(), cancel_fd)) return Error(ECANCELED, "watch " + path + ": the caller went away");
    Frame type;
    std::string payload;
    Status s = ReadFrame(fd.get(), &type, &payload);
    if (!s.ok()) return s.Annotate("watch " + path + ": the agent went away (the sandbox ended?)");
    if (type == Frame::kError) return ParseErrorFrame(payload);
    if (type == Frame::kOk && !running) {
      running = true;
      started();
      continue;
    }
    if (type == Frame::kOk) return OkStatus();  // {"ended": why}
    if (type != Frame::kWatchEvent || !running) return Error(EPROTO, StrCat("agent: unexpected frame ", static_cast<int>(type), " during a watch"));
    json event = json::parse(payload, nullptr, false);
    if (!event.is_object()) return Error(EPROTO, "agent: a watch event that is not a JSON object");
    if (!on_event(event)) return OkStatus();
  }
}

Status AgentClient::ResizeExec(const std::string& exec_id, ExecRequest::TerminalSize size) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect(kControlReplyTimeout));
  UniqueFd fd(raw);
  return ControlCall(fd.get(), Frame::kExecInput, {{"exec_id", exec_id}, {"size", {{"cols", size.cols}, {"rows", size.rows}}}}).status();
}

Status AgentClient::SignalExec(const std::string& exec_id, int signal) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect(kControlReplyTimeout));
  UniqueFd fd(raw);
  return ControlCall(fd.get(), Frame::kSignalExec, {{"exec_id", exec_id}, {"signal", signal}}).status();
}

Result<json> AgentClient::Ping() {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect(kControlReplyTimeout));
  UniqueFd fd(raw);
  STRATA_RETURN_IF_ERROR(WriteFrame(fd.get(), Frame::kPing, "{}"));
  Frame type;
  std::string payload;
  STRATA_RETURN_IF_ERROR(ReadFrame(fd.get(), &type, &payload));
  if (type != Frame::kOk) return ParseErrorFrame(payload);
  return json::parse(payload, nullptr, false);
}

bool AgentClient::Accepts() { return ConnectUnix(socket_path_, kControlReplyTimeout).ok(); }

Status AgentClient::Shutdown() {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect(kControlReplyTimeout));
  UniqueFd fd(raw);
  STRATA_RETURN_IF_ERROR(WriteFrame(fd.get(), Frame::kShutdown, "{}"));
  Frame type;
  std::string payload;
  ReadFrame(fd.get(), &type, &payload).IgnoreError();  // the agent may exit before answering
  return OkStatus();
}

Status AgentClient::Freeze(bool freeze) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect(kControlReplyTimeout));
  UniqueFd fd(raw);
  STRATA_RETURN_IF_ERROR(WriteFrame(fd.get(), Frame::kFreeze, json{{"freeze", freeze}}.dump()));
  Frame type;
  std::string payload;
  STRATA_RETURN_IF_ERROR(ReadFrame(fd.get(), &type, &payload).Annotate(freeze ? "freeze" : "thaw"));
  if (type != Frame::kOk) return ParseErrorFrame(payload);
  return OkStatus();
}

Status AgentClient::Identify(const json& identity) {
  STRATA_ASSIGN_OR_RETURN(int raw, Connect(kControlReplyTimeout));
  UniqueFd fd(raw);
  STRATA_RETURN_IF_ERROR(WriteFrame(fd.get(), Frame::kIdentity, identity.dump()));
  Frame type;
  std::string payload;
  STRATA_RETURN_IF_ERROR(ReadFrame(fd.get(), &type, &payload).Annotate("identity"));
  if (type != Frame::kOk) return ParseErrorFrame(payload).Annotate("identity");
  return OkStatus();
}

}  // namespace strata::launcher
