// Backend: what runs a sandbox's root. Sandbox (sandbox.h) keeps what
// every back end shares — its directory and state.json, the layers it holds
// of lazyfs, its network namespace, the agent client (whose socket,
// <dir>/agent/agent.sock, is the same in all of them: a microVM's relay
// listens there) — and asks its Backend for the rest: the root over the
// layers, the upper volume, the machine that runs the agent, and taking
// them down again.
//
//   ContainerBackend (launcher/container/): overlayfs on the host over the
//     idmapped layers and a btrfs upper volume, an OCI runtime (crun) with
//     the agent as init. "container", and "fncall" (the stack read-only,
//     no upper: a function-call pool's).
//   MicroVmBackend (launcher/vm/): a jailed QEMU whose guest mounts the
//     layers' files itself over an ext4 upper disk (vmm/).
//
// A full-VM back end is a third implementation; the daemon, the API and
// the recovery do not change with it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/log.h"
#include "common/status.h"
#include "launcher/agent_client.h"
#include "launcher/net/node_network.h"
#include "launcher/sandbox/spec.h"
#include "launcher/sandbox/upper_store.h"

namespace strata::launcher {

// What Sandbox hands Backend::Start.
struct BackendStart {
  const SandboxSpec& spec;
  // lazyfs's answer to acquire: per layer, bottom first, its idmapped
  // mount ("path") and its two files ("meta", "blob").
  const nlohmann::json& layers;
  // Connects to <dir>/agent/agent.sock, where the back end's agent answers.
  AgentClient& agent;
  // Gives the sandbox a network of the node's (modes allow and open),
  // recorded in its state at once; Sandbox removes it.
  std::function<Result<SandboxNet>()> attach_network;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // Whether lazyfs mounts the layers idmapped for the node's range (a
  // container's root is the mapped one; a guest reads the files as they are).
  virtual bool IdmappedLayers() const = 0;
  // Makes the root and starts the agent; returns once the agent answers.
  // What it made before a failure is Destroy's to remove.
  virtual Status Start(const BackendStart& start) = 0;
  // Takes over what an earlier launcher's Start made, from the sandbox's
  // state.json; what is gone stays gone (calls fail, Destroy cleans up).
  virtual void Adopt(const nlohmann::json& state) = 0;

  // OK while the machine that runs the agent is there; else an error
  // (EHOSTDOWN) that says it is gone, and why if it can tell.
  virtual Status Gone() const = 0;
  // Whether the sandbox is there and its agent answers (or, paused, would).
  virtual bool Alive(AgentClient& agent, bool paused) = 0;
  // Whether a warm pool may hand out this running sandbox: its agent is
  // there. Alive where the back end has nothing cheaper.
  virtual bool Takeable(AgentClient& agent) { return Alive(agent, false); }
  // Stops every process (or the whole machine) and continues it.
  virtual Status Pause() = 0;
  virtual Status Resume() = 0;
  // Whether an OOM killer killed a command of the sandbox.
  virtual bool OomKilled(AgentClient& agent) const = 0;

  // The writable layer: a volume on the uppers filesystem (none for fncall).
  virtual const std::optional<UpperVolume>& upper() const = 0;
  // Whether CaptureUpper needs the sandbox paused (Sandbox pauses it, as
  // a caller's pause, for as long as it takes).
  virtual bool SnapshotsWhilePaused() const = 0;
  // A read-only snapshot of the upper volume named `name`, taken while no
  // write can be half on disk; `paused` is the sandbox's state, kept.
  virtual Result<UpperVolume> CaptureUpper(AgentClient& agent, bool paused, const std::string& name) = 0;

  // Stops the machine and removes the root, the upper volume and the
  // cgroups; idempotent. Every step is tried; the first error is returned
  // (each is logged). `agent` is null when there is none to ask to stop.
  virtual Status Destroy(AgentClient* agent) = 0;
  // Lets go of everything without removing it (a restarted daemon adopts it).
  virtual void Release() = 0;
};

// The back end named `name` ("container", "fncall", "microvm") of the
// sandbox `id` whose directory is `dir`; EINVAL for another name.
Result<std::unique_ptr<Backend>> MakeBackend(const std::string& name, const NodeConfig& node, const std::string& id,
                                             const std::string& dir);

// Logs how long each step of a sandbox's life took (STRATA_LOG=debug).
class StepTimer {
 public:
  explicit StepTimer(std::string id) : id_(std::move(id)), last_(std::chrono::steady_clock::now()) {}
  void Step(const char* name) {
    auto now = std::chrono::steady_clock::now();
    STRATA_LOG(kDebug) << id_ << ": " << name << " " << std::chrono::duration<double, std::milli>(now - last_).count() << " ms";
    last_ = now;
  }

 private:
  std::string id_;
  std::chrono::steady_clock::time_point last_;
};

// Collects the first error of a sequence of cleanup steps, logging each.
class FirstError {
 public:
  explicit FirstError(std::string what) : what_(std::move(what)) {}
  // Keeps `s` if it is the first error, without logging it (its maker did).
  void Keep(Status s) {
    if (!s.ok() && first_.ok()) first_ = std::move(s);
  }
  void Note(Status s) {
    if (s.ok()) return;
    STRATA_LOG(kWarn) << what_ << ": " << s.ToString();
    if (first_.ok()) first_ = std::move(s);
  }
  Status Take() { return std::move(first_); }

 private:
  std::string what_;
  Status first_;
};

// The sandbox's cgroups (cgroup v1: commands/ below the sandbox's in the
// hierarchies of kCommandControllers, where the caller set a limit there).
inline constexpr const char* kCommandCgroup = "commands";
inline constexpr const char* kCommandControllers[] = {"pids", "memory"};
// Removes the cgroups <parent>/<id> ("relative") in every hierarchy, the
// commands' first: whatever still runs inside is a leftover of the sandbox
// and is killed first.
void RemoveSandboxCgroups(const std::string& relative);

// Merges `changes` into <dir>/state.json (replaced atomically), which
// Sandbox::Adopt and Backend::Adopt read after a restart.
Status MergeSandboxState(const std::string& dir, const nlohmann::json& changes);

// The commands' seccomp program as BPF, compiled once per node and cached
// beside the run directory: what holds a command to the default profile,
// on top of the agent's AgentSeccompProfile() when `agent_filtered` (a
// container's), alone otherwise (a microVM's agent).
Result<std::string> CommandSeccompProgram(const NodeConfig& node, bool agent_filtered);

}  // namespace strata::launcher
