// The in-sandbox agent: a small static program that runs as the sandbox's
// init (PID 1). It runs commands with streamed and capped output, kills
// whole process groups on timeout, reaps every zombie, and moves files.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "common/unique_fd.h"

namespace strata::launcher {

class Agent {
 public:
  // Serves connections on `listen_fd` until a shutdown request (then it
  // kills every process it can see and returns).
  Status Serve(int listen_fd);
  // Reaps children forever; run it on its own thread.
  void ReapLoop();

 private:
  void HandleConnection(UniqueFd conn);
  Status Exec(int conn, const nlohmann::json& request);
  Status Put(int conn, const nlohmann::json& request);
  Status Get(int conn, const nlohmann::json& request);
  // Waits for child `pid` (registered before it could exit) to be reaped.
  int WaitChild(pid_t pid);
  // The seccomp program each function call loads (read once); null when
  // the sandbox has none.
  const std::string* CallSeccomp();

  std::mutex mu_;  // held across fork() so the reaper cannot miss a child
  std::condition_variable cv_;
  std::map<pid_t, int> children_;  // pid -> wait status, -1 while running
  uint64_t spawned_ = 0;           // children started so far (wakes the reaper)
  bool shutting_down_ = false;
  std::string call_seccomp_;
};

}  // namespace strata::launcher
