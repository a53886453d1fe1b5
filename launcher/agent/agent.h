// The in-sandbox agent: a small static program that runs as the sandbox's
// init (PID 1). It runs commands with streamed and capped output, kills
// whole process groups on timeout, reaps every zombie, and moves files.
// Detached commands (protocol version 2) are its own: their state and
// output (up to their caps) live here, so they outlive the connection that
// started them and the launcher itself.
#pragma once

#include <sys/eventfd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/unique_fd.h"

namespace strata::launcher {

class Agent {
 public:
  // `command_cgroups`: descriptors of cgroup.procs files every command but
  // the grader's joins before it runs (the sandbox's cgroup keeps a
  // reserve for the agent and the grader); empty: commands stay in ours.
  explicit Agent(std::vector<int> command_cgroups = {}) : command_cgroups_(std::move(command_cgroups)) {}
  ~Agent();  // (threads still running are left to the process's exit)
  // Serves connections on `listen_fd` until a shutdown request (then it
  // kills every process it can see and returns).
  Status Serve(int listen_fd);
  // Reaps children until none is left and none came for kLinger (then the
  // thread ends: an idle agent is one thread); Exec starts it again with
  // the next child.
  void ReapLoop();
  // Serves one connection the caller accepted (a microVM's channel hands
  // each of its streams over this way), on a thread of its own.
  void ServeConnection(UniqueFd conn);
  // The agent is a microVM's init: a shutdown request ends with
  // `power_off` (not an exit), freeze requests call `freeze`, identity
  // requests `identify`.
  void SetMicroVm(std::function<void()> power_off, std::function<Status(bool)> freeze,
                  std::function<Status(const nlohmann::json&)> identify) {
    power_off_ = std::move(power_off);
    freeze_ = std::move(freeze);
    identify_ = std::move(identify);
  }

 private:
  // The most detached commands kept at once; finished ones are forgotten,
  // oldest first, to make room.
  static constexpr size_t kMaxDetached = 256;
  // How long a connection's thread waits for the next connection, and the
  // reaper for the next child, before it ends: requests come in runs (a
  // training loop's commands one after another), and a thread made and
  // unmade for each cost a fifth of an exec's CPU in the agent; an idle
  // sandbox's agent still ends up with its one thread.
  static constexpr std::chrono::milliseconds kLinger{1000};

  // A command forked and not yet waited for.
  struct Started {
    pid_t pid = -1;
    UniqueFd out_r, err_r, in_w;
    std::chrono::steady_clock::time_point start;
    int64_t timeout_ms = 0;
    uint64_t caps[2] = {0, 0};
    bool kill_leftovers = false;
    std::string argv0;
    pid_t group = -1;  // the process group signals go to: pid's, or a shepherd's command's
    UniqueFd pty;      // its terminal's other end ("pty"): out_r and in_w are copies of it
  };
  struct Detached {
    std::string id;
    uint64_t seq = 0;
    nlohmann::json argv;
    int64_t started = 0;  // unix time
    pid_t pid = -1;
    std::mutex mu;
    std::condition_variable cv;
    std::string out, err;  // what it wrote, up to its caps
    bool done = false;
    nlohmann::json exit;  // the exit report once done
    nlohmann::json Describe() const;  // under mu
    // Its stdin, when it was started with "stdin": true and no
    // "stdin_b64": written by kExecInput until closed (under in_mu, not
    // mu: a write may wait for the command to read).
    std::mutex in_mu;
    UniqueFd in;
    UniqueFd pty;  // its terminal ("pty"), for its size (under in_mu)
    bool has_pty = false;
  };

  void HandleConnection(UniqueFd conn);
  void HandleRequest(int conn);
  // Forks the command of an exec request; the error says which step failed.
  Result<Started> Start(const nlohmann::json& request, bool want_stdin);
  // Relays a started command's output to `emit` (1 stdout, 2 stderr; up to
  // the caps; false stops emitting) and, when `conn` >= 0, takes stdin and
  // signals from it (a closed `conn` kills the command). Returns the exit
  // report once the command is gone and its pipes closed or stayed quiet.
  nlohmann::json Pump(Started& command, int conn, const std::function<bool(int, std::string_view)>& emit);
  void KillCommand(const Started& command);
  Status Exec(int conn, const nlohmann::json& request);
  Status StartDetached(int conn, const nlohmann::json& request);
  std::shared_ptr<Detached> FindDetached(const std::string& id);
  Status Attach(int conn, const nlohmann::json& request);
  Status ExecStatus(int conn, const nlohmann::json& request);
  Status ListExecs(int conn);
  Status SignalExec(int conn, const nlohmann::json& request);
  Status Put(int conn, const nlohmann::json& request);
  Status Get(int conn, const nlohmann::json& request);
  Status PutTree(int conn, const nlohmann::json& request);
  Status GetTree(int conn, const nlohmann::json& request);
  Status Fs(int conn, const nlohmann::json& request);  // fs_ops.cc
  Status ExecInput(int conn, const nlohmann::json& request);
  Status Watch(int conn, const nlohmann::json& request);  // watch.cc
  // Waits for child `pid` (registered before it could exit) to be reaped.
  int WaitChild(pid_t pid);
  // The seccomp program each function call loads (read once); null when
  // the sandbox has none.
  const std::string* CallSeccomp();

  std::mutex mu_;  // held across fork() so the reaper cannot miss a child
  std::condition_variable cv_;
  std::condition_variable spawned_cv_;  // a child was started (a lingering reaper waits for it)
  std::map<pid_t, int> children_;  // pid -> wait status, -1 while running
  uint64_t spawned_ = 0;           // children started so far
  bool reaping_ = false;           // a ReapLoop thread runs
  std::atomic<int> active_connections_{0};
  bool shutting_down_ = false;
  std::string call_seccomp_;
  std::vector<int> command_cgroups_;
  std::function<void()> power_off_;  // set in a microVM
  std::function<Status(bool)> freeze_;
  std::function<Status(const nlohmann::json&)> identify_;
  std::mutex detached_mu_;
  std::map<std::string, std::shared_ptr<Detached>> detached_;
  uint64_t detached_seq_ = 0;

  // The agent's threads (connections, output pumps, the reaper) are joined
  // once they end, by the serving loop or the next Spawn: with glibc's
  // stack cache off (the launcher sets GLIBC_TUNABLES for the agent) an
  // idle agent then keeps no ended thread's stack, nor the page tables
  // that map it. Throws std::system_error when no thread can be made.
  void Spawn(std::function<void()> fn);
  void JoinEnded();
  // Connections waiting for a lingering thread (never more than
  // idle_connection_threads_), under connections_mu_.
  std::mutex connections_mu_;
  std::condition_variable connections_cv_;
  std::vector<int> waiting_connections_;
  size_t idle_connection_threads_ = 0;
  void ConnectionThread(UniqueFd conn);
  std::mutex threads_mu_;
  std::list<std::thread> threads_;
  std::vector<std::list<std::thread>::iterator> ended_;
  UniqueFd ended_fd_{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};  // the serving loop polls it: a thread ended
};

}  // namespace strata::launcher
