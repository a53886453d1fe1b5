// Push, pull and verify.
#include "layerctl/publish.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "cache/chunk_cache.h"
#include "common/fs.h"
#include "common/progress.h"
#include "common/strings.h"
#include "common/subprocess.h"
#include "common/thread_pool.h"

namespace strata::layerctl {
namespace {

// One distinct chunk of a layer: an extent, or the metadata image (file 0).
struct ChunkJob {
  Digest128 hash;
  uint64_t offset = 0;  // in the blob
  uint64_t length = 0;
  bool meta = false;
};

std::vector<ChunkJob> DistinctChunks(const cache::Manifest& m) {
  std::vector<ChunkJob> jobs;
  std::unordered_map<Digest128, bool, Digest128Hash> seen;
  for (const auto& e : m.extents) {
    if (seen.emplace(e.hash, true).second) jobs.push_back({e.hash, e.offset, e.length, false});
  }
  if (seen.emplace(m.meta_hash, true).second) jobs.push_back({m.meta_hash, 0, m.meta_size, true});
  return jobs;
}

}  // namespace

Result<PushReport> Push(const BuiltLayer& layer, const cache::Catalog& catalog,
                        const std::optional<cache::LayerRef>& tag, const PushOptions& options) {
  const cache::Manifest& m = layer.manifest;
  cache::ObjectStore& store = catalog.store();
  auto where = [&](std::string_view step) { return StrCat("push layer ", layer.digest.Hex(), " to ", store.url(), ": ", step); };
  for (const auto& parent : m.parents) {
    STRATA_ASSIGN_OR_RETURN(bool present, catalog.HasManifest(parent));
    if (!present) return Error(ENOENT, where(StrCat("parent ", parent.Hex(), " is not published there; push it first")));
  }
  STRATA_ASSIGN_OR_RETURN(UniqueFd blob, OpenFile(JoinPath(layer.dir, kBlobFile), O_RDONLY));
  STRATA_ASSIGN_OR_RETURN(UniqueFd meta, OpenFile(JoinPath(layer.dir, kMetaFile), O_RDONLY));

  cache::Compression compression;
  if (options.compression) {
    compression = *options.compression;
  } else {
    auto settings = catalog.GetSettings();
    if (!settings.ok()) return settings.status().Annotate(where("read the store's settings"));
    compression = settings->compression;
  }
  std::vector<ChunkJob> jobs = DistinctChunks(m);
  // The metadata image goes last among the chunks.
  std::stable_partition(jobs.begin(), jobs.end(), [](const ChunkJob& j) { return !j.meta; });
  PushReport report;
  report.digest = layer.digest;
  report.chunks = jobs.size();
  report.compression = compression;
  std::atomic<uint64_t> uploaded{0}, uploaded_bytes{0}, sent_bytes{0}, compressed{0}, present{0}, present_bytes{0};
  uint64_t total = 0;
  for (const auto& j : jobs) total += j.length;
  Progress progress("push", total);
  auto send = [&](const ChunkJob& job) -> Status {
    const std::string key = cache::ChunkKey(job.hash);
    STRATA_ASSIGN_OR_RETURN(bool exists, store.Exists(key));
    if (exists) {
      ++present;
      present_bytes += job.length;
    } else {
      std::string data(job.length, '\0');
      STRATA_ASSIGN_OR_RETURN(size_t n, PreadFull(job.meta ? meta.get() : blob.get(), data, job.offset));
      if (n != job.length || HashBytes(data) != job.hash) {
        return Error(EBADMSG, StrCat("chunk ", job.hash.Hex(), " in ", layer.dir,
                                     " no longer matches its manifest; rebuild the layer"));
      }
      std::optional<std::string> packed = cache::CompressChunk(data, compression);
      STRATA_RETURN_IF_ERROR(store.Put(key, packed ? *packed : data));
      ++uploaded;
      uploaded_bytes += job.length;
      sent_bytes += packed ? packed->size() : data.size();
      if (packed) ++compressed;
    }
    progress.Add(job.length);
    return OkStatus();
  };
  size_t data_jobs = jobs.size() - 1;  // all but the metadata image
  Status s = ParallelFor(data_jobs, options.parallel, [&](size_t i) { return send(jobs[i]); });
  if (s.ok()) s = send(jobs.back());
  if (!s.ok()) return s.Annotate(where("upload chunks"));

  auto digest = catalog.PutManifest(m);
  if (!digest.ok()) return digest.status().Annotate(where("upload manifest"));
  if (*digest != layer.digest) return Error(EINVAL, where("manifest digest changed while pushing"));
  if (tag) {
    auto record = catalog.SetTag(tag->name, tag->version, layer.digest);
    if (!record.ok()) return record.status().Annotate(where("move tag " + tag->ToString()));
  }
  report.chunks_uploaded = uploaded;
  report.bytes_uploaded = uploaded_bytes;
  report.bytes_sent = sent_bytes;
  report.chunks_compressed = compressed;
  report.chunks_present = present;
  report.bytes_present = present_bytes;
  return report;
}

Result<PullReport> Pull(const cache::Catalog& catalog, const Digest128& digest, const std::string& out_dir,
                        size_t parallel) {
  auto where = [&](std::string_view step) { return StrCat("pull layer ", digest.Hex(), " into ", out_dir, ": ", step); };
  STRATA_ASSIGN_OR_RETURN(cache::Manifest m, catalog.GetManifest(digest));
  STRATA_RETURN_IF_ERROR(MakeDirs(out_dir));
  const std::string blob_tmp = JoinPath(out_dir, ".blob.tmp"), meta_tmp = JoinPath(out_dir, ".meta.tmp");
  STRATA_ASSIGN_OR_RETURN(UniqueFd blob, OpenFile(blob_tmp, O_RDWR | O_CREAT | O_TRUNC));
  if (::ftruncate(blob.get(), static_cast<off_t>(m.blob_size)) != 0) return ErrnoError(errno, where("size blob"));
  std::vector<ChunkJob> jobs = DistinctChunks(m);
  uint64_t total = 0;
  for (const auto& j : jobs) total += j.length;
  Progress progress("pull", total);
  std::mutex meta_mu;
  std::string meta;
  // Extents that share a hash share bytes: write each copy.
  std::unordered_map<Digest128, std::vector<uint64_t>, Digest128Hash> offsets;
  for (const auto& e : m.extents) offsets[e.hash].push_back(e.offset);
  Status s = ParallelFor(jobs.size(), parallel, [&](size_t i) -> Status {
    const ChunkJob& job = jobs[i];
    STRATA_ASSIGN_OR_RETURN(cache::DecodedChunk chunk, cache::GetChunk(catalog.store(), job.hash, job.length));
    const std::string& data = chunk.bytes;
    if (job.hash == m.meta_hash) {
      std::lock_guard lock(meta_mu);
      meta = data;
    }
    if (auto it = offsets.find(job.hash); it != offsets.end()) {
      for (uint64_t off : it->second) STRATA_RETURN_IF_ERROR(PwriteFull(blob.get(), data, off));
    }
    progress.Add(job.length);
    return OkStatus();
  });
  if (!s.ok()) {
    ::unlink(blob_tmp.c_str());
    return s.Annotate(where("fetch chunks"));
  }
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(meta_tmp, meta, false));
  if (::rename(meta_tmp.c_str(), JoinPath(out_dir, kMetaFile).c_str()) != 0 ||
      ::rename(blob_tmp.c_str(), JoinPath(out_dir, kBlobFile).c_str()) != 0) {
    return ErrnoError(errno, where("move images into place"));
  }
  STRATA_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(out_dir, kManifestFile), m.ToJson() + "\n"));
  PullReport report{digest, m, total};
  return report;
}

Result<LayerVerifyReport> Verify(const cache::Catalog& catalog, const Digest128& digest, size_t parallel) {
  STRATA_ASSIGN_OR_RETURN(cache::Manifest m, catalog.GetManifest(digest));
  LayerVerifyReport report;
  report.digest = digest;
  std::vector<ChunkJob> jobs = DistinctChunks(m);
  report.chunks = jobs.size();
  std::mutex mu;
  Progress progress("verify", m.StoredBytes());
  Status s = ParallelFor(jobs.size(), parallel, [&](size_t i) -> Status {
    auto data = cache::GetChunk(catalog.store(), jobs[i].hash, jobs[i].length);
    std::lock_guard lock(mu);
    if (!data.ok()) {
      report.problems.push_back(data.status().ToString());
    } else {
      report.bytes += data->bytes.size();
      report.stored_bytes += data->stored_size;
      if (data->compressed) ++report.compressed;
    }
    progress.Add(jobs[i].length);
    return OkStatus();
  });
  STRATA_RETURN_IF_ERROR(s);
  if (!report.ok()) return report;
  // Every chunk is sound; now the filesystem they make up.
  STRATA_ASSIGN_OR_RETURN(TempDir tmp, TempDir::Create("strata-verify"));
  STRATA_RETURN_IF_ERROR(Pull(catalog, digest, tmp.path(), parallel).status());
  auto fsck = RunCommand({.argv = {"fsck.erofs", "--device=" + tmp.Sub(kBlobFile), tmp.Sub(kMetaFile)}});
  if (!fsck.ok()) return fsck.status().Annotate("run fsck.erofs");
  if (!fsck->success()) {
    std::string out = fsck->err.empty() ? fsck->out : fsck->err;
    report.problems.push_back(StrCat("fsck.erofs ", fsck->Describe(), ": ", out));
  }
  return report;
}

}  // namespace strata::layerctl
