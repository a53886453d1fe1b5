// The launcher's side of the agent protocol (agent/protocol.h).
#pragma once

#include <poll.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/unique_fd.h"
#include "common/units.h"
#include "launcher/protocol/file_rules.h"
#include "launcher/protocol/protocol.h"

namespace strata::launcher {

struct ExecRequest {
  std::vector<std::string> argv;
  std::vector<std::string> env;  // "K=V"; PATH defaults inside the agent
  std::string cwd;  // empty: the sandbox's working directory (its workdir, else /)
  Duration timeout{0};           // zero: none
  uint64_t stdout_cap = uint64_t{1} << 20;
  uint64_t stderr_cap = uint64_t{1} << 20;
  std::optional<std::string> stdin_data;
  // A detached command without stdin_data: its stdin stays open for
  // AgentClient::ExecInput until closed.
  bool open_stdin = false;
  // `env` goes over the sandbox's env (a name in both takes env's value)
  // instead of replacing it.
  bool merge_env = false;
  // A user of the sandbox's /etc/passwd the command runs as (protocol
  // version 6); empty: its root.
  std::string user;
  bool user_optional = false;  // a user the image lacks: its root instead
  // A terminal of this size is the command's stdin, stdout and stderr
  // (protocol version 7); its output is stdout, and a detached one's input
  // (ExecInput) and size (ResizeExec) go to the terminal.
  struct TerminalSize {
    uint16_t cols = 80, rows = 24;
  };
  std::optional<TerminalSize> pty;
  // A function call: fresh pid, mount, ipc, uts (and, unless the sandbox
  // has the host's, network) namespaces, a private /tmp, no privileges.
  bool isolate = false;
  bool isolate_network = true;  // false: the call shares the sandbox's network
  // When this descriptor reports a hang-up (the daemon's client went away),
  // the exec is abandoned: the agent sees its connection close and kills
  // the command. -1: none.
  int cancel_fd = -1;
  // Kill everything the command started (its whole tree, also what left
  // its session) once it exits or times out (default: the sandbox's, else
  // leftovers keep running; the exec ends 50 ms after the command while
  // they hold its output pipes).
  std::optional<bool> kill_leftovers;
  // File rules for this command (docs/security.md); the sandbox's own are
  // merged in unless `grader`.
  FileRules files;
  // The grader's exec (asked for by the API caller only): it runs without
  // the sandbox's file rules and so sees its hidden files.
  bool grader = false;
};

struct ExecResult {
  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  uint64_t stdout_bytes = 0, stderr_bytes = 0;
  bool stdout_truncated = false, stderr_truncated = false;
  int64_t duration_ms = 0;
  bool oom_killed = false;  // set by the launcher (the kernel's OOM killer ended it)
};

// The payloads of the exit and error frames (also the daemon's exec answers).
nlohmann::json ExecResultJson(const ExecResult& r);
Result<ExecResult> ParseExitFrame(std::string_view payload);
Status ParseErrorFrame(std::string_view payload);

// The poll events that say the client on `fd` went away: a hang-up; and
// on TCP also the peer's FIN (POLLRDHUP), since an HTTP client never
// half-closes and a TCP socket whose peer closed reports no hang-up until
// it is written to. (On a unix socket a half-close still wants its answer.)
short HangupEvents(int fd);
bool HungUp(const pollfd& p);

// Called with each piece of output as it arrives: 1 = stdout, 2 = stderr.
using OutputSink = std::function<void(int stream, std::string_view bytes)>;

class AgentClient {
 public:
  explicit AgentClient(std::string socket_path) : socket_path_(std::move(socket_path)) {}

  // Paths the sandbox's file rules name: a put to one of them is written
  // in place (a rename over it would lift the rule in running commands).
  void SetRulePaths(const FileRules& rules);

  // Waits until the agent answers a ping, or `wait` passes. The socket must
  // exist (the launcher binds it and hands it to the agent).
  Status WaitReady(Duration wait);
  Result<ExecResult> Exec(const ExecRequest& request, const OutputSink& sink);
  Status Put(const std::string& path, std::string_view data, uint32_t mode, std::optional<std::pair<uint32_t, uint32_t>> owner);

  // A file sent in pieces as they come (an upload): Write() each piece,
  // then Finish() for the agent's answer. The agent writes a temporary
  // file beside `path` and renames it over `path` only at the end, so a
  // stream dropped unfinished (destroyed without Finish) leaves `path` as
  // it was.
  class PutStream {
   public:
    Status Write(std::string_view piece);
    Status Finish();
    // Keeps `owner` (the sandbox) alive as long as the stream.
    void Keep(std::shared_ptr<void> owner) { keep_.push_back(std::move(owner)); }

   private:
    friend class AgentClient;
    UniqueFd fd_;
    std::string path_;
    std::vector<std::shared_ptr<void>> keep_;
  };
  // `user`: a name of the sandbox's /etc/passwd the file is given to
  // (protocol version 6), when `owner` is not given.
  Result<std::unique_ptr<PutStream>> BeginPut(const std::string& path, uint32_t mode,
                                              std::optional<std::pair<uint32_t, uint32_t>> owner,
                                              const std::string& user = "");

  // A directory tree sent entry by entry: Entry() with the entry's
  // {"name", "type", "mode", "target"?}, then for a file its bytes in
  // Data() and EndFile(); Finish() for the agent's answer (entries
  // written). The agent resolves every name below `path` without following
  // a link; the entries before an error stay written.
  class TreeStream {
   public:
    Status Entry(const nlohmann::json& entry);
    Status Data(std::string_view bytes);
    Status EndFile();
    Result<nlohmann::json> Finish();
    void Keep(std::shared_ptr<void> owner) { keep_.push_back(std::move(owner)); }

   private:
    friend class AgentClient;
    UniqueFd fd_;
    std::string path_;
    std::vector<std::shared_ptr<void>> keep_;
  };
  Result<std::unique_ptr<TreeStream>> BeginPutTree(const std::string& path);
  // The tree below `path`, never following a link: `on_entry` for each
  // entry (as above, plus "size" of a file), `on_data` with a file's bytes
  // after its entry. A callback's error ends the transfer.
  Status GetTree(const std::string& path, const std::function<Status(const nlohmann::json&)>& on_entry,
                 const std::function<Status(std::string_view)>& on_data);
  Result<std::string> Get(const std::string& path);
  // A file read piece by piece: OpenGet has the agent's first answer (an
  // error, or the file's size and mode), Next() the bytes (false at the end).
  class GetStream {
   public:
    uint64_t size() const { return size_; }
    Result<bool> Next(std::string* piece);

   private:
    friend class AgentClient;
    UniqueFd fd_;
    std::string path_;
    uint64_t size_ = 0;
  };
  Result<std::unique_ptr<GetStream>> OpenGet(const std::string& path);
  Result<nlohmann::json> Ping();
  // Whether a process holds the agent's socket (a container's agent alone
  // does: the launcher lets go of it at start and commands do not inherit
  // it): a connection is made and closed, without waiting for an answer.
  bool Accepts();

  // Detached commands (protocol version 2): the agent runs and keeps them.
  // Starts one (`exec_id` empty: the agent names it); returns its id.
  Result<std::string> StartDetached(const ExecRequest& request, const std::string& exec_id, uint32_t* pid = nullptr);
  // Sends its output from the offsets to `sink`: as it comes when
  // `follow` (until it ends or `cancel_fd` hangs up), else what there is.
  // Returns the exit report once it ended, nullopt while it runs.
  Result<std::optional<ExecResult>> Attach(const std::string& exec_id, uint64_t stdout_offset, uint64_t stderr_offset,
                                           bool follow, const OutputSink& sink, int cancel_fd = -1);
  // Its description ({"id", "state", "exit"?, "stdout_bytes", ...}),
  // waiting up to `wait` for it to end.
  Result<nlohmann::json> ExecStatus(const std::string& exec_id, Duration wait = Duration{0});
  Result<nlohmann::json> ListExecs();
  // A filesystem call (protocol version 6): {"op", "path", ...} (protocol.h, kFs).
  Result<nlohmann::json> Fs(const nlohmann::json& request);
  // Bytes for a detached command's open stdin (protocol version 6), then EOF with `close`.
  Status ExecInput(const std::string& exec_id, std::string_view data, bool close);
  // Watches directory `path` (and, recursive, all below it; protocol 7):
  // `started` once the watch is in place, then `on_event` with each
  // change's {"name" (below path), "type"} as it comes, until it returns
  // false, `cancel_fd` hangs up (ECANCELED), or the directory goes (ok).
  Status Watch(const std::string& path, bool recursive, const std::function<void()>& started,
               const std::function<bool(const nlohmann::json&)>& on_event, int cancel_fd);
  // A detached command's terminal takes a new size (it was started with a pty).
  Status ResizeExec(const std::string& exec_id, ExecRequest::TerminalSize size);
  Status SignalExec(const std::string& exec_id, int signal);
  // Asks the agent to kill everything and exit; the sandbox's init is gone after.
  Status Shutdown();
  // A microVM's agent: freezes (or thaws) the upper disk's filesystem.
  Status Freeze(bool freeze);
  // A microVM's agent: takes its identity (Frame::kIdentity).
  Status Identify(const nlohmann::json& identity);

 private:
  Result<int> Connect(Duration reply_timeout = Duration{0});
  std::string socket_path_;
  std::vector<std::string> rule_paths_;
};

}  // namespace strata::launcher
