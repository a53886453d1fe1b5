// The agent's detached commands (protocol version 2): started, attached
// to, asked after and signalled by id; their output (up to its caps) kept
// here.
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <chrono>
#include <memory>

#include "common/fs.h"
#include "common/strings.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/request.h"
#include "launcher/protocol/protocol.h"

namespace strata::launcher {

using nlohmann::json;
using agent::SendError;

// ---- Detached commands (protocol version 2): they belong to the agent,
// not to a connection, so they outlive the launcher's connection and the
// launcher itself.

json Agent::Detached::Describe() const {
  json j = {{"id", id}, {"argv", argv}, {"started", started}, {"state", done ? "exited" : "running"},
            {"stdout_bytes", out.size()}, {"stderr_bytes", err.size()}};
  if (pid > 0) j["pid"] = pid;  // the command's process group, as the sandbox sees it
  if (has_pty) j["pty"] = true;
  if (done) j["exit"] = exit;
  return j;
}

Status Agent::StartDetached(int conn, const json& req) {
  std::shared_ptr<Detached> d;
  {
    std::lock_guard lock(detached_mu_);
    // Room for a new one: forget the oldest finished ones past the limit.
    while (detached_.size() >= kMaxDetached) {
      auto oldest = detached_.end();
      for (auto it = detached_.begin(); it != detached_.end(); ++it) {
        std::lock_guard l(it->second->mu);
        if (it->second->done && (oldest == detached_.end() || it->second->seq < oldest->second->seq)) oldest = it;
      }
      if (oldest == detached_.end()) {
        return SendError(conn, Error(EAGAIN, StrCat("exec: ", kMaxDetached, " detached commands run already")));
      }
      detached_.erase(oldest);
    }
    d = std::make_shared<Detached>();
    d->seq = ++detached_seq_;
    std::string id = req.value("exec_id", "");
    if (id.empty() || detached_.count(id)) id = StrCat("ex-", ::getpid(), "-", d->seq);
    d->id = id;
    // Its slot and name are taken now, under the same lock as the check
    // (it is not yet signalled: no pid).
    detached_[d->id] = d;
  }
  d->argv = req.value("argv", json::array());
  d->started = static_cast<int64_t>(::time(nullptr));
  std::optional<std::string> input;
  if (req.contains("stdin_b64") && req["stdin_b64"].is_string()) {
    input = Base64Decode(req["stdin_b64"].get<std::string>());
  }
  // "stdin": true without "stdin_b64": its stdin stays open for kExecInput.
  // A terminal's input is always kept ("pty").
  const bool keep_stdin = !req.contains("stdin_b64") && (req.value("stdin", false) || req.contains("pty"));
  auto started = input || !req.contains("stdin_b64") ? Start(req, input.has_value() || keep_stdin)
                                                     : Result<Started>(Error(EINVAL, "exec: stdin_b64 is not base64"));
  if (!started.ok()) {
    std::lock_guard lock(detached_mu_);
    detached_.erase(d->id);
    return SendError(conn, started.status());
  }
  {
    std::lock_guard lock(d->mu);
    d->pid = started->group;
    d->has_pty = static_cast<bool>(started->pty);
  }
  // The pump runs on its own thread; stdin, if any, is written by another
  // so a command that fills its output first never stalls on it.
  auto command = std::make_shared<Started>(std::move(*started));
  {
    std::lock_guard lock(d->in_mu);
    if (keep_stdin) d->in = std::move(command->in_w);
    d->pty = std::move(command->pty);
  }
  if (input) {
    int in = command->in_w.release();
    Spawn([in, data = std::move(*input)] {
      WriteFull(in, data).IgnoreError();
      ::close(in);
    });
  }
  Spawn([this, d, command] {
    json result = Pump(*command, -1, [&](int stream, std::string_view bytes) {
      std::lock_guard lock(d->mu);
      (stream == 1 ? d->out : d->err).append(bytes);
      d->cv.notify_all();
      return true;
    });
    {
      std::lock_guard lock(d->mu);
      d->done = true;
      d->exit = result;
      d->cv.notify_all();
    }
    std::lock_guard lock(d->in_mu);
    d->in.reset();
    d->pty.reset();
  });
  return WriteFrame(conn, Frame::kOk, json{{"exec_id", d->id}, {"pid", command->group}}.dump());
}

std::shared_ptr<Agent::Detached> Agent::FindDetached(const std::string& id) {
  std::lock_guard lock(detached_mu_);
  auto it = detached_.find(id);
  return it == detached_.end() ? nullptr : it->second;
}

Status Agent::Attach(int conn, const json& req) {
  auto d = FindDetached(req.value("exec_id", ""));
  if (!d) return SendError(conn, Error(ENOENT, "exec " + Quote(req.value("exec_id", "")) + ": no such detached command"));
  uint64_t at[2] = {req.value("stdout_offset", uint64_t{0}), req.value("stderr_offset", uint64_t{0})};
  const bool follow = req.value("follow", true);
  while (true) {
    std::string pieces[2];
    bool done;
    json exit;
    {
      std::unique_lock lock(d->mu);
      auto ready = [&] { return d->done || d->out.size() > at[0] || d->err.size() > at[1]; };
      // Wake now and then to notice a launcher that went away.
      if (follow) d->cv.wait_for(lock, std::chrono::milliseconds(500), ready);
      for (int k = 0; k < 2; ++k) {
        const std::string& buf = k == 0 ? d->out : d->err;
        if (buf.size() > at[k]) pieces[k] = buf.substr(at[k]);
        at[k] = std::max<uint64_t>(at[k], buf.size());
      }
      done = d->done;
      exit = d->exit;
    }
    for (int k = 0; k < 2; ++k) {
      for (size_t off = 0; off < pieces[k].size(); off += kMaxFrame) {
        STRATA_RETURN_IF_ERROR(WriteFrame(conn, k == 0 ? Frame::kStdout : Frame::kStderr,
                                          std::string_view(pieces[k]).substr(off, kMaxFrame)));
      }
    }
    if (done) return WriteFrame(conn, Frame::kExit, exit.dump());
    if (!follow) return WriteFrame(conn, Frame::kOk, json{{"state", "running"}}.dump());
    pollfd p{conn, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR | POLLIN))) return OkStatus();  // gone (or talking out of turn)
  }
}

Status Agent::ExecStatus(int conn, const json& req) {
  auto d = FindDetached(req.value("exec_id", ""));
  if (!d) return SendError(conn, Error(ENOENT, "exec " + Quote(req.value("exec_id", "")) + ": no such detached command"));
  const int64_t wait_ms = req.value("wait_ms", int64_t{0});
  std::unique_lock lock(d->mu);
  if (wait_ms > 0) d->cv.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return d->done; });
  return WriteFrame(conn, Frame::kOk, d->Describe().dump());
}

Status Agent::ListExecs(int conn) {
  std::vector<std::shared_ptr<Detached>> all;
  {
    std::lock_guard lock(detached_mu_);
    for (auto& [id, d] : detached_) all.push_back(d);
  }
  std::sort(all.begin(), all.end(), [](const auto& a, const auto& b) { return a->seq < b->seq; });
  json list = json::array();
  for (auto& d : all) {
    std::lock_guard lock(d->mu);
    list.push_back(d->Describe());
  }
  return WriteFrame(conn, Frame::kOk, json{{"execs", list}}.dump());
}

Status Agent::ExecInput(int conn, const json& req) {
  auto d = FindDetached(req.value("exec_id", ""));
  if (!d) return SendError(conn, Error(ENOENT, "exec " + Quote(req.value("exec_id", "")) + ": no such detached command"));
  std::optional<std::string> data;
  if (req.contains("data_b64")) {
    data = req["data_b64"].is_string() ? Base64Decode(req["data_b64"].get<std::string>()) : std::nullopt;
    if (!data) return SendError(conn, Error(EINVAL, "exec input: data_b64 is not base64"));
  }
  std::lock_guard lock(d->in_mu);
  if (req.contains("size")) {  // {"cols", "rows"}: its terminal's new size
    if (!d->pty) return SendError(conn, Error(ENOTTY, "exec " + d->id + ": it has no terminal (started without \"pty\") or ended"));
    auto size = agent::TerminalSize(req["size"]);
    if (!size.ok()) return SendError(conn, size.status().Annotate("exec " + d->id + ": resize"));
    if (::ioctl(d->pty.get(), TIOCSWINSZ, &*size) != 0) return SendError(conn, ErrnoError(errno, "exec " + d->id + ": resize its terminal"));
    if (!req.contains("data_b64") && !req.value("close", false)) return WriteFrame(conn, Frame::kOk, "{}");
  }
  if (!d->in) return SendError(conn, Error(EPIPE, "exec " + d->id + ": its stdin is closed (or was never kept open)"));
  if (data && !data->empty()) {
    if (Status s = WriteFull(d->in.get(), *data); !s.ok()) return SendError(conn, s.Annotate("exec " + d->id + ": stdin"));
  }
  if (req.value("close", false)) d->in.reset();
  return WriteFrame(conn, Frame::kOk, "{}");
}

Status Agent::SignalExec(int conn, const json& req) {
  auto d = FindDetached(req.value("exec_id", ""));
  if (!d) return SendError(conn, Error(ENOENT, "exec " + Quote(req.value("exec_id", "")) + ": no such detached command"));
  const int sig = req.value("signal", SIGTERM);
  {
    std::lock_guard lock(d->mu);
    // (ESRCH: it is exiting and its pump has not seen it yet.)
    if (!d->done && d->pid > 0 && ::kill(-d->pid, sig) != 0 && errno != ESRCH) {
      return SendError(conn, ErrnoError(errno, "signal " + d->id));
    }
  }
  return WriteFrame(conn, Frame::kOk, "{}");
}

}  // namespace strata::launcher
