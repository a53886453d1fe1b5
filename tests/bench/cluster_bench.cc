// The in-process half of `scripts/bench cluster` (tests/bench/cluster_bench.py
// runs the cluster and calls this):
//   cluster_bench placement                 decisions/s of the gateway's Placer for 160 and 4 nodes
//   cluster_bench registrations ETCD N S    N simulated node registrations for S seconds: etcd writes/s they cause
//   cluster_bench capacity ETCD THREADS S   etcd's own put rate here: THREADS writers for S seconds
// Each prints one JSON object on stdout.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "launcher/cluster/etcd.h"
#include "launcher/cluster/membership.h"
#include "launcher/cluster/placement.h"
#include "tests/bench/bench_util.h"

namespace strata::bench {
namespace {

using launcher::EtcdClient;
using launcher::NodeRecord;
using nlohmann::json;

NodeRecord FakeNode(int i) {
  NodeRecord r;
  r.name = "node" + std::to_string(i);
  r.url = "https://10.0." + std::to_string(i / 250) + "." + std::to_string(i % 250) + ":7443";
  r.labels = {{"pool", i % 10 == 9 ? "cloud" : "main"}, {"zone", "z" + std::to_string(i % 3)}};
  r.backends = {"container", "fncall"};
  r.accelerator = "none";
  r.slots = 3200;
  r.cpus = 192;
  r.memory = uint64_t{1} << 40;
  r.disk = uint64_t{4} << 40;
  r.sandboxes = 1000 + (i * 37) % 1500;
  r.states = {{"running", r.sandboxes}};
  r.memory_available = uint64_t{400} << 30;
  r.disk_available = uint64_t{2} << 40;
  r.headroom = {{"slots", r.slots - r.sandboxes}, {"memory_available", r.memory_available}};
  r.at_ms = 1;
  return r;
}

double DecisionsPerSecond(int nodes, int threads) {
  std::vector<NodeRecord> records;
  for (int i = 0; i < nodes; ++i) records.push_back(FakeNode(i));
  launcher::Placer placer;
  placer.Update(records, {});
  launcher::PlacementRequest want;
  want.labels = {{"pool", "main"}};
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> done{0};
  std::vector<std::thread> workers;
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      uint64_t n = 0;
      while (!stop) {
        for (int k = 0; k < 256; ++k) {
          auto node = placer.Place(want);
          if (!node.ok()) std::abort();
          placer.Unplace(*node);  // (so the load stays as it was)
        }
        n += 256;
      }
      done += n;
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  stop = true;
  for (auto& w : workers) w.join();
  return static_cast<double>(done) / Seconds(Clock::now() - start);
}

// The store's revision now, at the cost of one write of our own.
int64_t Revision(EtcdClient& etcd) {
  Check(etcd.Put("/strata-bench/rev", "x"));
  auto kv = Check(etcd.Get("/strata-bench/rev"));
  return kv ? kv->mod_revision : 0;
}

void Registrations(const std::string& endpoints, int nodes, int seconds) {
  auto etcd = Check(EtcdClient::Create(endpoints));
  std::vector<std::unique_ptr<launcher::Registrar>> registrars;
  for (int i = 0; i < nodes; ++i) {
    NodeRecord r = FakeNode(i);
    r.name = "bench-" + std::to_string(i);
    registrars.push_back(Check(launcher::Registrar::Start({.endpoints = endpoints, .lease_seconds = 5}, r, [](NodeRecord* rec) {
      rec->sandboxes += 1;  // (the load changes every second, as a busy node's does)
    })));
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));  // (all registered)
  const int64_t r0 = Revision(*etcd);
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  const int64_t r1 = Revision(*etcd);
  const double elapsed = Seconds(Clock::now() - t0);
  const size_t bytes = FakeNode(1).ToJson().dump().size();
  registrars.clear();  // (revokes the leases)
  std::printf("%s\n", json{{"nodes", nodes}, {"writes_per_second", static_cast<double>(r1 - r0 - 1) / elapsed},
                           {"record_bytes", bytes}}.dump().c_str());
}

void Capacity(const std::string& endpoints, int threads, int seconds) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> puts{0}, failures{0};
  std::vector<std::thread> workers;
  const std::string value = FakeNode(1).ToJson().dump();
  const auto start = Clock::now();
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      auto etcd = Check(EtcdClient::Create(endpoints));
      uint64_t n = 0;
      while (!stop) {
        if (etcd->Put("/strata-bench/cap/" + std::to_string(t), value).ok()) ++n;
        else ++failures;
      }
      puts += n;
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop = true;
  for (auto& w : workers) w.join();
  std::printf("%s\n", json{{"threads", threads}, {"puts_per_second", static_cast<double>(puts) / Seconds(Clock::now() - start)},
                           {"failures", failures.load()}}.dump().c_str());
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  using namespace strata::bench;
  return BenchMain([&] {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode == "placement") {
      std::printf("%s\n", nlohmann::json{{"nodes_160_1_thread", DecisionsPerSecond(160, 1)},
                                         {"nodes_160_2_threads", DecisionsPerSecond(160, 2)},
                                         {"nodes_4_1_thread", DecisionsPerSecond(4, 1)}}.dump().c_str());
    } else if (mode == "registrations" && argc == 5) {
      Registrations(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
    } else if (mode == "capacity" && argc == 5) {
      Capacity(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
    } else {
      Check(strata::Error(EINVAL, "usage: cluster_bench placement | registrations ETCD N SECONDS | capacity ETCD THREADS SECONDS"));
    }
    return 0;
  });
}
