// A sandbox's network plumbing: a network namespace (owned by the node's
// user namespace, so the sandbox's root cannot reconfigure it) and one
// veth pair towards the node. Links, addresses and routes are set over
// rtnetlink (libmnl); nothing shells out.
//
// The daemon holds a new namespace by a descriptor only until the
// sandbox's processes (a container's, or QEMU's tap) hold it: no bind
// mount per sandbox in the node's mount table, which every container
// create copies, and nothing of a namespace outlives its users, also
// after a crash (the veth goes with the namespace).
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace strata::launcher {

// A new network namespace, held by the descriptor returned.
Result<UniqueFd> CreateNetns();
// What older daemons made: a namespace bound at `path`. Unmounts and
// removes it; the namespace goes away with its last user. Missing is fine.
Status RemoveNetnsFile(const std::string& path);

struct SandboxLink {
  int netns_fd = -1;
  std::string host_if;     // the node's end, "sx" + the sandbox's hex
  std::string owner;       // its alias: which node made it (the rules' table)
  uint32_t address = 0;    // the sandbox's (a /32 on its eth0)
  uint32_t gateway = 0;    // the node's address every sandbox routes through
};

// The veth pair: `host_if` on the node with a /32 route to the sandbox's
// address; `eth0` in the namespace with the address, a route to the
// gateway, and the default route through it. IPv6 is off on both ends
// (sandboxes have IPv4 only) and loopback is up.
Status CreateSandboxLink(const SandboxLink& link);
// Hands a sandbox's link to a guest (a microVM): in the namespace, eth0
// gives up its address (the guest takes it) and becomes a port of a bridge
// "br0" with a new tap "tap0", so the guest's frames reach the node's end
// of the veth as the namespace's own would; the node's routes and rules,
// which know the address only, are unchanged. Returns the tap's descriptor
// for the hypervisor: the tap goes away with its last descriptor.
Result<UniqueFd> OpenGuestTap(int netns_fd, uint32_t address);

// Deletes the node's end (the namespace's goes with it). Missing is fine.
Status DeleteLink(const std::string& name);
// Whether the node has an interface of that name.
bool LinkExists(const std::string& name);
// The interface's alias ("" when none).
std::string LinkAlias(const std::string& name);

// The gateway address (/32) on the node's loopback: a local address that
// every sandbox's veth reaches (and answers ARP for), there whether or not
// any sandbox exists, so the DNS proxy can listen on it. Idempotent.
Status EnsureGatewayAddress(uint32_t gateway);

}  // namespace strata::launcher
