// The lazyfs daemon: layer lifetimes, mounts, leases and the control API.
#include "lazyfs/daemon.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <fstream>
#include <sstream>

#include "cache/http_client.h"
#include "common/fs.h"
#include "common/log.h"
#include "common/mount.h"
#include "common/strings.h"
#include "lazyfs/client.h"

namespace strata::lazyfs {

using nlohmann::json;

std::string StateDirFor(const std::string& socket_path) {
  std::string base = socket_path;
  if (base.ends_with(".sock")) base.resize(base.size() - 5);
  return base + ".d";
}

std::string_view MountModeName(MountMode mode) { return mode == MountMode::kFuse ? "fuse" : "kernel"; }

Result<MountMode> ParseMountMode(std::string_view name) {
  if (name.empty() || name == "kernel") return MountMode::kKernel;
  if (name == "fuse") return MountMode::kFuse;
  return Error(EINVAL, StrCat("mount mode ", Quote(name), ": expected \"kernel\" or \"fuse\""));
}

namespace {

std::string HostName() {
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  std::string out;
  for (char c : std::string(host)) out.push_back(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' ? c : '_');
  return out.empty() || out[0] == '.' || out[0] == '-' ? "node" : out;
}

json StatsJson(const LayerStats& s) {
  return {{"image_bytes", s.image_bytes},       {"meta_bytes", s.meta_bytes},
          {"blob_bytes", s.blob_bytes},         {"stored_bytes", s.stored_bytes},
          {"meta_bytes_fetched", s.meta_bytes_fetched},
          {"bytes_fetched", s.bytes_fetched},   {"chunk_bytes_fetched", s.chunk_bytes_fetched},
          {"bytes_from_cache", s.bytes_from_cache},
          {"chunks_fetched", s.chunks_fetched}, {"readahead_fetches", s.readahead_fetches},
          {"list_fetches", s.list_fetches},     {"extents_touched", s.extents_touched},
          {"bytes_touched", s.bytes_touched},   {"blob_fetched_percent", s.blob_fetched_percent},
          {"fetch_p50_ms", s.fetch_p50_ms},     {"fetch_p99_ms", s.fetch_p99_ms},
          {"read_errors", s.read_errors}};
}

}  // namespace

Daemon::Daemon(const DaemonOptions& options) : options_(options), state_dir_(StateDirFor(options.socket_path)) {}

Result<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  std::unique_ptr<Daemon> d(new Daemon(options));
  Status s = d->Init();
  if (!s.ok()) return s.Annotate("start lazyfs daemon on " + options.socket_path);
  return d;
}

namespace {
json InitMeta(const FuseInit& init) {
  auto hex = [](const std::string& b) {
    return HexEncode(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(b.data()), b.size()));
  };
  return {{"init_request", hex(init.request)}, {"init_reply", hex(init.reply)}};
}

FuseInit InitFromMeta(const json& meta) {
  auto bytes = [&](const char* key) {
    auto v = HexDecode(meta.value(key, std::string()));
    return v ? std::string(v->begin(), v->end()) : std::string();
  };
  return {bytes("init_request"), bytes("init_reply")};
}

std::string TreeName(const Digest128& digest) { return "tree:" + digest.Hex(); }

// Removes the files of `dir` that `keep` does not want.
void RemoveFilesBut(const std::string& dir, const std::function<bool(const std::string&)>& keep) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    if (!keep(e.path().filename().string())) ::unlink(e.path().c_str());
  }
}
}  // namespace

Status Daemon::Init() {
  STRATA_RETURN_IF_ERROR(MakeDirs(state_dir_ + "/layers", 0700));
  STRATA_RETURN_IF_ERROR(MakeDirs(state_dir_ + "/trees", 0700));
  STRATA_RETURN_IF_ERROR(MakeDirs(state_dir_ + "/state", 0700));
  std::map<std::string, SupervisorLink::Kept> kept;
  if (options_.supervisor_fd >= 0) {
    // The supervisor holds the lock and the socket; it hands over the
    // descriptors a predecessor left.
    STRATA_ASSIGN_OR_RETURN(link_, SupervisorLink::Join(options_.supervisor_fd));
    kept.swap(link_->kept());
  } else {
    STRATA_ASSIGN_OR_RETURN(lock_fd_, OpenFile(state_dir_ + "/daemon.lock", O_RDWR | O_CREAT, 0600));
    if (::flock(lock_fd_.get(), LOCK_EX | LOCK_NB) != 0) {
      return Error(EEXIST, StrCat("another lazyfs daemon holds ", state_dir_, "/daemon.lock"));
    }
  }
  cache::ChunkCacheOptions cache_options;
  cache_options.dir = options_.cache_dir;
  cache_options.capacity_bytes = options_.cache_size;
  cache_options.fetch_deadline = options_.fetch_deadline;
  cache_options.fetch_threads = options_.fetch_threads;
  cache_options.max_background = options_.prefetch_threads;
  STRATA_ASSIGN_OR_RETURN(cache_, cache::ChunkCache::Open(cache_options));
  const bool restore = kept.count("fuse") > 0;
  if (restore) {
    const auto start = std::chrono::steady_clock::now();
    STRATA_RETURN_IF_ERROR(Restore(kept).Annotate("take over from the previous serving process"));
    STRATA_LOG(kInfo) << "lazyfs: took over " << layers_.size() << " layers and " << binds_.size() << " mounts in "
                      << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count()
                      << " ms";
  } else {
    // A daemon that died without a supervisor left mounts that only answer
    // errors now, and state nobody can take over.
    RemoveStaleMounts({});
    RemoveFilesBut(state_dir_ + "/state", [](const std::string&) { return false; });
    STRATA_ASSIGN_OR_RETURN(fs_, LayerFs::Mount(state_dir_ + "/fuse", !options_.erofs_directio));
    KeepFuse("fuse", fs_->fuse());
  }
  for (auto& [name, k] : kept) {  // descriptors of mounts nobody serves now
    if (name != "control" && link_) link_->Drop(name).IgnoreError();
  }
  {
    std::lock_guard lock(mu_);
    STRATA_ASSIGN_OR_RETURN(journal_, OpenFile(state_dir_ + "/state/journal", O_WRONLY | O_CREAT | O_APPEND, 0600));
    if (restore) STRATA_RETURN_IF_ERROR(RewriteJournalLocked());
  }
  auto handler = [this](const ControlRequest& r) { return Handle(r); };
  if (link_) {
    auto control = kept.find("control");
    if (control == kept.end()) return Error(EPROTO, "the supervisor handed over no control socket");
    STRATA_ASSIGN_OR_RETURN(server_, ControlServer::Serve(std::move(control->second.fd), options_.socket_path, handler,
                                                          kControlProtocol));
  } else {
    STRATA_RETURN_IF_ERROR(MakeDirs(Dirname(options_.socket_path)));
    STRATA_ASSIGN_OR_RETURN(server_, ControlServer::ListenUnix(options_.socket_path, 0600, handler, kControlProtocol));
  }
  owns_state_ = true;
  maintainer_ = std::thread([this] { Maintain(); });
  if (link_) STRATA_RETURN_IF_ERROR(link_->Ready());
  return OkStatus();
}

void Daemon::RemoveStaleMounts(const std::set<std::string>& live) {
  for (const auto& mp : MountsBelow(state_dir_)) {  // deepest first
    if (live.count(mp)) continue;
    STRATA_LOG(kWarn) << "lazyfs: removing stale mount " << mp << " left by a previous daemon";
    ::umount2(mp.c_str(), MNT_DETACH);
  }
}

void Daemon::KeepFuse(const std::string& name, const FuseMount& fuse) {
  if (!link_) return;
  Status s = link_->Keep(name, fuse.fd(), InitMeta(fuse.init()));
  if (!s.ok()) STRATA_LOG(kError) << "lazyfs: " << name << ": " << s.ToString() << " (a crash would cut this mount)";
}

std::string Daemon::RecordPath(const LayerKey& key) const {
  return StrCat(state_dir_, "/state/", key.first.Hex(), "-", MountModeName(key.second), ".record");
}
std::string Daemon::ManifestPath(const Digest128& digest) const {
  return StrCat(state_dir_, "/state/", digest.Hex(), ".manifest");
}

Result<std::shared_ptr<ServedLayer>> Daemon::MakeLayer(const LayerKey& key, cache::Manifest manifest,
                                                       const std::shared_ptr<cache::Catalog>& catalog, bool reuse) {
  STRATA_ASSIGN_OR_RETURN(auto record, LayerRecord::Open(RecordPath(key), key.first,
                                                         static_cast<uint32_t>(manifest.extents.size()), reuse));
  auto layer = std::make_shared<ServedLayer>(key.first, std::move(manifest), catalog->shared_store(), *cache_,
                                             std::move(record));
  STRATA_RETURN_IF_ERROR(layer->Load());
  return layer;
}

void Daemon::JournalLocked(const json& event) {
  if (!journal_) return;
  std::string line = event.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  if (::write(journal_.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    STRATA_LOG(kError) << "lazyfs: journal: " << std::strerror(errno) << " (a crash would lose this change)";
  }
  // Rewritten from memory once mostly history: appends stay O(1) amortized.
  if (++journal_events_ > 4096 && journal_events_ > 4 * (layers_.size() + binds_.size() + 1)) {
    Status s = RewriteJournalLocked();
    if (!s.ok()) STRATA_LOG(kError) << "lazyfs: " << s.ToString();
  }
}

std::vector<json> Daemon::SnapshotLocked() const {
  std::vector<json> events;
  for (const auto& [key, entry] : layers_) {
    if (!entry->journaled) continue;  // loading: its events come when it is loaded
    const std::string d = key.first.Hex(), m(MountModeName(key.second));
    events.push_back({{"e", "layer"}, {"d", d}, {"m", m}, {"s", entry->store_url}});
    for (const auto& h : entry->holders) events.push_back({{"e", "hold"}, {"d", d}, {"m", m}, {"h", h}});
    for (const auto& view : entry->views) events.push_back({{"e", "view"}, {"d", d}, {"m", m}, {"i", view}});
  }
  for (const auto& [mp, bind] : binds_) {
    events.push_back({{"e", "bind"}, {"p", mp}, {"d", bind.key.first.Hex()}, {"m", MountModeName(bind.key.second)}, {"r", bind.record}});
  }
  return events;
}

Status Daemon::RewriteJournalLocked() {
  std::string text;
  for (const auto& e : SnapshotLocked()) text += e.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  const std::string path = state_dir_ + "/state/journal";
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(path, text, /*durable=*/false, 0600).Annotate("rewrite the journal"));
  STRATA_ASSIGN_OR_RETURN(journal_, OpenFile(path, O_WRONLY | O_APPEND, 0600));
  journal_events_ = 0;
  return OkStatus();
}

Status Daemon::Restore(std::map<std::string, SupervisorLink::Kept>& kept) {
  // Replay the journal: what was loaded, held, viewed and bound.
  struct Restored {
    std::string store;
    std::set<std::string> holders, views;
  };
  std::map<LayerKey, Restored> layers;
  std::map<std::string, BindMount> binds;
  auto text = ReadFileToString(state_dir_ + "/state/journal");
  std::istringstream lines(text.ok() ? *text : std::string());
  std::string line;
  while (std::getline(lines, line)) {
    json e = json::parse(line, nullptr, false);
    if (!e.is_object()) continue;  // the torn last line of a crash
    auto digest = Digest128::FromHex(e.value("d", std::string()));
    auto mode = ParseMountMode(e.value("m", std::string()));
    const std::string ev = e.value("e", std::string());
    if (ev == "unbind") {
      binds.erase(e.value("p", std::string()));
      continue;
    }
    if (!digest || !mode.ok()) continue;
    const LayerKey key{*digest, *mode};
    if (ev == "layer") {
      layers[key] = Restored{e.value("s", std::string()), {}, {}};
    } else if (ev == "unload") {
      layers.erase(key);
    } else if (ev == "hold" && layers.count(key)) {
      layers[key].holders.insert(e.value("h", std::string()));
    } else if (ev == "release" && layers.count(key)) {
      layers[key].holders.erase(e.value("h", std::string()));
    } else if (ev == "view" && layers.count(key)) {
      layers[key].views.insert(e.value("i", std::string()));
    } else if (ev == "bind") {
      binds[e.value("p", std::string())] = BindMount{key, MountPoint(), e.value("r", false)};
    }
  }
  // The layers, with their records; kernel mode's all before LayerFs serves.
  std::map<LayerKey, std::shared_ptr<ServedLayer>> served;
  std::vector<std::shared_ptr<ServedLayer>> kernel_layers;
  for (const auto& [key, r] : layers) {
    const std::string hex = key.first.Hex();
    auto catalog = CatalogFor(r.store);
    Result<cache::Manifest> manifest = Error(ENOENT, "no manifest");
    if (auto saved = ReadFileToString(ManifestPath(key.first)); saved.ok()) {
      // Canonical JSON, so its bytes hash to the digest (no serializing again).
      manifest = HashBytes(*saved) == key.first ? cache::Manifest::FromJson(*saved)
                                                : Error(EBADMSG, "saved manifest does not hash to its name");
    }
    if (!manifest.ok() && catalog.ok()) manifest = (*catalog)->GetManifest(key.first);
    Result<std::shared_ptr<ServedLayer>> layer =
        !catalog.ok() ? Result<std::shared_ptr<ServedLayer>>(catalog.status())
        : !manifest.ok() ? Result<std::shared_ptr<ServedLayer>>(manifest.status())
                         : MakeLayer(key, std::move(*manifest), *catalog, /*reuse=*/true);
    if (!layer.ok()) {
      STRATA_LOG(kError) << "lazyfs: layer " << hex << " (" << MountModeName(key.second)
                         << " mode) cannot be taken over; its mounts go: " << layer.status().ToString();
      continue;
    }
    served[key] = *layer;
    if (key.second == MountMode::kKernel) kernel_layers.push_back(*layer);
  }
  auto fuse = kept.find("fuse");
  STRATA_ASSIGN_OR_RETURN(fs_, LayerFs::Adopt(state_dir_ + "/fuse", !options_.erofs_directio, std::move(fuse->second.fd),
                                              InitFromMeta(fuse->second.meta), kernel_layers));
  kept.erase(fuse);
  KeepFuse("fuse", fs_->fuse());  // the same connection; keeps its INIT current
  std::set<std::string> live = {state_dir_ + "/fuse"};
  for (auto& [key, layer] : served) {
    const Restored& r = layers[key];
    auto entry = std::make_shared<LayerEntry>();
    entry->catalog = *CatalogFor(r.store);
    entry->store_url = cache::DefaultStoreUrl(r.store);
    entry->holders = r.holders;
    entry->journaled = true;
    entry->unused_since = std::chrono::steady_clock::now();
    const std::string hex = key.first.Hex();
    if (key.second == MountMode::kFuse) {
      entry->path = StrCat(state_dir_, "/trees/", hex);
      auto tree_fd = kept.find(TreeName(key.first));
      if (tree_fd == kept.end() || !IsMountPoint(entry->path)) {
        STRATA_LOG(kError) << "lazyfs: layer " << hex << " (fuse mode): no connection to take over";
        continue;
      }
      auto tree = TreeFs::Adopt(layer, entry->path, std::move(tree_fd->second.fd), InitFromMeta(tree_fd->second.meta));
      kept.erase(tree_fd);
      if (!tree.ok()) {
        STRATA_LOG(kError) << "lazyfs: " << tree.status().ToString();
        if (link_) link_->Drop(TreeName(key.first)).IgnoreError();  // the connection is cut; nobody keeps it
        continue;
      }
      entry->tree = std::move(*tree);
      KeepFuse(TreeName(key.first), entry->tree->fuse());
    } else {
      entry->path = StrCat(state_dir_, "/layers/", hex);
      if (!IsMountPoint(entry->path)) {
        STRATA_LOG(kError) << "lazyfs: layer " << hex << ": its EROFS mount is gone";
        fs_->Remove(key.first);
        continue;
      }
      entry->erofs = MountPoint::Adopt(entry->path);
      for (const auto& view : r.views) {
        auto idmap = IdMapping::Parse(view);
        if (!idmap.ok()) continue;
        std::string path = StrCat(state_dir_, "/layers/", hex, "@", idmap->host, "-", idmap->size);
        if (!IsMountPoint(path)) continue;
        entry->idmapped.emplace(view, MountPoint::Adopt(path));
        entry->views.insert(view);
        live.insert(path);
      }
    }
    entry->layer = layer;
    live.insert(entry->path);
    layers_[key] = entry;
  }
  for (auto& [mp, bind] : binds) {
    if (!IsMountPoint(mp)) continue;
    if (!layers_.count(bind.key)) {  // lost with its layer: it would only answer errors
      STRATA_LOG(kWarn) << "lazyfs: removing " << mp << ": its layer was not taken over";
      ::umount2(mp.c_str(), MNT_DETACH);
      continue;
    }
    bind.mount = MountPoint::Adopt(mp);
    binds_.emplace(mp, std::move(bind));
  }
  // A crash between an unbind and its release leaves a holder without mount.
  for (auto& [key, entry] : layers_) {
    std::erase_if(entry->holders, [&](const std::string& h) { return h.starts_with("mount:") && !binds_.count(h.substr(6)); });
  }
  RemoveStaleMounts(live);
  // Records and manifests of layers not carried over.
  std::set<std::string> used = {"journal"};
  for (const auto& [key, entry] : layers_) {
    used.insert(Basename(RecordPath(key)));
    used.insert(Basename(ManifestPath(key.first)));
  }
  RemoveFilesBut(state_dir_ + "/state", [&](const std::string& name) { return used.count(name) > 0; });
  return OkStatus();
}

Daemon::~Daemon() {
  server_.reset();  // no new requests
  Stop();
  if (maintainer_.joinable()) maintainer_.join();
  if (!owns_state_ && link_) {
    // Init failed under a supervisor: the mounts and state stay for the
    // next serving process (the connections live on in the supervisor's
    // copies; our own half-made mounts are among the stale ones it removes).
    std::lock_guard lock(mu_);
    for (auto& [mp, bind] : binds_) bind.mount.Release();
    for (auto& [key, entry] : layers_) {
      entry->erofs.Release();
      for (auto& [k, view] : entry->idmapped) view.Release();
      (void)entry->tree.release();  // its loop dies with the process
    }
    (void)fs_.release();
    return;
  }
  std::map<std::string, BindMount> binds;
  std::map<LayerKey, std::shared_ptr<LayerEntry>> layers;
  {
    std::lock_guard lock(mu_);
    binds.swap(binds_);
    layers.swap(layers_);
    journal_.reset();
  }
  for (auto& [mp, bind] : binds) {
    Status s = bind.mount.Unmount();
    if (!s.ok()) STRATA_LOG(kWarn) << "lazyfs: " << s.ToString();
  }
  for (auto& [key, entry] : layers) {
    std::lock_guard lock(entry->mu);
    Unload(*entry, key);
  }
  fs_.reset();
  if (!owns_state_) return;  // (no supervisor: a daemon that never started; the state is not its own)
  // Everything is unmounted: nothing to take over.
  RemoveFilesBut(state_dir_ + "/state", [](const std::string&) { return false; });
  if (link_) link_->Drop("fuse").IgnoreError();
}

bool Daemon::Wait() {
  std::unique_lock lock(stop_mu_);
  stop_cv_.wait(lock, [&] { return stopping_; });
  return handover_;
}

void Daemon::Handover() {
  {
    std::lock_guard lock(stop_mu_);
    stopping_ = true;
    handover_ = true;
  }
  stop_cv_.notify_all();
}

void Daemon::Stop() {
  {
    std::lock_guard lock(stop_mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
}

Result<std::shared_ptr<cache::Catalog>> Daemon::CatalogFor(const std::string& store_url) {
  std::string url = cache::DefaultStoreUrl(store_url);
  {
    std::lock_guard lock(mu_);
    if (auto it = catalogs_.find(url); it != catalogs_.end()) return it->second;
  }
  STRATA_ASSIGN_OR_RETURN(auto store, options_.open_store(url));
  auto catalog = std::make_shared<cache::Catalog>(store);
  std::lock_guard lock(mu_);
  return catalogs_.emplace(url, catalog).first->second;
}

Status Daemon::Load(LayerEntry& entry, const LayerKey& key) {
  const auto& [digest, mode] = key;
  const auto start = std::chrono::steady_clock::now();
  // Two store round trips go beside the load rather than after it (one
  // after the other they were a third of a cold mount over HTTP): the
  // recorded access list, fetched with the manifest; and the node's lease
  // on the layer, written once the manifest shows the layer exists. Both
  // are in before the mount is answered. (async|deferred: where no thread
  // can be made, each runs when its result is asked for. The functions are
  // passed as lvalues: libstdc++ builds that fallback from the same
  // argument, which an rvalue would have left moved from.)
  constexpr auto kBeside = std::launch::async | std::launch::deferred;
  const auto get_access = [catalog = entry.catalog, digest] { return catalog->GetAccessList(digest); };
  auto access = std::async(kBeside, get_access);
  std::string text;
  STRATA_ASSIGN_OR_RETURN(cache::Manifest manifest, entry.catalog->GetManifest(digest, &text));
  const cache::Lease lease{options_.node.empty() ? HostName() : options_.node, digest,
                           static_cast<int64_t>(::time(nullptr)) +
                               std::chrono::duration_cast<std::chrono::seconds>(options_.lease_ttl).count()};
  const auto put_lease = [catalog = entry.catalog, lease] { return catalog->PutLease(lease); };
  auto leased = std::async(kBeside, put_lease);

  auto serve = [&]() -> Status {
    // A successor takes the layer over without asking the store. (The text
    // as stored, canonical and checked: serializing it again took 30 ms of a
    // 100 ms cold mount of a 10,000-extent layer.)
    STRATA_RETURN_IF_ERROR(WriteFileAtomic(ManifestPath(digest), text, /*durable=*/false, 0600));
    STRATA_ASSIGN_OR_RETURN(auto layer, MakeLayer(key, std::move(manifest), entry.catalog, /*reuse=*/false));
    if (mode == MountMode::kFuse) {
      entry.path = StrCat(state_dir_, "/trees/", digest.Hex());
      auto tree = TreeFs::Mount(layer, entry.path);
      if (!tree.ok()) {
        ::rmdir(entry.path.c_str());
        layer->record().Remove();
        return tree.status();
      }
      entry.tree = std::move(*tree);
      KeepFuse(TreeName(digest), entry.tree->fuse());
    } else {
      Status s = fs_->Add(layer);
      entry.path = StrCat(state_dir_, "/layers/", digest.Hex());
      if (s.ok()) s = MakeDirs(entry.path, 0755);
      std::string data = "device=" + fs_->BlobPath(digest);
      if (options_.erofs_directio) data += ",directio";
      auto mount = s.ok() ? MountPoint::Mount(fs_->MetaPath(digest), entry.path, "erofs", MS_RDONLY, data)
                          : Result<MountPoint>(s);
      if (!mount.ok()) {
        fs_->Remove(digest);
        ::rmdir(entry.path.c_str());
        layer->record().Remove();
        return mount.status().Annotate(StrCat("mount layer ", digest.Hex()));
      }
      entry.erofs = std::move(*mount);
    }
    entry.layer = layer;
    return OkStatus();
  };
  Status served = serve();
  Status put = leased.get();
  if (!served.ok()) {
    if (put.ok()) DropLease(entry, key);  // as an unload would: this node does not hold the layer
    return served;
  }
  if (!put.ok()) STRATA_LOG(kWarn) << "lazyfs: lease on layer " << digest.Hex() << ": " << put.ToString();
  // Prefetch what earlier runs read, in their order, in the background.
  if (auto list = access.get(); list.ok()) {
    entry.layer->Prefetch(*list);
  } else if (list.status().code() != ENOENT) {
    STRATA_LOG(kWarn) << "lazyfs: layer " << digest.Hex() << ": access list: " << list.status().ToString();
  }
  const auto took = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - start);
  STRATA_LOG(kInfo) << "lazyfs: mounted layer " << digest.Hex() << " (" << MountModeName(mode) << " mode) at "
                    << entry.path << " in " << took.count() / 1000.0 << " ms";
  return OkStatus();
}

void Daemon::DropLease(LayerEntry& entry, const LayerKey& key) {
  const auto& [digest, mode] = key;
  // The lease covers the digest: keep it while the other mode serves it.
  {
    std::lock_guard lock(mu_);
    if (layers_.count({digest, mode == MountMode::kFuse ? MountMode::kKernel : MountMode::kFuse})) return;
  }
  Status s = entry.catalog->DropLease(options_.node.empty() ? HostName() : options_.node, digest);
  if (!s.ok()) STRATA_LOG(kWarn) << "lazyfs: drop lease on layer " << digest.Hex() << ": " << s.ToString();
}

Result<std::string> Daemon::IdmappedView(LayerEntry& entry, const Digest128& digest, const IdMapping& idmap) {
  const std::string key = idmap.ToString();
  if (auto it = entry.idmapped.find(key); it != entry.idmapped.end()) return it->second.target();
  std::shared_ptr<UniqueFd> ns;
  {
    std::lock_guard lock(mu_);
    ns = userns_[key];
  }
  if (!ns) {
    STRATA_ASSIGN_OR_RETURN(UniqueFd fd, CreateUserNamespace(idmap));
    ns = std::make_shared<UniqueFd>(std::move(fd));
    std::lock_guard lock(mu_);
    userns_[key] = ns;
  }
  std::string path = StrCat(state_dir_, "/layers/", digest.Hex(), "@", idmap.host, "-", idmap.size);
  auto mount = IdmappedMount(entry.path, path, ns->get());
  if (!mount.ok()) return mount.status().Annotate(StrCat("idmapped view of layer ", digest.Hex()));
  return entry.idmapped.emplace(key, std::move(*mount)).first->second.target();
}

void Daemon::Unload(LayerEntry& entry, const LayerKey& key) {
  const auto& [digest, mode] = key;
  if (!entry.layer) return;
  for (auto& [k, mount] : entry.idmapped) {
    std::string target = mount.target();
    Status s = mount.Unmount();
    if (!s.ok()) STRATA_LOG(kWarn) << "lazyfs: " << s.ToString();
    ::rmdir(target.c_str());
  }
  entry.idmapped.clear();
  if (mode == MountMode::kFuse) {
    entry.tree.reset();
    if (link_) link_->Drop(TreeName(digest)).IgnoreError();
  } else {
    Status s = entry.erofs.Unmount();
    if (!s.ok()) STRATA_LOG(kWarn) << "lazyfs: " << s.ToString();
    fs_->Remove(digest);
  }
  ::rmdir(entry.path.c_str());
  DropLease(entry, key);
  entry.layer->record().Remove();
  entry.layer.reset();
  STRATA_LOG(kInfo) << "lazyfs: unmounted layer " << digest.Hex() << " (" << MountModeName(mode) << " mode)";
}

Result<Daemon::LayerHandle> Daemon::Acquire(std::string_view ref, const std::string& store_url,
                                            const std::string& holder, const std::optional<IdMapping>& idmap,
                                            MountMode mode) {
  if (idmap && mode == MountMode::kFuse) {
    return Error(ENOTSUP, StrCat("layer ", Quote(ref), ": idmapped views need kernel mode (libfuse 3.14 cannot "
                                 "allow idmapped FUSE mounts)"));
  }
  STRATA_ASSIGN_OR_RETURN(auto catalog, CatalogFor(store_url));
  STRATA_ASSIGN_OR_RETURN(Digest128 digest, catalog->Resolve(ref));
  const LayerKey key{digest, mode};
  std::shared_ptr<LayerEntry> entry;
  {
    std::lock_guard lock(mu_);
    auto& slot = layers_[key];
    if (!slot) {
      slot = std::make_shared<LayerEntry>();
      slot->catalog = catalog;
      slot->store_url = cache::DefaultStoreUrl(store_url);
    }
    entry = slot;
    entry->holders.insert(holder);  // from here on the maintainer leaves it alone
  }
  std::lock_guard load_lock(entry->mu);
  const std::string hex = digest.Hex(), mode_name(MountModeName(mode));
  if (!entry->layer) {
    Status s = Load(*entry, key);
    std::lock_guard lock(mu_);
    if (!s.ok()) {
      entry->holders.erase(holder);
      if (entry->holders.empty() && layers_[key] == entry) layers_.erase(key);
      return s;
    }
    entry->journaled = true;
    JournalLocked({{"e", "layer"}, {"d", hex}, {"m", mode_name}, {"s", entry->store_url}});
  }
  std::string path = entry->path;
  if (idmap) {
    const bool made = !entry->idmapped.count(idmap->ToString());
    auto view = IdmappedView(*entry, digest, *idmap);
    if (!view.ok()) {
      Release(digest, holder).IgnoreError();
      return view.status();
    }
    path = *view;
    if (made) {
      std::lock_guard lock(mu_);
      entry->views.insert(idmap->ToString());
      JournalLocked({{"e", "view"}, {"d", hex}, {"m", mode_name}, {"i", idmap->ToString()}});
    }
  }
  {
    std::lock_guard lock(mu_);
    if (entry->holders.count(holder)) JournalLocked({{"e", "hold"}, {"d", hex}, {"m", mode_name}, {"h", holder}});
  }
  return LayerHandle{digest, path, mode};
}

Status Daemon::Release(const Digest128& digest, const std::string& holder) {
  std::lock_guard lock(mu_);
  for (MountMode mode : {MountMode::kKernel, MountMode::kFuse}) {
    auto it = layers_.find({digest, mode});
    if (it == layers_.end() || !it->second->holders.erase(holder)) continue;
    if (it->second->holders.empty()) it->second->unused_since = std::chrono::steady_clock::now();
    JournalLocked({{"e", "release"}, {"d", digest.Hex()}, {"m", MountModeName(mode)}, {"h", holder}});
    return OkStatus();
  }
  return Error(ENOENT, StrCat("layer ", digest.Hex(), " is not held by ", Quote(holder)));
}

Result<Daemon::LayerHandle> Daemon::MountAt(std::string_view ref, const std::string& store_url,
                                            const std::string& mountpoint, bool record, MountMode mode) {
  if (mountpoint.empty() || mountpoint[0] != '/') {
    return Error(EINVAL, StrCat("mount point ", Quote(mountpoint), ": must be an absolute path"));
  }
  std::optional<LayerKey> bound;
  {
    std::lock_guard lock(mu_);
    if (auto it = binds_.find(mountpoint); it != binds_.end()) bound = it->second.key;
  }
  if (bound) {
    // The same mount asked again (a caller retrying across a restart) is
    // what it asked for; another layer there is refused.
    auto catalog = CatalogFor(store_url);
    auto digest = catalog.ok() ? (*catalog)->Resolve(ref) : Result<Digest128>(catalog.status());
    std::lock_guard lock(mu_);
    auto entry = layers_.find(*bound);
    if (digest.ok() && *digest == bound->first && mode == bound->second && entry != layers_.end()) {
      return LayerHandle{bound->first, entry->second->path, mode};
    }
    return Error(EBUSY, StrCat(mountpoint, ": a lazyfs layer is already mounted there"));
  }
  const std::string holder = "mount:" + mountpoint;
  STRATA_ASSIGN_OR_RETURN(LayerHandle handle, Acquire(ref, store_url, holder, std::nullopt, mode));
  Status s = MakeDirs(mountpoint);
  auto bind = s.ok() ? MountPoint::Mount(handle.path, mountpoint, "", MS_BIND, "") : Result<MountPoint>(s);
  if (!bind.ok()) {
    Release(handle.digest, holder).IgnoreError();
    return bind.status();
  }
  std::lock_guard lock(mu_);
  binds_[mountpoint] = BindMount{{handle.digest, mode}, std::move(*bind), record};
  JournalLocked({{"e", "bind"}, {"p", mountpoint}, {"d", handle.digest.Hex()}, {"m", MountModeName(mode)}, {"r", record}});
  return handle;
}

Status Daemon::UnmountAt(const std::string& mountpoint) {
  std::optional<BindMount> bind;
  std::shared_ptr<LayerEntry> entry;
  {
    std::lock_guard lock(mu_);
    auto it = binds_.find(mountpoint);
    if (it != binds_.end()) {
      bind.emplace(std::move(it->second));
      binds_.erase(it);
      JournalLocked({{"e", "unbind"}, {"p", mountpoint}});
      if (auto l = layers_.find(bind->key); l != layers_.end()) entry = l->second;
    }
  }
  if (!bind) {
    // Not ours (or from a daemon that died): unmount it if something is there.
    if (!IsMountPoint(mountpoint)) return Error(ENOENT, StrCat(mountpoint, ": no lazyfs layer is mounted there"));
    return MountPoint::Adopt(mountpoint).Unmount();
  }
  Status s = bind->mount.Unmount();
  if (bind->record && entry) {
    std::shared_ptr<ServedLayer> layer;
    {
      std::lock_guard load_lock(entry->mu);
      layer = entry->layer;
    }
    if (layer) {
      Status put = entry->catalog->PutAccessList(bind->key.first, layer->AccessOrder());
      if (!put.ok()) s = put.Annotate(StrCat("record access list of layer ", bind->key.first.Hex()));
    }
  }
  Release(bind->key.first, "mount:" + mountpoint).IgnoreError();
  return s;
}

json Daemon::Stats(const std::string& mountpoint_filter) {
  json layers = json::array();
  std::vector<std::pair<LayerKey, std::shared_ptr<LayerEntry>>> entries;
  std::map<LayerKey, std::vector<std::string>> mounts;
  {
    std::lock_guard lock(mu_);
    for (const auto& [k, e] : layers_) entries.emplace_back(k, e);
    for (const auto& [mp, b] : binds_) mounts[b.key].push_back(mp);
  }
  for (const auto& [key, entry] : entries) {
    const Digest128& digest = key.first;
    std::shared_ptr<ServedLayer> layer;
    std::set<std::string> holders;
    {
      std::lock_guard lock(mu_);
      holders = entry->holders;
    }
    {
      std::unique_lock load_lock(entry->mu, std::try_to_lock);
      if (!load_lock.owns_lock()) continue;  // loading right now
      layer = entry->layer;
    }
    if (!layer) continue;
    const auto& mps = mounts[key];
    if (!mountpoint_filter.empty() && std::find(mps.begin(), mps.end(), mountpoint_filter) == mps.end()) continue;
    json j = StatsJson(layer->Stats());
    j["digest"] = digest.Hex();
    j["mode"] = MountModeName(key.second);
    j["name"] = layer->manifest().name;
    j["kind"] = cache::LayerKindName(layer->manifest().kind);
    j["path"] = entry->path;
    j["mountpoints"] = mps;
    j["holders"] = holders.size();
    layers.push_back(std::move(j));
  }
  json result = {{"layers", layers}, {"socket", options_.socket_path}, {"pid", ::getpid()}, {"supervisor", SupervisorInfo()}};
  auto usage = cache_->Usage();
  auto cs = cache_->stats();
  result["cache"] = {{"dir", options_.cache_dir},
                     {"capacity", options_.cache_size},
                     {"bytes", usage.ok() ? usage->bytes : 0},
                     {"chunks", usage.ok() ? usage->chunks : 0},
                     {"hits", cs.hits},
                     {"misses", cs.misses},
                     {"joined", cs.joined},
                     {"prefetches", cs.prefetches},
                     {"fetches", cs.fetches},
                     {"fetch_errors", cs.fetch_errors},
                     {"corrupt", cs.corrupt},
                     {"timeouts", cs.timeouts},
                     {"evictions", cs.evictions},
                     {"disk_readaheads", cs.disk_readaheads}};
  return result;
}

void Daemon::Maintain() {
  // Remote stores need libcurl: load it here rather than in the first mount.
  if (Status http = cache::LoadHttp(); !http.ok()) STRATA_LOG(kInfo) << "lazyfs: " << http.ToString();
  const auto lease_every = options_.lease_ttl / 4;
  auto next_lease = std::chrono::steady_clock::now() + lease_every;
  std::unique_lock stop_lock(stop_mu_);
  while (!stopping_) {
    stop_cv_.wait_for(stop_lock, std::chrono::seconds(1));
    if (stopping_) break;
    stop_lock.unlock();
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::pair<LayerKey, std::shared_ptr<LayerEntry>>> idle, all;
    {
      std::lock_guard lock(mu_);
      for (const auto& [d, e] : layers_) {
        all.emplace_back(d, e);
        if (e->holders.empty() && now - e->unused_since >= options_.grace) idle.emplace_back(d, e);
      }
    }
    for (auto& [key, entry] : idle) {
      std::lock_guard load_lock(entry->mu);
      {
        std::lock_guard lock(mu_);
        if (!entry->holders.empty() || layers_[key] != entry) continue;  // taken again meanwhile
        JournalLocked({{"e", "unload"}, {"d", key.first.Hex()}, {"m", MountModeName(key.second)}});
      }
      // The entry stays in the map while it unloads: an acquire of the same
      // layer meanwhile waits for its lock and loads it again, rather than
      // loading a second entry at the same paths that this unload would
      // then take away (its files, its mount point).
      Unload(*entry, key);
      std::lock_guard lock(mu_);
      entry->views.clear();  // (a reload journals its own)
      auto it = layers_.find(key);
      if (entry->holders.empty() && it != layers_.end() && it->second == entry) layers_.erase(it);
    }
    if (now >= next_lease) {
      next_lease = now + lease_every;
      const int64_t expires = static_cast<int64_t>(::time(nullptr)) +
                              std::chrono::duration_cast<std::chrono::seconds>(options_.lease_ttl).count();
      for (auto& [key, entry] : all) {
        std::unique_lock load_lock(entry->mu, std::try_to_lock);
        if (!load_lock.owns_lock() || !entry->layer) continue;
        const Digest128& digest = key.first;
        Status s = entry->catalog->PutLease({options_.node.empty() ? HostName() : options_.node, digest, expires});
        if (!s.ok()) STRATA_LOG(kWarn) << "lazyfs: renew lease on layer " << digest.Hex() << ": " << s.ToString();
      }
    }
    stop_lock.lock();
  }
}

json Daemon::SupervisorInfo() const {
  if (!link_) return nullptr;
  const json& w = link_->welcome();
  return {{"pid", w.value("supervisor", 0)},       {"generation", w.value("generation", 0)},
          {"restarts", w.value("restarts", 0)},     {"binary", w.value("binary", std::string())},
          {"last_error", w.value("last_error", std::string())}};
}

void Daemon::DrainForHandover() {
  if (server_) server_->Drain();
}

Result<json> Daemon::Handle(const ControlRequest& request) {
  // The socket is 0600 and owned by root; check the peer anyway.
  if (request.peer_uid != 0 && request.peer_uid != ::geteuid()) {
    return Error(EACCES, "lazyfs: only root may use this socket");
  }
  const json& j = request.args;
  auto str = [&](const char* key) { return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string(); };
  const std::string& op = request.op;

  if (op == "health") {
    return json{{"ok", true}, {"pid", ::getpid()}, {"protocol", kControlProtocol}, {"supervisor", SupervisorInfo()}};
  }
  if (op == "upgrade") {
    if (!link_) return Error(ENOTSUP, "upgrade: this lazyfs daemon runs without a supervisor (lazyfs serve); restart it instead");
    std::string binary = str("binary");
    if (binary.empty()) binary = link_->welcome().value("binary", std::string());
    if (binary.empty() || binary[0] != '/' || ::access(binary.c_str(), X_OK) != 0) {
      return Error(ENOENT, StrCat("upgrade: ", Quote(binary), " is not an executable given by absolute path"));
    }
    STRATA_RETURN_IF_ERROR(link_->Upgrade(binary));
    STRATA_LOG(kInfo) << "lazyfs: handing over to " << binary;
    Handover();
    return json{{"pid", ::getpid()}, {"binary", binary}};
  }
  if (op == "stats") return Stats(str("mountpoint"));
  if (op == "mount") {
    STRATA_ASSIGN_OR_RETURN(MountMode mode, ParseMountMode(str("mode")));
    STRATA_ASSIGN_OR_RETURN(auto h, MountAt(str("ref"), str("store"), str("mountpoint"), j.value("record", false), mode));
    return json{{"digest", h.digest.Hex()}, {"path", h.path}, {"mountpoint", str("mountpoint")}, {"mode", MountModeName(h.mode)}};
  }
  if (op == "umount") {
    STRATA_RETURN_IF_ERROR(UnmountAt(str("mountpoint")));
    return json::object();
  }
  if (op == "acquire") {
    // "ref" (one layer) or "refs" (a stack, in one round trip): all or none.
    if (str("holder").empty()) return Error(EINVAL, "acquire: holder is required");
    std::optional<IdMapping> idmap;
    if (!str("idmap").empty()) {
      STRATA_ASSIGN_OR_RETURN(IdMapping m, IdMapping::Parse(str("idmap")));
      idmap = m;
    }
    STRATA_ASSIGN_OR_RETURN(MountMode mode, ParseMountMode(str("mode")));
    std::vector<std::string> refs;
    if (j.contains("refs") && j["refs"].is_array()) {
      for (const auto& r : j["refs"]) refs.push_back(r.is_string() ? r.get<std::string>() : "");
    } else {
      refs.push_back(str("ref"));
    }
    json layers = json::array();
    std::vector<Digest128> taken;
    for (const auto& ref : refs) {
      auto h = Acquire(ref, str("store"), str("holder"), idmap, mode);
      if (!h.ok()) {
        for (const auto& d : taken) Release(d, str("holder")).IgnoreError();
        return h.status();
      }
      taken.push_back(h->digest);
      json layer = {{"digest", h->digest.Hex()}, {"path", h->path}, {"mode", MountModeName(h->mode)}};
      // The files the EROFS mount reads (a microVM's disks read them too).
      if (h->mode == MountMode::kKernel) {
        layer["meta"] = fs_->MetaPath(h->digest);
        layer["blob"] = fs_->BlobPath(h->digest);
      }
      layers.push_back(std::move(layer));
    }
    json answer = layers.size() == 1 ? layers[0] : json::object();
    answer["layers"] = layers;
    return answer;
  }
  if (op == "release") {
    // "digest" or "digests"; releasing what is not held is reported.
    std::vector<std::string> digests;
    if (j.contains("digests") && j["digests"].is_array()) {
      for (const auto& d : j["digests"]) digests.push_back(d.is_string() ? d.get<std::string>() : "");
    } else {
      digests.push_back(str("digest"));
    }
    Status first;
    for (const auto& text : digests) {
      auto digest = Digest128::FromHex(text);
      Status s = digest ? Release(*digest, str("holder")) : Error(EINVAL, "release: digest is not 32 hex digits");
      if (!s.ok() && first.ok()) first = s;
    }
    STRATA_RETURN_IF_ERROR(first);
    return json::object();
  }
  return Error(ENOENT, StrCat("lazyfs: no request \"", op, "\" (health, stats, mount, umount, acquire, release, upgrade)"));
}

}  // namespace strata::lazyfs
