// The lazyfs node daemon: serves layers lazily, one mount per layer and mode
// for the whole node, shared by every user. Kernel mode (the default): the
// kernel's EROFS reads the layer's metadata image and blob from LayerFs.
// Fuse mode: TreeFs serves the tree itself with strata's EROFS reader, for
// hosts whose kernel cannot mount EROFS from a file. Both read through the
// one chunk cache, with the same stats, access recording and prefetch.
//
// Crash safety: run by the supervisor (supervisor.h), the daemon keeps what
// a successor needs in the state directory as it goes — a journal of the
// layers served, their holders, idmapped views and bind mounts, appended
// under the lock that changes them; each layer's manifest; each layer's
// LayerRecord — and hands the supervisor its FUSE descriptors. A successor
// replays the journal, maps the records and takes every mount over. Layers
// unloaded while still busy (a detached mount) are not carried over: their
// inodes answer ENOENT after a restart.
//
// State directory (beside the socket: /run/strata/lazyfs.sock ->
// /run/strata/lazyfs.d):
//   fuse/             the LayerFs FUSE mount (<digest>.meta, <digest>.blob)
//   layers/<digest>   the layer's EROFS mount (file-backed, over fuse/)
//   trees/<digest>    the layer's TreeFs mount (fuse mode)
//   state/journal     the journal (JSON lines; rewritten when it grows)
//   state/<digest>.manifest, state/<digest>-<mode>.record
//   daemon.lock       flock held by the running daemon (the supervisor)
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
#include "common/control_socket.h"
#include "common/idmap.h"
#include "common/mount.h"
#include "common/unique_fd.h"
#include "lazyfs/layer_fs.h"
#include "lazyfs/supervisor.h"
#include "lazyfs/tree_fs.h"

namespace strata::lazyfs {

inline constexpr const char* kDefaultSocket = "/run/strata/lazyfs.sock";
inline constexpr const char* kDefaultCacheDir = "/var/lib/strata/cache";

// "/run/strata/lazyfs.sock" -> "/run/strata/lazyfs.d".
std::string StateDirFor(const std::string& socket_path);

// How a layer's tree reaches the kernel (see above).
enum class MountMode { kKernel, kFuse };
// "kernel", "fuse".
std::string_view MountModeName(MountMode mode);
// Accepts the names above; "" is kernel mode.
Result<MountMode> ParseMountMode(std::string_view name);

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
  // Kernel mode: how blob pages are kept out of a second page cache. false:
  // LayerFs opens the blob with FOPEN_DIRECT_IO; true: EROFS is mounted with
  // `directio` and reads the blob with direct I/O itself.
  bool erofs_directio = false;
  // The serving process's end of the supervisor link (`lazyfs serve
  // --supervisor-fd N`); -1: no supervisor (tests, `serve` by hand): the
  // daemon takes the lock and the socket itself and nothing outlives it.
  int supervisor_fd = -1;
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

  // Blocks until Stop() or Handover(); true for a handover.
  bool Wait();
  void Stop();
  // The serving process is being replaced: it stops taking requests and
  // exits without unmounting anything (the caller _exits kExitHandover).
  void Handover();
  // After a handover: waits for the requests being answered (new ones
  // wait in the socket's backlog for the successor).
  void DrainForHandover();

  // The API, callable directly (tests) or through the socket.
  struct LayerHandle {
    Digest128 digest;
    std::string path;  // the shared, read-only mount (EROFS, or TreeFs in fuse mode)
    MountMode mode = MountMode::kKernel;
  };
  // Mounts the layer in `mode` for `holder` (if not mounted so yet) and
  // returns its path; with `idmap`, the path of an idmapped view of the same
  // mount (made once per layer and mapping, for sandboxes in user
  // namespaces; kernel mode only: libfuse 3.14 cannot allow idmapped FUSE
  // mounts). One layer may be mounted in both modes at once.
  Result<LayerHandle> Acquire(std::string_view ref, const std::string& store_url, const std::string& holder,
                              const std::optional<IdMapping>& idmap = std::nullopt,
                              MountMode mode = MountMode::kKernel);
  // Drops `holder`'s hold on the layer (in whichever mode it holds it).
  Status Release(const Digest128& digest, const std::string& holder);
  // Acquire + a bind mount of the layer at `mountpoint`.
  Result<LayerHandle> MountAt(std::string_view ref, const std::string& store_url, const std::string& mountpoint,
                              bool record, MountMode mode = MountMode::kKernel);
  Status UnmountAt(const std::string& mountpoint);
  nlohmann::json Stats(const std::string& mountpoint_filter);

 private:
  using LayerKey = std::pair<Digest128, MountMode>;
  struct LayerEntry {
    std::mutex mu;  // held while loading or unloading
    std::shared_ptr<ServedLayer> layer;
    std::shared_ptr<cache::Catalog> catalog;
    std::string store_url;
    MountPoint erofs;              // kernel mode
    std::unique_ptr<TreeFs> tree;  // fuse mode
    std::string path;
    std::map<std::string, MountPoint> idmapped;  // by IdMapping::ToString()
    std::set<std::string> holders;  // guarded by Daemon::mu_
    // What the journal has of it (guarded by Daemon::mu_): loaded, and the
    // idmapped views made (IdMapping strings).
    bool journaled = false;
    std::set<std::string> views;
    std::chrono::steady_clock::time_point unused_since;  // guarded by Daemon::mu_
  };
  struct BindMount {
    LayerKey key;
    MountPoint mount;
    bool record = false;
  };

  explicit Daemon(const DaemonOptions& options);
  Status Init();
  // Takes over what a dead serving process left (see above).
  Status Restore(std::map<std::string, SupervisorLink::Kept>& kept);
  void RemoveStaleMounts(const std::set<std::string>& live);
  // The journal: one event per change, appended with mu_ held.
  void JournalLocked(const nlohmann::json& event);
  std::vector<nlohmann::json> SnapshotLocked() const;
  Status RewriteJournalLocked();
  std::string RecordPath(const LayerKey& key) const;
  std::string ManifestPath(const Digest128& digest) const;
  Result<std::shared_ptr<ServedLayer>> MakeLayer(const LayerKey& key, cache::Manifest manifest,
                                                 const std::shared_ptr<cache::Catalog>& catalog, bool reuse);
  void KeepFuse(const std::string& name, const FuseMount& fuse);
  nlohmann::json SupervisorInfo() const;
  Result<nlohmann::json> Handle(const ControlRequest& request);
  Result<std::shared_ptr<cache::Catalog>> CatalogFor(const std::string& store_url);
  Status Load(LayerEntry& entry, const LayerKey& key);
  Result<std::string> IdmappedView(LayerEntry& entry, const Digest128& digest, const IdMapping& idmap);
  void Unload(LayerEntry& entry, const LayerKey& key);
  // Drops the node's lease on the layer, unless its other mode is loaded.
  void DropLease(LayerEntry& entry, const LayerKey& key);
  void Maintain();

  const DaemonOptions options_;
  const std::string state_dir_;
  UniqueFd lock_fd_;
  std::unique_ptr<SupervisorLink> link_;
  // Set once Init succeeded: only then may the destructor unmount and
  // remove state (one that failed to start must leave its predecessor's
  // mounts and state for the next try, or for the daemon holding the lock).
  bool owns_state_ = false;
  UniqueFd journal_;           // guarded by mu_
  size_t journal_events_ = 0;  // guarded by mu_
  std::unique_ptr<cache::ChunkCache> cache_;
  std::unique_ptr<LayerFs> fs_;

  std::mutex mu_;  // guards the maps and holders; never held across I/O
  std::map<LayerKey, std::shared_ptr<LayerEntry>> layers_;
  std::map<std::string, std::shared_ptr<cache::Catalog>> catalogs_;  // by store URL
  std::map<std::string, BindMount> binds_;                            // by mountpoint
  std::map<std::string, std::shared_ptr<UniqueFd>> userns_;          // by IdMapping::ToString()

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  bool handover_ = false;
  std::thread maintainer_;
  std::unique_ptr<ControlServer> server_;  // last: stopped first
};

}  // namespace strata::lazyfs
