// Tar archives into the image writer with libarchive, hardened against path
// escapes the same way an extraction onto disk would have to be.
#include "layerctl/tar_reader.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <set>
#include <vector>

#include "common/fs.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace strata::layerctl {
namespace {

constexpr std::string_view kWhiteoutPrefix = ".wh.";
constexpr std::string_view kOpaqueMarker = ".wh..wh..opq";
constexpr std::string_view kOpaqueXattr = "trusted.overlay.opaque";

// Reads the archive from a descriptor and hashes every byte it hands over.
struct Input {
  int fd = -1;
  Hasher hasher;
  uint64_t bytes = 0;
  std::vector<char> buffer = std::vector<char>(1 << 20);
  int error = 0;
};

la_ssize_t ReadCallback(archive*, void* data, const void** out) {
  auto* in = static_cast<Input*>(data);
  while (true) {
    ssize_t n = ::read(in->fd, in->buffer.data(), in->buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      in->error = errno;
      return -1;
    }
    in->hasher.Update(std::span<const char>(in->buffer.data(), static_cast<size_t>(n)));
    in->bytes += static_cast<uint64_t>(n);
    *out = in->buffer.data();
    return n;
  }
}

struct ArchiveDeleter {
  void operator()(archive* a) const { archive_read_free(a); }
};

// Normalizes a tar path to its components: drops "." and empty parts and a
// leading "./"; fails on absolute names and "..".
Result<std::vector<std::string>> Components(std::string_view name, std::string_view what) {
  if (name.starts_with("/")) {
    return Error(EPERM, StrCat(what, " ", Quote(name), ": absolute name would land outside the root; refused"));
  }
  std::vector<std::string> parts;
  for (auto& part : Split(name, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") return Error(EPERM, StrCat(what, " ", Quote(name), ": \"..\" would leave the root; refused"));
    if (part.size() > 255) {
      return Error(ENAMETOOLONG, StrCat(what, " ", Quote(name), ": a component is longer than 255 bytes"));
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

// parts[0..n) joined with '/': a path for the writer ("" is the root).
std::string JoinParts(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (i) out.push_back('/');
    out += parts[i];
  }
  return out;
}

class TarReader {
 public:
  TarReader(std::string input_name, erofs::ImageWriter& writer) : input_name_(std::move(input_name)), writer_(writer) {}

  Result<TarStats> Run(int input_fd);

 private:
  std::string Where(std::string_view entry) const { return StrCat("unpack ", input_name_, ": entry ", Quote(entry)); }
  // Refuses a path whose parents parts[0..n) pass through anything but a
  // directory; missing parents are fine (the writer creates them).
  Status CheckParents(const std::vector<std::string>& parts, size_t n, std::string_view entry) const;
  Result<erofs::Attributes> AttributesOf(archive_entry* e, std::string_view entry) const;
  Status Add(archive* a, archive_entry* e);

  std::string input_name_;
  erofs::ImageWriter& writer_;
  Input* input_ = nullptr;
  TarStats stats_;
  std::set<std::string> opaque_dirs_;
};

Status TarReader::CheckParents(const std::vector<std::string>& parts, size_t n, std::string_view entry) const {
  if (n == 0 || writer_.TypeOf(JoinParts(parts, n)) == erofs::FileType::kDirectory) return OkStatus();
  for (size_t i = 1; i <= n; ++i) {
    const std::string path = JoinParts(parts, i);
    auto type = writer_.TypeOf(path);
    if (!type) return OkStatus();  // this and everything below it is new
    if (*type != erofs::FileType::kDirectory) {
      return Error(EPERM, StrCat(Where(entry), ": parent ", Quote(path),
                                 " is a symlink or not a directory; extraction never follows links"));
    }
  }
  return OkStatus();
}

Result<erofs::Attributes> TarReader::AttributesOf(archive_entry* e, std::string_view entry) const {
  erofs::Attributes attrs;
  attrs.mode = archive_entry_perm(e) & 07777;
  const la_int64_t uid = archive_entry_uid(e), gid = archive_entry_gid(e);
  if (uid < 0 || uid > UINT32_MAX || gid < 0 || gid > UINT32_MAX) {
    return Error(EINVAL, StrCat(Where(entry), ": owner ", uid, ":", gid, " is out of range"));
  }
  attrs.uid = static_cast<uint32_t>(uid);
  attrs.gid = static_cast<uint32_t>(gid);
  if (archive_entry_mtime_is_set(e)) {
    attrs.mtime = archive_entry_mtime(e);
    const long nsec = archive_entry_mtime_nsec(e);
    attrs.mtime_nsec = nsec >= 0 && nsec < 1000000000 ? static_cast<uint32_t>(nsec) : 0;
  }
  archive_entry_xattr_reset(e);
  const char* name;
  const void* value;
  size_t size;
  while (archive_entry_xattr_next(e, &name, &value, &size) == ARCHIVE_OK) {
    attrs.xattrs.push_back({name, std::string(static_cast<const char*>(value), size)});
  }
  return attrs;
}

Status TarReader::Add(archive* a, archive_entry* e) {
  const char* raw = archive_entry_pathname(e);
  const std::string entry = raw ? raw : "";
  STRATA_ASSIGN_OR_RETURN(auto parts, Components(entry, StrCat("unpack ", input_name_, ": entry")));
  ++stats_.entries;
  const mode_t type = archive_entry_filetype(e);
  STRATA_ASSIGN_OR_RETURN(erofs::Attributes attrs, AttributesOf(e, entry));
  auto step = [&](Status s) { return s.ok() ? s : std::move(s).Annotate(Where(entry)); };

  if (parts.empty()) {  // "./": the root directory's own attributes
    if (type != AE_IFDIR) return Error(EINVAL, StrCat(Where(entry), ": the root must be a directory"));
    return step(writer_.AddDirectory("", attrs));
  }

  STRATA_RETURN_IF_ERROR(CheckParents(parts, parts.size() - 1, entry));
  const std::string parent = JoinParts(parts, parts.size() - 1);
  const std::string& base = parts.back();
  const std::string path = JoinParts(parts, parts.size());

  if (base == kOpaqueMarker) {
    if (!writer_.TypeOf(parent)) STRATA_RETURN_IF_ERROR(step(writer_.AddDirectory(parent, erofs::Attributes{.mode = 0755})));
    opaque_dirs_.insert(parent);
    return OkStatus();
  }
  if (base.starts_with(kWhiteoutPrefix)) {
    const std::string name = base.substr(kWhiteoutPrefix.size());
    if (name.empty()) return Error(EINVAL, StrCat(Where(entry), ": whiteout without a name"));
    erofs::Attributes whiteout{
        .mode = 0, .uid = attrs.uid, .gid = attrs.gid, .mtime = attrs.mtime, .mtime_nsec = attrs.mtime_nsec};
    const std::string target = parent.empty() ? name : parent + "/" + name;
    return step(writer_.AddSpecial(target, erofs::FileType::kCharDevice, whiteout, makedev(0, 0)));
  }

  if (const char* link = archive_entry_hardlink(e)) {
    STRATA_ASSIGN_OR_RETURN(auto target, Components(link, StrCat(Where(entry), ": hardlink target")));
    if (target.empty()) return Error(EPERM, StrCat(Where(entry), ": hardlink to the root directory; refused"));
    STRATA_RETURN_IF_ERROR(CheckParents(target, target.size() - 1, entry));
    return step(writer_.AddHardlink(path, JoinParts(target, target.size())));
  }

  switch (type) {
    case AE_IFREG: {
      const la_int64_t size = archive_entry_size(e);
      if (size < 0) return Error(EINVAL, StrCat(Where(entry), ": negative size ", size));
      erofs::DataSource source = [&]() -> Result<std::optional<erofs::DataPiece>> {
        const void* buf;
        size_t n;
        la_int64_t offset;
        const int r = archive_read_data_block(a, &buf, &n, &offset);
        if (r == ARCHIVE_EOF) return std::optional<erofs::DataPiece>();
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
          return Error(input_->error ? input_->error : EIO, StrCat("read data: ", archive_error_string(a)));
        }
        if (offset < 0) return Error(EINVAL, StrCat("read data: negative offset ", offset));
        return std::optional<erofs::DataPiece>(
            erofs::DataPiece{static_cast<uint64_t>(offset), std::span<const char>(static_cast<const char*>(buf), n)});
      };
      STRATA_RETURN_IF_ERROR(step(writer_.AddFile(path, attrs, static_cast<uint64_t>(size), source)));
      ++stats_.regular_files;
      stats_.bytes += static_cast<uint64_t>(size);
      return OkStatus();
    }
    case AE_IFDIR: return step(writer_.AddDirectory(path, attrs));
    case AE_IFLNK: {
      const char* target = archive_entry_symlink(e);
      if (!target) return Error(EINVAL, StrCat(Where(entry), ": symlink without a target"));
      return step(writer_.AddSymlink(path, attrs, target));
    }
    case AE_IFCHR: return step(writer_.AddSpecial(path, erofs::FileType::kCharDevice, attrs, archive_entry_rdev(e)));
    case AE_IFBLK: return step(writer_.AddSpecial(path, erofs::FileType::kBlockDevice, attrs, archive_entry_rdev(e)));
    case AE_IFIFO: return step(writer_.AddSpecial(path, erofs::FileType::kFifo, attrs));
    case AE_IFSOCK: return step(writer_.AddSpecial(path, erofs::FileType::kSocket, attrs));
    default: return Error(EINVAL, StrCat(Where(entry), ": unsupported entry type 0", type));
  }
}

Result<TarStats> TarReader::Run(int input_fd) {
  Input input;
  input.fd = input_fd;
  input_ = &input;
  std::unique_ptr<archive, ArchiveDeleter> a(archive_read_new());
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  archive_read_support_format_gnutar(a.get());
  if (archive_read_open(a.get(), &input, nullptr, ReadCallback, nullptr) != ARCHIVE_OK) {
    return Error(input.error ? input.error : EINVAL,
                 StrCat("unpack ", input_name_, ": ", archive_error_string(a.get())));
  }
  while (true) {
    archive_entry* e;
    int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
      int code = input.error ? input.error : EINVAL;
      return Error(code, StrCat("unpack ", input_name_, ": read archive after ", stats_.entries,
                                " entries: ", archive_error_string(a.get())));
    }
    STRATA_RETURN_IF_ERROR(Add(a.get(), e));
  }
  // The digest covers the whole input, trailing padding included.
  const void* ignored;
  while (true) {
    const la_ssize_t n = ReadCallback(a.get(), &input, &ignored);
    if (n == 0) break;
    if (n < 0) return ErrnoError(input.error, StrCat("unpack ", input_name_, ": read the end of the archive"));
  }
  for (const std::string& dir : opaque_dirs_) {
    if (writer_.TypeOf(dir) != erofs::FileType::kDirectory) continue;  // replaced by a later entry
    STRATA_RETURN_IF_ERROR(writer_.SetXattr(dir, kOpaqueXattr, "y")
                               .Annotate(StrCat("unpack ", input_name_, ": mark directory ", Quote(dir), " opaque")));
  }
  stats_.source = input.hasher.Finish();
  stats_.source_bytes = input.bytes;
  return stats_;
}

}  // namespace

Result<TarStats> AddTar(const std::string& input, erofs::ImageWriter& writer) {
  if (input == "-") return TarReader("stdin", writer).Run(STDIN_FILENO);
  auto fd = OpenFile(input, O_RDONLY);
  if (!fd.ok()) return fd.status().Annotate("unpack tar");
  return TarReader(input, writer).Run(fd->get());
}

}  // namespace strata::layerctl
