// MicroVmBackend: the "microvm" back end. The layers' files (lazyfs's
// <digest>.meta and .blob, as they are) become read-only disks of a guest
// (MicroVm: QEMU jailed, vmm/) whose init, the agent, stacks them over an
// ext4 upper disk: a ready-made image reflinked into a volume of its own.
// A network is the sandbox's namespace, as a container's, with a tap the
// guest's card uses.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "launcher/sandbox/backend.h"
#include "launcher/vm/microvm.h"

namespace strata::launcher {

// Adds "microvm" to the node's table.
Status AddMicroVmBackend(BackendTable& table);

class MicroVmBackend : public Backend {
 public:
  MicroVmBackend(NodeConfig node, std::string id, std::string dir);

  bool IdmappedLayers() const override { return false; }
  Status Start(const BackendStart& start) override;
  void Adopt(const nlohmann::json& state) override;
  Status Gone() const override;
  bool Alive(AgentClient& agent, bool paused) override;
  Status Pause() override;
  Status Resume() override;
  bool OomKilled(AgentClient& agent) const override;
  const std::optional<UpperVolume>& upper() const override { return upper_; }
  // (The guest's agent freezes its filesystem instead; a paused guest is
  // resumed for that.)
  bool SnapshotsWhilePaused() const override { return false; }
  Result<UpperVolume> CaptureUpper(AgentClient& agent, bool paused, const std::string& name) override;
  Status Destroy(AgentClient* agent) override;
  void Release() override;

 private:
  const NodeConfig node_;
  const std::string id_, dir_;
  std::optional<UpperVolume> upper_;  // holds the upper disk and the console log
  std::unique_ptr<MicroVm> vm_;
  bool adopted_ = false;
  bool destroyed_ = false;
};

}  // namespace strata::launcher
