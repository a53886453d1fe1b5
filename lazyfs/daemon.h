// The lazyfs node daemon: serves layers lazily through the kernel's EROFS,
// one mount per layer for the whole node, shared by every user.
//
// State directory (beside the socket: /run/strata/lazyfs.sock ->
// /run/strata/lazyfs.d):
//   fuse/             the LayerFs FUSE mount (<digest>.meta, <digest>.blob)
//   layers/<digest>   the layer's EROFS mount (file-backed, over fuse/)
//   daemon.lock       flock held by the running daemon
//   lazyfs.log        the daemon's log when it runs in the background
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "cache/catalog.h"
#include "cache/chunk_cache.h"
#include "common/http_server.h"
#include "common/idmap.h"
#include "common/mount.h"
#include "common/unique_fd.h"
#include "lazyfs/layer_fs.h"

namespace strata::lazyfs {

inline constexpr const char* kDefaultSocket = "/run/strata/lazyfs.sock";
inline constexpr const char* kDefaultCacheDir = "/var/lib/strata/cache";

// "/run/strata/lazyfs.sock" -> "/run/strata/lazyfs.d".
std::string StateDirFor(const std::string& socket_path);

struct DaemonOptions {
  std::string socket_path = kDefaultSocket;
  std::string cache_dir = kDefaultCacheDir;
  uint64_t cache_size = uint64_t{10} << 30;
  Duration fetch_deadline = std::chrono::seconds(60);
  size_t fetch_threads = 32;
  size_t prefetch_threads = 8;
  // How long a layer nobody holds stays mounted (the next sandbox on the
  // same stack skips the mount).
  Duration grace = std::chrono::seconds(30);
  std::string node;  // lease owner; default: the host name
  Duration lease_ttl = std::chrono::hours(1);
  // How store URLs become stores; tests put failing stores behind it.
  std::function<Result<std::shared_ptr<cache::ObjectStore>>(std::string_view url)> open_store = cache::OpenStore;
};

class Daemon {
 public:
  // Takes the state directory's lock, removes mounts a dead daemon left
  // there, opens the cache, mounts the FUSE filesystem, starts the API.
  static Result<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  // Unmounts everything it mounted (detaching what is busy).
  ~Daemon();

  // Blocks until Stop().
  void Wait();
  void Stop();

  // The API, callable directly (tests) or through the socket.
  struct LayerHandle {
    Digest128 digest;
    std::string path;  // the shared, read-only EROFS mount
  };
  // Mounts the layer for `holder` (if not mounted yet) and returns its path;
  // with `idmap`, the path of an idmapped view of the same mount (made once
  // per layer and mapping, for sandboxes in user namespaces).
  Result<LayerHandle> Acquire(std::string_view ref, const std::string& store_url, const std::string& holder,
                              const std::optional<IdMapping>& idmap = std::nullopt);
  Status Release(const Digest128& digest, const std::string& holder);
  // Acquire + a bind mount of the layer at `mountpoint`.
  Result<LayerHandle> MountAt(std::string_view ref, const std::string& store_url, const std::string& mountpoint,
                              bool record);
  Status UnmountAt(const std::string& mountpoint);
  nlohmann::json Stats(const std::string& mountpoint_filter);

 private:
  struct LayerEntry {
    std::mutex mu;  // held while loading or unloading
    std::shared_ptr<ServedLayer> layer;
    std::shared_ptr<cache::Catalog> catalog;
    MountPoint erofs;
    std::string path;
    std::map<std::string, MountPoint> idmapped;  // by IdMapping::ToString()
    std::set<std::string> holders;  // guarded by Daemon::mu_
    std::chrono::steady_clock::time_point unused_since;  // guarded by Daemon::mu_
  };
  struct BindMount {
    Digest128 digest;
    MountPoint mount;
    bool record = false;
  };

  explicit Daemon(const DaemonOptions& options);
  Status Init();
  HttpServer::Response Handle(const HttpServer::Request& request);
  Result<std::shared_ptr<cache::Catalog>> CatalogFor(const std::string& store_url);
  Status Load(LayerEntry& entry, const Digest128& digest);
  Result<std::string> IdmappedView(LayerEntry& entry, const Digest128& digest, const IdMapping& idmap);
  void Unload(LayerEntry& entry, const Digest128& digest);
  void Maintain();

  const DaemonOptions options_;
  const std::string state_dir_;
  UniqueFd lock_fd_;
  std::unique_ptr<cache::ChunkCache> cache_;
  std::unique_ptr<LayerFs> fs_;

  std::mutex mu_;  // guards the maps and holders; never held across I/O
  std::map<Digest128, std::shared_ptr<LayerEntry>> layers_;
  std::map<std::string, std::shared_ptr<cache::Catalog>> catalogs_;  // by store URL
  std::map<std::string, BindMount> binds_;                            // by mountpoint
  std::map<std::string, std::shared_ptr<UniqueFd>> userns_;          // by IdMapping::ToString()

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::thread maintainer_;
  std::unique_ptr<HttpServer> server_;  // last: stopped first
};

}  // namespace strata::lazyfs
