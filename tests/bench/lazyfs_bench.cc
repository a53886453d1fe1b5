// scripts/bench lazyfs [ROOTFS]: a real root filesystem layer read through
// lazyfs, in kernel mode (the kernel's EROFS over lazyfs's FUSE blob) and in
// fuse mode (lazyfs's own EROFS reader), against the same EROFS image
// mounted by the kernel straight from local files, all in one run.
//
// The layer (scripts/bench-rootfs: Debian minbase with python3, ~330 MB) is
// built and pushed to a file:// store on local disk. "Cold" means a fresh
// lazyfs daemon with an empty chunk cache, the store's chunk files dropped
// from the page cache, and a fresh mount (a fresh EROFS or FUSE page
// cache); for the local image, its two files dropped from the page cache
// and a fresh mount. Only this run's files are dropped (posix_fadvise), never
// the machine's whole page cache. Every mount and daemon this run makes is
// undone before it exits, on errors too.
#include <fcntl.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <thread>
#include <stdexcept>

#include "cache/catalog.h"
#include "common/fs.h"
#include "common/mount.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "layerctl/builder.h"
#include "layerctl/publish.h"
#include "lazyfs/client.h"
#include "lazyfs/daemon.h"
#include "tests/bench/bench_util.h"
#include "tests/testing/store_servers.h"

namespace strata::bench {
namespace {

using nlohmann::json;

// Errors unwind to main, so every MountPoint and Subprocess undoes itself.

constexpr const char* kPython = "import json, email, http.client, sqlite3";
constexpr size_t kRandomReads = 1000;
constexpr size_t kRandomReadSize = 4096;
constexpr int kWarmRounds = 5;
constexpr int kNginxRounds = 3;

struct SourceFile {
  std::string rel;
  uint64_t size;
};

// Regular files of the tree in the order a walk of the mounted image meets
// them (EROFS lists names sorted; the blob holds the files in that order).
std::vector<SourceFile> ListFiles(const std::string& root) {
  std::vector<SourceFile> out;
  namespace fs = std::filesystem;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied);
       it != fs::recursive_directory_iterator(); ++it) {
    if (it->is_symlink() || !it->is_regular_file()) continue;
    out.push_back({fs::relative(it->path(), root).string(), it->file_size()});
  }
  return out;
}

// 4 KiB reads at offsets drawn uniformly over the tree's bytes (so big
// files get most of them), aligned to 4 KiB; fixed seed.
std::vector<std::pair<size_t, uint64_t>> RandomPicks(const std::vector<SourceFile>& files) {
  std::vector<uint64_t> ends;
  uint64_t total = 0;
  for (const auto& f : files) ends.push_back(total += f.size);
  std::mt19937_64 rng(42);
  std::vector<std::pair<size_t, uint64_t>> picks;
  while (picks.size() < kRandomReads) {
    uint64_t at = rng() % total;
    size_t i = std::upper_bound(ends.begin(), ends.end(), at) - ends.begin();
    uint64_t off = (at - (ends[i] - files[i].size)) & ~uint64_t{kRandomReadSize - 1};
    picks.push_back({i, off});
  }
  return picks;
}

uint64_t ReadAll(const std::string& root, const std::vector<SourceFile>& files) {
  std::string buf(1 << 20, '\0');
  uint64_t total = 0;
  for (const auto& f : files) {
    UniqueFd fd = Check(OpenFile(root + "/" + f.rel, O_RDONLY));
    for (;;) {
      ssize_t n = ::read(fd.get(), buf.data(), buf.size());
      if (n < 0) Check(ErrnoError(errno, "read " + root + "/" + f.rel));
      if (n == 0) break;
      total += static_cast<uint64_t>(n);
    }
  }
  return total;
}

void RandomReads(const std::string& root, const std::vector<SourceFile>& files,
                 const std::vector<std::pair<size_t, uint64_t>>& picks) {
  char buf[kRandomReadSize];
  for (const auto& [i, off] : picks) {
    UniqueFd fd = Check(OpenFile(root + "/" + files[i].rel, O_RDONLY));
    Check(PreadFull(fd.get(), std::span<char>(buf, sizeof buf), off).status());
  }
}

double Time(const std::function<void()>& f) {
  auto t0 = Clock::now();
  f();
  return Seconds(Clock::now() - t0);
}


void RunPython(const std::string& root) {
  auto r = Check(RunCommand({.argv = {"chroot", root, "/usr/bin/python3", "-c", kPython}}));
  if (!r.success()) Check(Error(EIO, StrCat("python3 in ", root, ": ", r.Describe(), ": ", r.err)));
}

void FindLs(const std::string& root) {
  auto r = Check(RunCommand({.argv = {"find", ".", "-ls"}, .cwd = root, .stdout_mode = StdStream::kNull}));
  if (!r.success()) Check(Error(EIO, StrCat("find -ls in ", root, ": ", r.Describe(), ": ", r.err)));
}

// Writes back and drops from the page cache every file under `path` (or
// `path` itself): only this run's files, not the machine's whole cache.
void DropCached(const std::string& path) {
  namespace fs = std::filesystem;
  auto drop = [](const std::string& p) {
    UniqueFd fd = Check(OpenFile(p, O_RDONLY));
    ::fdatasync(fd.get());
    ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  };
  if (!fs::is_directory(path)) return drop(path);
  for (const auto& e : fs::recursive_directory_iterator(path)) {
    if (e.is_regular_file() && !e.is_symlink()) drop(e.path().string());
  }
}

// Bytes of `path` in the page cache: cachestat(2) (Linux 6.5), which needs
// no mmap and so also works on FUSE files opened for direct I/O.
uint64_t CachedBytes(const std::string& path) {
  struct Range {
    uint64_t off, len;
  } range{0, 0};
  struct {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
  } st{};
  int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return 0;
  long r = ::syscall(451 /* cachestat */, fd, &range, &st, 0);
  ::close(fd);
  return r == 0 ? st.nr_cache * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

uint64_t CachedUnder(const std::string& dir) {
  namespace fs = std::filesystem;
  uint64_t total = 0;
  if (!fs::exists(dir)) return 0;
  for (const auto& e : fs::recursive_directory_iterator(dir, fs::directory_options::skip_permission_denied)) {
    if (e.is_regular_file() && !e.is_symlink()) total += CachedBytes(e.path().string());
  }
  return total;
}

// Bytes of the regular files under `dir`.
uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && !e.is_symlink()) total += e.file_size();
  }
  return total;
}

// One way of reaching the layer's tree: Up() gives a cold mount at
// mountpoint(), Down() undoes it.
class Target {
 public:
  virtual ~Target() = default;
  virtual std::string name() const = 0;
  // Returns the seconds the mount itself took.
  virtual double Up() = 0;
  virtual void Down() = 0;
  virtual json Stats() { return json::object(); }
  // Page cache held besides the tree's own files (backing files, chunk cache).
  virtual uint64_t BackingCached() = 0;
  const std::string& mountpoint() const { return mountpoint_; }

 protected:
  std::string mountpoint_;
};

class LocalImage final : public Target {
 public:
  LocalImage(std::string meta, std::string blob, std::string mountpoint)
      : meta_(std::move(meta)), blob_(std::move(blob)) {
    mountpoint_ = std::move(mountpoint);
  }
  std::string name() const override { return "local image"; }
  double Up() override {
    DropCached(meta_);
    DropCached(blob_);
    Check(MakeDirs(mountpoint_));
    auto t0 = Clock::now();
    mount_ = Check(MountPoint::Mount(meta_, mountpoint_, "erofs", MS_RDONLY, "device=" + blob_));
    return Seconds(Clock::now() - t0);
  }
  void Down() override { Check(mount_.Unmount()); }
  uint64_t BackingCached() override { return CachedBytes(meta_) + CachedBytes(blob_); }

 private:
  std::string meta_, blob_;
  MountPoint mount_;
};

class Lazyfs final : public Target {
 public:
  Lazyfs(std::string mode, std::string dir, std::string store_url, std::string store_dir)
      : mode_(std::move(mode)), dir_(std::move(dir)), store_url_(std::move(store_url)), store_dir_(std::move(store_dir)) {
    mountpoint_ = dir_ + "/mnt";
  }
  ~Lazyfs() override {
    if (daemon_) StopDaemon();
  }
  std::string name() const override { return "lazyfs " + mode_ + " mode"; }
  std::string socket() const { return dir_ + "/lazyfs.sock"; }
  // A new directory for every cold start. The old ones stay until the run
  // ends: on a journal-less ext4 (as here) deleting thousands of files and
  // then creating as many makes every create scan the recently deleted
  // inodes, which would time the file system rather than lazyfs.
  std::string cache() const { return StrCat(dir_, "/cache-", starts_); }

  double Up() override { return Up(false); }
  // on_disk: the last start's cache directory again, its files dropped from
  // the page cache: a layer the node holds on disk but not in memory (a
  // remount after the grace period, a restart, memory pressure).
  double Up(bool on_disk) {
    if (on_disk) DropCached(cache());
    else ++starts_;
    DropCached(store_dir_);
    Check(MakeDirs(mountpoint_));
    daemon_.emplace(Check(Subprocess::Start(
        {.argv = {SelfDir() + "/../../lazyfs/lazyfs", "--socket", socket(), "daemon", "-f", "--cache", cache(),
                  "--cache-size", "4G", "--grace", "0s"},
         .stdout_mode = StdStream::kFile,
         .stderr_mode = StdStream::kFile,
         .stdout_file = dir_ + "/daemon.log",
         .stderr_file = dir_ + "/daemon.log"})));
    client_ = std::make_unique<lazyfs::Client>(socket());
    for (int i = 0; !client_->Alive(); ++i) {
      if (i > 2000 || !daemon_->Running()) Check(Error(EIO, "lazyfs daemon did not start; see " + dir_ + "/daemon.log"));
      ::usleep(5000);
    }
    auto t0 = Clock::now();
    Check(client_->Call("mount", {{"ref", "bench:1"}, {"store", store_url_}, {"mountpoint", mountpoint_}, {"mode", mode_},
                                  {"record", record_}}));
    return Seconds(Clock::now() - t0);
  }
  void Down() override {
    Check(client_->Call("umount", {{"mountpoint", mountpoint_}}));
    StopDaemon();
  }
  json Stats() override {
    json s = Check(client_->Call("stats"));
    if (s["layers"].size() != 1) Check(Error(EIO, "lazyfs stats: expected one layer: " + s.dump()));
    return s["layers"][0];
  }
  lazyfs::Client& client() { return *client_; }
  // Whether the next mounts record the layer's access list (stored at umount).
  void set_record(bool record) { record_ = record; }
  uint64_t BackingCached() override {
    // The chunk cache's files, and kernel mode's FUSE meta and blob files.
    return CachedUnder(cache()) + CachedUnder(lazyfs::StateDirFor(socket()) + "/fuse");
  }

 private:
  void StopDaemon() {
    daemon_->Kill(SIGTERM);  // unmounts what it mounted, then exits
    auto r = daemon_->Wait();
    daemon_.reset();
    client_.reset();
    if (r.ok() && !r->success()) std::fprintf(stderr, "lazyfs_bench: daemon %s\n", r->Describe().c_str());
  }

  std::string mode_, dir_, store_url_, store_dir_;
  int starts_ = 0;
  bool record_ = false;
  std::optional<Subprocess> daemon_;
  std::unique_ptr<lazyfs::Client> client_;
};

struct Figures {
  double mount_s = 0;
  double python_cold_s = 0, python_warm_s = 0;
  double seq_cold_s = 0, seq_warm_s = 0;
  double seq_disk_s = 0, python_disk_s = 0;  // every chunk in the node's cache, none in memory
  double rand_cold_s = 0, rand_warm_s = 0;
  double find_warm_s = 0;
  uint64_t tree_cached = 0, backing_cached = 0;
  json python_stats, random_stats, full_stats;
};

double MiB(uint64_t b) { return static_cast<double>(b) / (1 << 20); }

// How long readers stall when the serving process goes under them. One
// round: a cold mount, kStallReaders readers taking the tree's files in turn
// (open, then 128 KiB reads, each timed), and at 150 ms the event: "kill"
// (kill -9 of the serving process; the supervisor starts another), "upgrade"
// (`lazyfs upgrade` to the same binary) or "none" (the baseline). The
// figure per reader: the operation in progress at the event (or the next
// one it began), in ms.
constexpr int kStallReaders = 8;
constexpr int kStallRounds = 3;

std::vector<double> StallRound(Lazyfs& t, const std::vector<SourceFile>& files, const std::string& event) {
  t.Up();
  const auto t0 = Clock::now();
  auto since = [&] { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); };
  std::vector<std::vector<std::pair<double, double>>> ops(kStallReaders);
  std::vector<std::string> errors(kStallReaders);
  std::vector<std::thread> readers;
  for (int r = 0; r < kStallReaders; ++r) {
    readers.emplace_back([&, r] {
      std::string buf(128 << 10, '\0');
      for (size_t i = static_cast<size_t>(r); i < files.size() && errors[r].empty(); i += kStallReaders) {
        double start = since();
        UniqueFd fd(::open((t.mountpoint() + "/" + files[i].rel).c_str(), O_RDONLY | O_CLOEXEC));
        ops[r].push_back({start, since()});
        if (!fd) {
          errors[r] = files[i].rel + ": open: " + std::strerror(errno);
          break;
        }
        while (true) {
          start = since();
          ssize_t n = ::read(fd.get(), buf.data(), buf.size());
          ops[r].push_back({start, since()});
          if (n < 0) errors[r] = files[i].rel + ": read: " + std::strerror(errno);
          if (n <= 0) break;
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  const double at = since();
  if (event == "kill") {
    const pid_t pid = Check(t.client().Call("health"))["pid"].get<pid_t>();
    ::kill(pid, SIGKILL);
  } else if (event == "upgrade") {
    Check(t.client().Call("upgrade"));
  }
  for (auto& r : readers) r.join();
  std::vector<double> stalls;
  for (int r = 0; r < kStallReaders; ++r) {
    if (!errors[r].empty()) Check(Error(EIO, t.name() + ", " + event + ": " + errors[r]));
    for (const auto& [start, end] : ops[r]) {
      if (end >= at) {
        stalls.push_back(end - start);
        break;
      }
    }
  }
  t.Down();
  return stalls;
}

// "12.3 MiB (4.1 %)": what a workload fetched (metadata image included) of
// the image.
std::string Fetched(const json& s) {
  if (s.empty()) return "-";
  uint64_t bytes = s["meta_bytes_fetched"].get<uint64_t>() + s["bytes_fetched"].get<uint64_t>();
  double pct = 100.0 * static_cast<double>(bytes) / static_cast<double>(s["image_bytes"].get<uint64_t>());
  return StrCat(Fixed(MiB(bytes), 1), " MiB (", Fixed(pct, 1), " %)");
}

void PrintStalls(const std::vector<SourceFile>& files, Lazyfs& kernel, Lazyfs& fuse) {
  std::fprintf(stderr, "lazyfs_bench: readers across a kill -9 and an upgrade of the serving process\n");
  std::map<std::pair<Lazyfs*, std::string>, std::vector<double>> stalls;
  for (int round = 0; round < kStallRounds; ++round) {
    for (const char* event : {"none", "kill", "upgrade"}) {
      for (Lazyfs* t : {&kernel, &fuse}) {
        auto s = StallRound(*t, files, event);
        auto& all = stalls[{t, event}];
        all.insert(all.end(), s.begin(), s.end());
      }
    }
  }
  std::printf("\nreaders across the serving process's end (%d cold readers x %d rounds; per reader the open or\n"
              "128 KiB read in progress at the event, or the next it began; p50 / p99):\n",
              kStallReaders, kStallRounds);
  Table table({"event", "kernel mode", "fuse mode", "target"});
  auto cell = [&](Lazyfs* t, const char* event) {
    const auto& v = stalls[{t, event}];
    return Fixed(Percentile(v, 50), 1) + " / " + Fixed(Percentile(v, 99), 1) + " ms";
  };
  table.Add({"none (the same read, nothing happens)", cell(&kernel, "none"), cell(&fuse, "none"), "-"});
  table.Add({"kill -9 of the serving process", cell(&kernel, "kill"), cell(&fuse, "kill"), "serves within 2 s"});
  table.Add({"lazyfs upgrade (same binary)", cell(&kernel, "upgrade"), cell(&fuse, "upgrade"), "serves within 2 s"});
  table.Print();
}

// The layer over HTTP: nginx on loopback serves the store's files. Each
// round: a cold mount, then the python import, timed together, against the
// local image made cold the same way.
void PrintNginxImports(const layerctl::BuiltLayer& built, LocalImage& local, const TempDir& dir) {
  std::fprintf(stderr, "lazyfs_bench: cold python import over nginx\n");
  auto nginx = Check(testing::NginxServer::Start());
  struct NginxRow {
    std::string what;
    std::vector<double> local_s, lazy_s, lazy_mount_s;
    json stats;
  };
  std::vector<NginxRow> nginx_rows;
  // The local image and lazyfs in turn, each round.
  auto rounds = [&](NginxRow& row, Lazyfs& over_http) {
    for (int round = 0; round < kNginxRounds; ++round) {
      // Up() returns the mount's own time (the daemon's start is not in it).
      double mount_s = local.Up();
      row.local_s.push_back(mount_s + Time([&] { RunPython(local.mountpoint()); }));
      local.Down();
      mount_s = over_http.Up();
      row.lazy_mount_s.push_back(mount_s);
      row.lazy_s.push_back(mount_s + Time([&] { RunPython(over_http.mountpoint()); }));
      row.stats = over_http.Stats();
      over_http.Down();
    }
  };
  for (const char* compress : {"none", "zstd:1"}) {
    const std::string sub = compress[0] == 'n' ? "raw" : "zstd";
    const std::string nginx_store_dir = nginx->root() + "/" + sub;
    cache::Catalog nginx_catalog(Check(cache::OpenStore("file://" + nginx_store_dir)));
    Check(layerctl::Push(built, nginx_catalog, cache::LayerRef{"bench", "1"},
                         {.compression = Check(cache::ParseCompression(compress))})
              .status());
    NginxRow row{StrCat("chunks ", compress, ", ", Fixed(MiB(DirBytes(nginx_store_dir + "/chunks")), 0), " MiB"), {}, {}, {}, {}};
    Check(MakeDirs(dir.Sub("nginx-" + sub)));
    Lazyfs over_http("kernel", dir.Sub("nginx-" + sub), nginx->url() + "/" + sub, nginx_store_dir);
    rounds(row, over_http);
    nginx_rows.push_back(std::move(row));
  }
  // The compressed store again, with the access list a first mount recorded
  // (`--record`, through the store's own directory: nginx serves it read
  // only): what every mount after a task's first sees. Each cold mount
  // prefetches the list in the background while python runs.
  {
    const std::string nginx_store_dir = nginx->root() + "/zstd";
    Lazyfs recorder("kernel", dir.Sub("nginx-record"), "file://" + nginx_store_dir, nginx_store_dir);
    recorder.set_record(true);
    recorder.Up();
    RunPython(recorder.mountpoint());
    recorder.Down();
    NginxRow row{StrCat(nginx_rows.back().what, ", access list recorded"), {}, {}, {}, {}};
    Lazyfs over_http("kernel", dir.Sub("nginx-listed"), nginx->url() + "/zstd", nginx_store_dir);
    rounds(row, over_http);
    if (row.stats.value("list_fetches", uint64_t{0}) == 0) Check(Error(EIO, "the recorded access list was not prefetched: " + row.stats.dump()));
    nginx_rows.push_back(std::move(row));
  }

  auto ms = [](double s) { return Fixed(s * 1000, 1) + " ms"; };
  std::printf("\ncold python import over nginx (loopback), from the mount to python's exit, median of %d rounds;\n"
              "local: the kernel's EROFS mount of the layer's local files, made cold the same way:\n",
              kNginxRounds);
  Table http({"store", "local image", "lazyfs kernel mode", "of it, the mount", "ours / local", "fetched", "target"});
  for (const auto& r : nginx_rows) {
    const double lv = Median(r.local_s), kv = Median(r.lazy_s);
    uint64_t bytes = r.stats["meta_bytes_fetched"].get<uint64_t>() + r.stats["bytes_fetched"].get<uint64_t>();
    http.Add({r.what, ms(lv), ms(kv), ms(Median(r.lazy_mount_s)), Fixed(kv / lv, 2), Fixed(static_cast<double>(bytes) / 1e6, 1) + " MB",
              "<= 1.0; fetched <= 13.0 MB"});
  }
  http.Print();
}

int Run(int argc, char** argv) {
  if (::geteuid() != 0) Check(Error(EPERM, "needs root: it mounts EROFS images and FUSE file systems"));
  const std::string repo = SelfDir() + "/../../..";
  std::string rootfs;
  // Second argument: the layer's chunk size (default 1M), and after a '/'
  // its group size (default 128K; 0: an extent per chunk), to see what
  // they do to cold random reads and to everything else.
  uint32_t chunk_size = 1u << 20, group_size = layerctl::kDefaultGroupSize;
  if (argc > 2 && std::string_view(argv[2]) != "-") {
    const auto parts = Split(argv[2], '/');
    chunk_size = static_cast<uint32_t>(Check(ParseSize(parts[0])));
    if (parts.size() > 1) group_size = static_cast<uint32_t>(Check(ParseSize(parts[1])));
  }
  if (argc > 1 && std::string_view(argv[1]) != "-") {
    rootfs = argv[1];
  } else {
    auto r = Check(RunCommand({.argv = {repo + "/scripts/bench-rootfs"}, .stderr_mode = StdStream::kInherit}));
    if (!r.success()) Check(Error(EIO, "scripts/bench-rootfs " + r.Describe()));
    rootfs = Split(r.out, '\n')[0];
  }
  TempDir dir = Check(TempDir::Create("strata-bench-lazyfs"));
  const std::string store_dir = dir.Sub("store"), store_url = "file://" + store_dir;

  std::fprintf(stderr, "lazyfs_bench: building the layer from %s\n", rootfs.c_str());
  auto built = Check(
      layerctl::BuildLayer({.source = rootfs, .output_dir = dir.Sub("layer"), .name = "bench", .chunk_size = chunk_size,
                            .group_size = group_size}));
  cache::Catalog catalog(Check(cache::OpenStore(store_url)));
  Check(layerctl::Push(built, catalog, cache::LayerRef{"bench", "1"}).status());
  LocalImage local(JoinPath(built.dir, layerctl::kMetaFile), JoinPath(built.dir, layerctl::kBlobFile),
                   dir.Sub("local-mnt"));
  local.Up();
  const auto files = ListFiles(local.mountpoint());
  local.Down();
  uint64_t tree_bytes = 0;
  for (const auto& f : files) tree_bytes += f.size;
  const auto picks = RandomPicks(files);
  Check(MakeDirs(dir.Sub("kernel")));
  Check(MakeDirs(dir.Sub("fuse")));
  Lazyfs kernel("kernel", dir.Sub("kernel"), store_url, store_dir);
  Lazyfs fuse("fuse", dir.Sub("fuse"), store_url, store_dir);
  std::vector<Target*> targets = {&local, &kernel, &fuse};
  std::map<Target*, Figures> fig;
  if (argc > 3 && std::string_view(argv[3]) == "restart") {  // only the restart rows
    PrintStalls(files, kernel, fuse);
    return 0;
  }
  if (argc > 3 && std::string_view(argv[3]) == "nginx") {  // only the nginx rows
    PrintNginxImports(built, local, dir);
    return 0;
  }

  // Each phase on each target in turn, so load from elsewhere spreads.
  std::fprintf(stderr, "lazyfs_bench: mount and cold python import\n");
  for (Target* t : targets) {
    Figures& f = fig[t];
    f.mount_s = t->Up();
    f.python_cold_s = Time([&] { RunPython(t->mountpoint()); });
    f.python_stats = t->Stats();
    t->Down();
  }
  std::fprintf(stderr, "lazyfs_bench: cold random reads\n");
  for (Target* t : targets) {
    t->Up();
    fig[t].rand_cold_s = Time([&] { RandomReads(t->mountpoint(), files, picks); });
    fig[t].random_stats = t->Stats();
    t->Down();
  }
  std::fprintf(stderr, "lazyfs_bench: cold reads of every file\n");
  for (Target* t : targets) {
    Figures& f = fig[t];
    t->Up();
    f.seq_cold_s = Time([&] {
      if (ReadAll(t->mountpoint(), files) != tree_bytes) Check(Error(EIO, t->name() + ": short read"));
    });
    f.full_stats = t->Stats();
    FindLs(t->mountpoint());  // lists the directories for the first time
  }
  // The store's own floor for a reader that fetches one extent at a time:
  // every chunk file read once, cold, in blob order.
  DropCached(store_dir);
  uint64_t extent_bytes = 0;
  for (const auto& e : built.manifest.extents) extent_bytes += e.length;
  const double store_s = Time([&] {
    std::string buf(1 << 20, '\0');
    for (const auto& e : built.manifest.extents) {
      UniqueFd fd = Check(OpenFile(store_dir + "/" + cache::ChunkKey(e.hash), O_RDONLY));
      while (::read(fd.get(), buf.data(), buf.size()) > 0) {
      }
    }
  });
  // The same cold read from a store of raw chunks, against that store's
  // own floor: what decompression costs a cold read, and what it saves.
  std::fprintf(stderr, "lazyfs_bench: cold reads of every file from a raw store\n");
  const std::string raw_dir = dir.Sub("store-raw");
  {
    cache::Catalog raw_catalog(Check(cache::OpenStore("file://" + raw_dir)));
    Check(layerctl::Push(built, raw_catalog, cache::LayerRef{"bench", "1"}, {.compression = cache::Compression{false, 0}})
              .status());
  }
  Check(MakeDirs(dir.Sub("kernel-raw")));
  Lazyfs kernel_raw("kernel", dir.Sub("kernel-raw"), "file://" + raw_dir, raw_dir);
  kernel_raw.Up();
  const double raw_seq_cold_s = Time([&] {
    if (ReadAll(kernel_raw.mountpoint(), files) != tree_bytes) Check(Error(EIO, "raw store: short read"));
  });
  kernel_raw.Down();
  DropCached(raw_dir);
  const double raw_store_s = Time([&] {
    std::string buf(1 << 20, '\0');
    for (const auto& e : built.manifest.extents) {
      UniqueFd fd = Check(OpenFile(raw_dir + "/" + cache::ChunkKey(e.hash), O_RDONLY));
      while (::read(fd.get(), buf.data(), buf.size()) > 0) {
      }
    }
  });
  std::fprintf(stderr, "lazyfs_bench: warm rounds\n");
  std::map<Target*, std::vector<double>> seq, rnd, find, python;
  for (int round = 0; round < kWarmRounds; ++round) {
    for (Target* t : targets) {
      seq[t].push_back(Time([&] { ReadAll(t->mountpoint(), files); }));
      rnd[t].push_back(Time([&] { RandomReads(t->mountpoint(), files, picks); }));
      find[t].push_back(Time([&] { FindLs(t->mountpoint()); }));
      python[t].push_back(Time([&] { RunPython(t->mountpoint()); }));
    }
  }
  for (Target* t : targets) {
    Figures& f = fig[t];
    f.seq_warm_s = Median(seq[t]);
    f.rand_warm_s = Median(rnd[t]);
    f.find_warm_s = Median(find[t]);
    f.python_warm_s = Median(python[t]);
    for (const auto& file : files) f.tree_cached += CachedBytes(t->mountpoint() + "/" + file.rel);
    f.backing_cached = t->BackingCached();
  }
  for (Target* t : targets) t->Down();
  // The same walk and import again, with every chunk in the node's cache on
  // disk and none in memory, against the local image cold.
  std::fprintf(stderr, "lazyfs_bench: reads from the node's disk cache\n");
  kernel.Up(/*on_disk=*/true);
  fig[&kernel].seq_disk_s = Time([&] {
    if (ReadAll(kernel.mountpoint(), files) != tree_bytes) Check(Error(EIO, "disk cache: short read"));
  });
  if (kernel.Stats().value("chunks_fetched", uint64_t{1}) != 0) Check(Error(EIO, "disk cache: the walk fetched"));
  kernel.Down();
  kernel.Up(/*on_disk=*/true);
  fig[&kernel].python_disk_s = Time([&] { RunPython(kernel.mountpoint()); });
  if (kernel.Stats().value("chunks_fetched", uint64_t{1}) != 0) Check(Error(EIO, "disk cache: the import fetched"));
  kernel.Down();

  const Figures& l = fig[&local];
  const Figures& k = fig[&kernel];
  const Figures& u = fig[&fuse];
  const double mib = MiB(tree_bytes);
  std::printf("layer: %s, %zu files, %.0f MiB of file data; image %.0f MiB (metadata %.1f MiB); chunk size %u KiB, group size %u KiB, %zu extents\n",
              rootfs.c_str(), files.size(), mib, MiB(built.manifest.meta_size + built.manifest.blob_size),
              MiB(built.manifest.meta_size), chunk_size >> 10, group_size >> 10, built.manifest.extents.size());
  const uint64_t stored = DirBytes(store_dir + "/chunks");
  std::printf("store: file:// on local disk, chunks zstd:1 (the default): %.0f MiB, %.2f of the tree's bytes (target <= 0.65);\n"
              "cold = fresh daemon, empty cache, store and image files dropped from the page cache\n",
              MiB(stored), static_cast<double>(stored) / static_cast<double>(tree_bytes));
  std::printf("warm figures: median of %d rounds taking the three setups in turn; random reads: %zu x 4 KiB at\n"
              "offsets uniform over the file bytes, each opening its file\n\n",
              kWarmRounds, kRandomReads);

  Table speed({"measure", "local image", "kernel mode", "x local", "fuse mode", "x local", "target"});
  auto ms = [](double s) { return Fixed(s * 1000, 1) + " ms"; };
  auto rate = [](double v, const char* unit) { return Fixed(v, 0) + unit; };
  auto row_time = [&](const char* what, double lv, double kv, double uv, const char* target) {
    speed.Add({what, ms(lv), ms(kv), Fixed(lv / kv, 2), ms(uv), Fixed(lv / uv, 2), target});
  };
  auto row_rate = [&](const char* what, double lv, double kv, double uv, const char* unit, const char* target) {
    speed.Add({what, rate(lv, unit), rate(kv, unit), Fixed(kv / lv, 2), rate(uv, unit), Fixed(uv / lv, 2), target});
  };
  row_time("mount, cold (metadata image fetched)", l.mount_s, k.mount_s, u.mount_s, "-");
  row_time("python3 -c 'import json, email, http.client, sqlite3', cold", l.python_cold_s, k.python_cold_s,
           u.python_cold_s, "-");
  speed.Add({"  the same, every chunk in the node's cache on disk, none in memory", ms(l.python_cold_s),
             ms(k.python_disk_s), Fixed(l.python_cold_s / k.python_disk_s, 2), "", "", "-"});
  row_time("the same import, warm", l.python_warm_s, k.python_warm_s, u.python_warm_s, "-");
  row_rate("sequential read of every file, cold", mib / l.seq_cold_s, mib / k.seq_cold_s, mib / u.seq_cold_s,
           " MiB/s", ">= 0.8 floor");
  const double floor_rate = MiB(extent_bytes) / store_s;
  speed.Add({"  floor: the store's chunk files read cold, one at a time", "-", rate(floor_rate, " MiB/s"),
             Fixed(floor_rate / (mib / l.seq_cold_s), 2), "", "", "-"});
  speed.Add({"  cold sequential read / floor", "-", Fixed(mib / k.seq_cold_s / floor_rate, 2), "", Fixed(mib / u.seq_cold_s / floor_rate, 2), "", ">= 0.8"});
  const double raw_floor_rate = MiB(extent_bytes) / raw_store_s;
  speed.Add({"  the same from a store of raw chunks", "-", rate(mib / raw_seq_cold_s, " MiB/s"),
             Fixed(mib / raw_seq_cold_s / (mib / l.seq_cold_s), 2), "", "", "-"});
  speed.Add({"  floor of that store", "-", rate(raw_floor_rate, " MiB/s"), Fixed(raw_floor_rate / (mib / l.seq_cold_s), 2),
             "", "", "-"});
  speed.Add({"  raw: cold sequential read / floor", "-", Fixed(mib / raw_seq_cold_s / raw_floor_rate, 2), "", "", "",
             ">= 0.8"});
  speed.Add({"  the same, every chunk in the node's cache on disk, none in memory", rate(mib / l.seq_cold_s, " MiB/s"),
             rate(mib / k.seq_disk_s, " MiB/s"), Fixed(l.seq_cold_s / k.seq_disk_s, 2), "", "", "-"});
  row_rate("sequential read of every file, warm", mib / l.seq_warm_s, mib / k.seq_warm_s, mib / u.seq_warm_s,
           " MiB/s", ">= 0.9");
  row_rate("random 4 KiB reads, cold", kRandomReads / l.rand_cold_s, kRandomReads / k.rand_cold_s,
           kRandomReads / u.rand_cold_s, " reads/s", ">= 0.5");
  row_rate("random 4 KiB reads, warm", kRandomReads / l.rand_warm_s, kRandomReads / k.rand_warm_s,
           kRandomReads / u.rand_warm_s, " reads/s", "-");
  row_time("find . -ls of the tree, warm", l.find_warm_s, k.find_warm_s, u.find_warm_s, "-");
  std::printf("x local: local time / our time, or our rate / local rate (above 1: faster than the local image)\n");
  speed.Print();

  std::printf("\nfetched from the store (metadata image included) by each cold workload, of the %.0f MiB image:\n",
              MiB(built.manifest.meta_size + built.manifest.blob_size));
  Table fetched({"cold workload", "kernel mode", "fuse mode", "target"});
  fetched.Add({"python3 import", Fetched(k.python_stats), Fetched(u.python_stats), "<= 10 %"});
  fetched.Add({StrCat(kRandomReads, " random 4 KiB reads"), Fetched(k.random_stats), Fetched(u.random_stats), "-"});
  fetched.Add({"read of every file", Fetched(k.full_stats), Fetched(u.full_stats), "-"});
  fetched.Print();

  std::printf("\npage cache held after the warm reads (the tree's files, plus backing files: the local image's\n"
              "meta.img and blob.img; lazyfs's chunk cache files and kernel mode's FUSE meta and blob files):\n");
  Table memory({"setup", "tree files", "backing files", "total", "x tree files", "x local", "target"});
  for (Target* t : targets) {
    const Figures& f = fig[t];
    const double total = static_cast<double>(f.tree_cached + f.backing_cached);
    memory.Add({t->name(), Fixed(MiB(f.tree_cached), 0) + " MiB", Fixed(MiB(f.backing_cached), 0) + " MiB",
                Fixed(MiB(f.tree_cached + f.backing_cached), 0) + " MiB",
                Fixed(total / static_cast<double>(f.tree_cached), 2),
                Fixed(total / static_cast<double>(l.tree_cached + l.backing_cached), 2),
                t == &local ? "-" : "<= 1.1 x tree"});
  }
  memory.Print();

  PrintNginxImports(built, local, dir);
  PrintStalls(files, kernel, fuse);
  return 0;
}

}  // namespace
}  // namespace strata::bench

int main(int argc, char** argv) {
  return strata::bench::BenchMain([&] { return strata::bench::Run(argc, argv); });
}
