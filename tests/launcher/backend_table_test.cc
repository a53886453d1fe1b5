// The node's table of back ends: what each kind says of itself (generic
// code asks these instead of comparing names), how a name is chosen and
// refused, and that a sandbox is made by its kind's entry alone.
#include "launcher/backends/node_backends.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "launcher/sandbox/sandbox.h"
#include "launcher/vm/microvm.h"
#include "launcher/container/oci_config.h"
#include "tests/testing/test_util.h"

namespace strata::launcher {
namespace {

SandboxSpec SpecOf(const std::string& backend, uint64_t memory) {
  SandboxSpec spec;
  spec.backend = backend;
  spec.limits.memory = memory;
  return spec;
}

TEST(BackendTableTest, TheNodeOffersEachBackEndOnceInTheApisOrder) {
  auto table = NodeBackends();
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->Names(), (std::vector<std::string>{"container", "fncall", "microvm"}));
  EXPECT_EQ(NodeBackends().get(), table.get());  // made once
  ASSERT_TRUE(table->Find(kDefaultBackend).ok());
}

TEST(BackendTableTest, KindsSayWhatGenericCodeAsks) {
  auto table = NodeBackends();
  const BackendKind* container = *table->Find("container");
  const BackendKind* fncall = *table->Find("fncall");
  const BackendKind* microvm = *table->Find("microvm");
  // Function calls share one warm sandbox per stack; the others are pooled.
  EXPECT_TRUE(fncall->calls);
  EXPECT_FALSE(container->calls);
  EXPECT_FALSE(microvm->calls);
  EXPECT_TRUE(container->warm_pools);
  EXPECT_TRUE(microvm->warm_pools);
  EXPECT_FALSE(fncall->warm_pools);
  // Only a guest is warmed up by a command, and runs under an accelerator.
  EXPECT_TRUE(microvm->warm_up && microvm->machine);
  EXPECT_FALSE(container->warm_up || container->machine || fncall->warm_up || fncall->machine);
  // Only a guest's captured upper needs opening (its disk image).
  EXPECT_TRUE(microvm->open_upper);
  EXPECT_FALSE(container->open_upper);
  // What a dead launcher's container left is the container kinds' to sweep.
  EXPECT_TRUE(container->sweep && fncall->sweep);
  EXPECT_FALSE(microvm->sweep);
}

TEST(BackendTableTest, MemoryCommitIsTheKinds) {
  NodeConfig node;
  node.backends = NodeBackends();
  const uint64_t gib = uint64_t{1} << 30;
  // A container: its limit and the agent's reserve; none without a limit.
  EXPECT_EQ(MemoryCommit(node, SpecOf("container", gib)), gib + kAgentReserveMemory);
  EXPECT_EQ(MemoryCommit(node, SpecOf("container", 0)), 0u);
  // A function call's memory is its pool's.
  EXPECT_EQ(MemoryCommit(node, SpecOf("fncall", gib)), 0u);
  // A microVM: its guest RAM (the default without --memory) and QEMU's.
  EXPECT_EQ(MemoryCommit(node, SpecOf("microvm", gib)), gib + kVmOverheadCommit);
  EXPECT_EQ(MemoryCommit(node, SpecOf("microvm", 0)), kDefaultVmMemory + kVmOverheadCommit);
  // A name the node does not offer commits nothing (create refuses it).
  EXPECT_EQ(MemoryCommit(node, SpecOf("vm", gib)), 0u);
  node.backends = nullptr;
  EXPECT_EQ(MemoryCommit(node, SpecOf("container", gib)), 0u);
}

TEST(BackendTableTest, AnUnknownNameIsRefusedNamingTheOnesThereAre) {
  auto kind = NodeBackends()->Find("firecracker");
  ASSERT_FALSE(kind.ok());
  EXPECT_EQ(kind.status().code(), EINVAL);
  EXPECT_EQ(kind.status().message(), "backend firecracker: not one of container, fncall, microvm");
}

TEST(BackendTableTest, ANameIsAddedOnceAndNeedsAMaker) {
  BackendTable table;
  auto make = [](const NodeConfig&, const std::string&, const std::string&) -> std::unique_ptr<Backend> { return nullptr; };
  ASSERT_TRUE(table.Add({.name = "one", .make = make}).ok());
  EXPECT_EQ(table.Add({.name = "one", .make = make}).code(), EEXIST);
  EXPECT_EQ(table.Add({.name = "two"}).code(), EINVAL);
  EXPECT_EQ(table.Names(), std::vector<std::string>{"one"});
  // Defaults: available everywhere, commits nothing, no traits.
  const BackendKind* one = *table.Find("one");
  EXPECT_TRUE(one->available(NodeConfig{}).ok());
  EXPECT_EQ(one->memory_commit(SandboxSpec{}), 0u);
  EXPECT_FALSE(one->calls || one->warm_pools || one->warm_up || one->machine);
}

TEST(BackendTableTest, AvailableAsksEachKind) {
  BackendTable table;
  auto make = [](const NodeConfig&, const std::string&, const std::string&) -> std::unique_ptr<Backend> { return nullptr; };
  ASSERT_TRUE(table.Add({.name = "here", .make = make}).ok());
  ASSERT_TRUE(table.Add({.name = "not-here", .make = make, .available = [](const NodeConfig&) {
                           return Error(ENOENT, "no such machine");
                         }}).ok());
  EXPECT_EQ(table.Available(NodeConfig{}), std::vector<std::string>{"here"});
  // The microVM kind needs its guest kernel and jail.
  NodeConfig node;
  node.vm_kernel = "/nonexistent/vmlinux";
  node.jail_binary = "/bin/true";
  EXPECT_EQ(NodeBackends()->Available(node), (std::vector<std::string>{"container", "fncall"}));
}

// What a dead launcher left: the sweep of the kind its state names, and
// every kind's when the state is lost or names none the node knows.
TEST(BackendTableTest, ASweepIsTheNamedKindsOrEveryKinds) {
  std::vector<std::string> swept;
  auto table = std::make_shared<BackendTable>();
  auto make = [](const NodeConfig&, const std::string&, const std::string&) -> std::unique_ptr<Backend> { return nullptr; };
  for (std::string name : {"a", "b"}) {
    ASSERT_TRUE(table->Add({.name = name, .make = make, .sweep = [&swept, name](const NodeConfig&, const std::string& id, const nlohmann::json&) {
                              swept.push_back(name + ":" + id);
                            }}).ok());
  }
  ASSERT_TRUE(table->Add({.name = "c", .make = make}).ok());  // nothing of its own to sweep
  NodeConfig node;
  node.backends = table;
  SweepBackend(node, "sb-1", {{"spec", {{"backend", "b"}}}});
  EXPECT_EQ(swept, std::vector<std::string>{"b:sb-1"});
  swept.clear();
  SweepBackend(node, "sb-2", {{"spec", {{"backend", "c"}}}});
  EXPECT_TRUE(swept.empty());
  for (const nlohmann::json& state : {nlohmann::json(), nlohmann::json::object(), nlohmann::json{{"spec", {{"backend", "gone"}}}}}) {
    swept.clear();
    SweepBackend(node, "sb-3", state);
    EXPECT_EQ(swept, (std::vector<std::string>{"a:sb-3", "b:sb-3"})) << state.dump();
  }
  node.backends = nullptr;
  SweepBackend(node, "sb-4", nlohmann::json());  // (no table: nothing to ask)
}

// A create names its back end only through the table: a name the node
// does not offer fails before anything is made, naming the ones there are.
TEST(BackendTableTest, SandboxCreateChoosesByTheTableAlone) {
  auto dir = testing::MakeTempDir();
  NodeConfig node;
  node.run_dir = dir.path() + "/run";
  node.agent_binary = "/bin/true";
  node.backends = NodeBackends();
  SandboxSpec spec = SpecOf("firecracker", 0);
  auto sb = Sandbox::Create(spec, node);
  ASSERT_FALSE(sb.ok());
  EXPECT_EQ(sb.status().code(), EINVAL);
  EXPECT_NE(sb.status().message().find("not one of container, fncall, microvm"), std::string::npos) << sb.status().ToString();
  // A table of one kind that makes nothing: the sandbox asks it, and only it.
  int made = 0;
  auto table = std::make_shared<BackendTable>();
  ASSERT_TRUE(table->Add({.name = "counted", .make = [&made](const NodeConfig&, const std::string&, const std::string&) {
                            ++made;
                            return std::unique_ptr<Backend>();
                          }}).ok());
  node.backends = table;
  spec.backend = "container";
  sb = Sandbox::Create(spec, node);
  ASSERT_FALSE(sb.ok());
  EXPECT_NE(sb.status().message().find("not one of counted"), std::string::npos) << sb.status().ToString();
  EXPECT_EQ(made, 0);
  node.backends = nullptr;
  sb = Sandbox::Create(spec, node);
  ASSERT_FALSE(sb.ok());
  EXPECT_EQ(sb.status().code(), ENOTSUP);
  // Nothing was left of the three.
  EXPECT_TRUE(!std::filesystem::exists(node.run_dir) || std::filesystem::is_empty(node.run_dir));
}

}  // namespace
}  // namespace strata::launcher
