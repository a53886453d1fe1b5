// Child processes: argv + environment in, captured output and exit status
// out, with a timeout. A Subprocess that goes away while its child still runs
// kills the child's whole process group and reaps it, so no error path leaves
// a process behind.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "common/units.h"

namespace strata {

enum class StdStream { kInherit, kCapture, kNull, kFile };

struct SubprocessOptions {
  std::vector<std::string> argv;  // argv[0] is looked up in PATH
  // "KEY=VALUE" entries added to the inherited environment (replacing
  // variables of the same name); with clear_env only these are passed.
  std::vector<std::string> env;
  bool clear_env = false;
  std::string cwd;  // empty: the caller's
  StdStream stdout_mode = StdStream::kCapture;
  StdStream stderr_mode = StdStream::kCapture;
  std::string stdout_file, stderr_file;  // for kFile: appended to, created 0600
  std::optional<std::string> stdin_data;  // nullopt: stdin is /dev/null
  Duration timeout{0};                    // zero: no timeout
  // Descriptors the child gets at 3, 4, ... in this order (socket
  // activation). Nothing else is passed that was opened close-on-exec.
  std::vector<int> pass_fds;
};

struct SubprocessResult {
  int exit_code = -1;    // -1 when a signal ended the process
  int term_signal = 0;   // the signal that ended it, else 0
  bool timed_out = false;
  std::string out;       // captured stdout
  std::string err;       // captured stderr

  bool success() const { return exit_code == 0 && !timed_out; }
  // "exited with status 2", "killed by signal 9", "timed out after 5s".
  std::string Describe() const;
};

class Subprocess {
 public:
  static Result<Subprocess> Start(SubprocessOptions options);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) noexcept;
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }
  // Feeds stdin, collects captured output and waits for the exit, killing
  // the process group when the timeout passes. Call once.
  Result<SubprocessResult> Wait();
  // Sends `sig` to the child's process group.
  void Kill(int sig);
  // Whether the child still runs (reaps it, keeping its status for Wait()).
  bool Running();
  // Waits up to `limit` for the child to exit (reaping it as Running()
  // does); returns whether it still runs.
  bool RunningAfter(Duration limit);
  // Lets the child run on without this object (no kill on destruction).
  void Detach() { pid_ = -1; }

 private:
  Subprocess() = default;
  void KillAndReap();

  SubprocessOptions options_;
  pid_t pid_ = -1;
  int reaped_status_ = -1;  // set by Running() when it reaped the child
  UniqueFd stdin_, stdout_, stderr_;
};

// The file `name` names as a program: itself when it holds a slash, else
// the first executable of that name in $PATH (or /usr/bin:/bin); empty when
// there is none.
std::string FindProgram(const std::string& name);

// Start + Wait.
Result<SubprocessResult> RunCommand(SubprocessOptions options);
// RunCommand that also fails unless the command exits 0; the error reads
// "<step>: <argv0> exited with status 1: <last lines of stderr>".
Result<SubprocessResult> RunChecked(SubprocessOptions options, std::string_view step);

}  // namespace strata
