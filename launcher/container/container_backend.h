// ContainerBackend: the "container" and "fncall" back ends. The layers,
// idmapped for the node's range, stacked by overlayfs under a btrfs upper
// volume capped at --disk (fncall: read-only, no upper), mounted in a mount
// namespace of the sandbox's own (strata-nsexec, never in the node's); an
// OCI bundle (oci_config.h) whose init is the agent; the runtime (crun)
// runs it in the sandbox's cgroups and namespaces.
#pragma once

#include <optional>
#include <string>

#include "common/subprocess.h"
#include "launcher/sandbox/backend.h"

namespace strata::launcher {

// Adds "container" and "fncall" to the node's table.
Status AddContainerBackends(BackendTable& table);

class ContainerBackend : public Backend {
 public:
  ContainerBackend(NodeConfig node, std::string id, std::string dir, bool fncall);

  bool IdmappedLayers() const override { return true; }
  Status Start(const BackendStart& start) override;
  void Adopt(const nlohmann::json& state) override;
  Status Gone() const override { return OkStatus(); }
  bool Alive(AgentClient& agent, bool paused) override;
  bool Takeable(AgentClient& agent) override;
  Status Pause() override;
  Status Resume() override;
  bool OomKilled(AgentClient& agent) const override;
  const std::optional<UpperVolume>& upper() const override { return upper_; }
  // (The upper is the host's: every process stopped, none writes to it.)
  bool SnapshotsWhilePaused() const override { return true; }
  Result<UpperVolume> CaptureUpper(AgentClient& agent, bool paused, const std::string& name) override;
  Status Destroy(AgentClient* agent) override;
  void Release() override;

 private:
  std::string CgroupDir(const std::string& controller) const;

  const NodeConfig node_;
  const std::string id_, dir_, rootfs_;
  const bool fncall_;
  // The OCI runtime it runs (the spec's, as Sandbox resolved it; after a
  // restart the state's).
  std::string runtime_path_;
  std::optional<UpperVolume> upper_;
  std::optional<Subprocess> runtime_;  // a one-shot launcher's, while it runs
  bool destroyed_ = false;
};

}  // namespace strata::launcher
