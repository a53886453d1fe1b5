// The lazyfs system tests' fixture: a store directory behind a FaultyStore,
// a daemon started on demand, layers built and published, and a check that
// no mount outlives a test.
#pragma once

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cache/catalog.h"
#include "common/mount.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "lazyfs/daemon.h"
#include "tests/testing/faulty_store.h"
#include "tests/testing/test_util.h"

namespace strata::lazyfs {

using namespace std::chrono_literals;

// No lazyfs-made mount may outlive a test, pass or fail (TearDown checks).
class LazyfsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root: FUSE and EROFS mounts";
    if (::access("/dev/fuse", R_OK | W_OK) != 0) GTEST_SKIP() << "needs /dev/fuse";
    store_url_ = "file://" + dir_.Sub("store");
    auto inner = cache::OpenStore(store_url_);
    ASSERT_TRUE(inner.ok());
    inner_ = *inner;
    store_ = std::make_shared<testing::FaultyStore>(inner_);
    catalog_ = std::make_unique<cache::Catalog>(inner_);
  }

  void TearDown() override {
    daemon_.reset();
    for (const auto& mp : MountsBelow(dir_.path())) {
      ADD_FAILURE() << "mount left behind: " << mp;
      ::umount2(mp.c_str(), MNT_DETACH);
    }
  }

  DaemonOptions Options() {
    DaemonOptions o;
    o.socket_path = dir_.Sub("lazyfs.sock");
    o.cache_dir = dir_.Sub("cache");
    o.grace = 0s;
    o.node = "test-node";
    o.open_store = [this](std::string_view) -> Result<std::shared_ptr<cache::ObjectStore>> { return std::shared_ptr<cache::ObjectStore>(store_); };
    return o;
  }

  void StartDaemon(DaemonOptions o) {
    auto d = Daemon::Start(o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    daemon_ = std::move(*d);
  }

  // Builds `src` and publishes it as NAME:1; returns the built layer.
  layerctl::BuiltLayer Publish(const std::string& src, const std::string& name) {
    auto built = layerctl::BuildLayer({.source = src, .output_dir = dir_.Sub("build-" + name), .name = name});
    EXPECT_TRUE(built.ok()) << built.status().ToString();
    EXPECT_OK(layerctl::Push(*built, *catalog_, cache::LayerRef{name, "1"}).status());
    return *built;
  }

  std::string Tool() const { return testing::TestBinaryDir() + "/../../lazyfs/lazyfs"; }

  TempDir dir_ = testing::MakeTempDir();
  std::string store_url_;
  std::shared_ptr<cache::ObjectStore> inner_;
  std::shared_ptr<testing::FaultyStore> store_;
  std::unique_ptr<cache::Catalog> catalog_;
  std::unique_ptr<Daemon> daemon_;
};

}  // namespace strata::lazyfs
