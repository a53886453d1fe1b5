// The agent protocol: how the launcher talks to the agent inside a sandbox
// over a stream (a unix socket for containers, a virtio port for VMs).
// docs/protocol.md describes it for other implementations.
//
// Every message is a frame (common/frame.h). Control payloads are JSON
// objects; data payloads are raw bytes. One connection carries one request
// and its answers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/frame.h"
#include "common/status.h"

namespace strata::launcher {

// The version a ping reports. 2 added detached commands (kExec with
// "detach", kAttach, kExecStatus, kListExecs, kSignalExec),
// "kill_leftovers", and directory trees (kPutTree, kGetTree). 3 added file
// rules ("files", "grader" on kExec; "in_place" on kPut) and the whole-tree
// kill_leftovers; an older agent ignores them, so the launcher refuses
// rules for it. 4 added kFreeze (microVMs). 5 added kIdentity (microVMs:
// a guest restored from a saved state learns who it is). 6 added kFs,
// kExecInput and "pid" in a detached command's description. 7 added
// terminals: "pty" on kExec, "pty" in a detached command's description and
// "size" on kExecInput; and directory watches (kWatch, kWatchEvent).
inline constexpr int kAgentProtocolVersion = 7;

enum class Frame : uint8_t {
  // launcher -> agent
  kExec = 1,      // {"argv": [...], "env": ["K=V"], "cwd": "/", "timeout_ms": 0,
                  //  "stdout_cap": N, "stderr_cap": N, "stdin": bool, "kill_leftovers": bool,
                  //  "pty": {"cols", "rows"} (version 7: its stdin, stdout and stderr are a new
                  //  terminal of that size; its output comes as stdout)}
                  // With "detach": true (and optional "exec_id", "stdin_b64"):
                  // -> kOk {"exec_id": "...", "pid": N (version 6)} at once; the command is the agent's.
  kStdin = 2,     // bytes for the command's stdin (when "stdin" was true)
  kStdinEof = 3,  // no more stdin
  kSignal = 4,    // {"signal": 15}: to the running command's process group
  kPut = 5,       // {"path": "/x", "mode": 420, "uid": 0, "gid": 0}, then kData..., kDataEnd
  kGet = 6,       // {"path": "/x"}
  kShutdown = 7,  // stop every process and exit (the sandbox ends)
  kPing = 8,      // {} -> kOk {"pid": 1, "version": ...}
  kAttach = 9,    // {"exec_id", "stdout_offset": N, "stderr_offset": N, "follow": bool}
                  // -> kStdout/kStderr from the offsets, then kExit when it ended,
                  //    or (follow false, still running) kOk {"state": "running"}
  kExecStatus = 10,  // {"exec_id", "wait_ms": N} -> kOk {"id", "state", "exit"?, ...}
  kListExecs = 11,   // {} -> kOk {"execs": [...]}
  kSignalExec = 12,  // {"exec_id", "signal": 15} -> kOk {}
  kPutTree = 13,  // {"path": "/dir"}, then per entry kTreeEntry (+ kData... kDataEnd for a
                  // file), then kTreeEnd -> kOk {"entries": N}
  kGetTree = 14,  // {"path": "/dir"} -> kOk {}, per entry kTreeEntry (+ kData... kDataEnd
                  // for a file), then kTreeEnd; or kError
  kFreeze = 15,   // {"freeze": bool} -> kOk {}: a microVM's agent freezes (or thaws)
                  // the upper disk's filesystem for a snapshot taken outside

  // agent -> launcher
  kStdout = 16,   // bytes the command wrote, up to the cap
  kStderr = 17,
  kExit = 18,     // {"exit_code": 0, "signal": 0, "timed_out": false, "stdout_bytes": N,
                  //  "stderr_bytes": N, "stdout_truncated": false, "stderr_truncated": false,
                  //  "duration_ms": N}
  kError = 19,    // {"error": "message", "errno": 2}
  kOk = 20,       // {} (put done; ping answer; get: {"size": N, "mode": M} before the data)

  // launcher -> agent (numbered after the above)
  kIdentity = 21,  // {"hostname", "time_ns", "entropy" (hex), "net"?: {"address", "gateway"}}
                   // -> kOk {}: a microVM's agent takes the sandbox's name, the
                   // node's clock, fresh entropy and (once) its network
  kExecInput = 23,  // {"exec_id", "data_b64"?, "close"?: bool, "size"?: {"cols", "rows"}} -> kOk {}:
                    // bytes for a detached command's stdin (started with "stdin": true and no
                    // "stdin_b64", or with "pty": its terminal's), then maybe EOF; "size" resizes
                    // its terminal (version 7)
  kFs = 22,        // {"op": "stat"|"list"|"mkdir"|"move"|"remove", "path": "/abs", "depth": N (list),
                   //  "to": "/abs" (move)} -> kOk {"entry": E} (stat, mkdir, move), {"entries": [E...]}
                   // (list, below path, depth levels), {} (remove: recursive); or kError. E:
                   // {"name", "path", "type": "file"|"dir"|"symlink", "size", "mode", "permissions",
                   //  "owner", "group", "mtime_ns", "target"?}
  kWatch = 24,     // {"path": "/abs/dir", "recursive": bool} -> kOk {}, then a kWatchEvent per
                   // change below it as it comes, until the launcher hangs up; or kError. It
                   // ends with kOk {"ended": why} when the directory goes, kError when events
                   // were lost (version 7)
  // agent -> launcher
  kWatchEvent = 25,  // {"name": "a/b" (below the watched directory), "type": "create"|"write"|
                     //  "remove"|"rename"|"chmod"}
  // both ways
  kData = 32,     // file bytes
  kDataEnd = 33,
  kTreeEntry = 34,  // {"name": "a/b", "type": "file"|"dir"|"symlink"|"hardlink",
                    //  "mode": 420, "size": N, "target": "..."}
  kTreeEnd = 35,
};

// One frame of the agent protocol (common/frame.h).
inline Status WriteFrame(int fd, Frame type, std::string_view payload) {
  return strata::WriteFrame(fd, static_cast<uint8_t>(type), payload);
}
inline Status ReadFrame(int fd, Frame* type, std::string* payload) {
  return strata::ReadFrame(fd, reinterpret_cast<uint8_t*>(type), payload);
}
inline std::string EncodeFrame(Frame type, std::string_view payload) {
  return strata::EncodeFrame(static_cast<uint8_t>(type), payload);
}
inline Result<size_t> DecodeFrame(std::string_view buffer, Frame* type, std::string_view* payload) {
  return strata::DecodeFrame(buffer, reinterpret_cast<uint8_t*>(type), payload);
}

}  // namespace strata::launcher
