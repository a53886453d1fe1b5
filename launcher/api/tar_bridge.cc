// Tar streams to and from the agent's tree protocol, through libarchive.
#include "launcher/api/tar_bridge.h"

#include <fcntl.h>
#include <unistd.h>

#include <mutex>
#include <thread>

#include "common/archive_api.h"
#include "common/fs.h"
#include "common/strings.h"
#include "common/unique_fd.h"

namespace strata::launcher {

using nlohmann::json;

namespace {

std::string ArchiveError(archive* a) {
  const char* e = Archive().error_string(a);
  return e ? e : "unknown libarchive error";
}

// The upload: the body goes into a pipe that a reader thread unpacks, so
// libarchive pulls while the HTTP server pushes.
class TarToTree : public HttpServer::Upload {
 public:
  TarToTree(std::unique_ptr<AgentClient::TreeStream> stream, UniqueFd read_end, UniqueFd write_end)
      : stream_(std::move(stream)), write_end_(std::move(write_end)) {
    reader_ = std::thread([this, fd = std::move(read_end)]() mutable { Unpack(std::move(fd)); });
  }
  ~TarToTree() override { Stop(); }

  Status Write(std::string_view piece) override {
    Status s = WriteFull(write_end_.get(), piece);
    if (s.ok()) return s;
    Stop();  // the reader ended early: its error is the answer
    std::lock_guard lock(mu_);
    return error_.ok() ? s.Annotate("tar upload") : error_;
  }

  HttpServer::Response Finish() override {
    Stop();
    std::lock_guard lock(mu_);
    if (!error_.ok()) return HttpServer::ErrorResponse(error_);
    auto answer = stream_->Finish();
    stream_.reset();
    if (!answer.ok()) return HttpServer::ErrorResponse(answer.status());
    HttpServer::Response r;
    r.body = answer->dump();
    return r;
  }

  void Abort() override {
    Stop();
    stream_.reset();  // the agent sees the stream end unfinished
  }

 private:
  void Stop() {
    write_end_.reset();  // end of the archive for the reader
    if (reader_.joinable()) reader_.join();
  }

  void Fail(const Status& s) {
    std::lock_guard lock(mu_);
    if (error_.ok()) error_ = s;
  }

  void Unpack(UniqueFd fd) {
    const auto& A = Archive();
    archive* a = A.read_new();
    A.read_support_format_tar(a);
    A.read_support_filter_all(a);
    if (A.read_open_fd(a, fd.get(), 64 << 10) != ARCHIVE_OK) {
      Fail(Error(EINVAL, "tar upload: " + ArchiveError(a)));
      A.read_free(a);
      return;
    }
    std::vector<char> buf(256 << 10);
    while (true) {
      archive_entry* e = nullptr;
      int rc = A.read_next_header(a, &e);
      if (rc == ARCHIVE_EOF) break;
      if (rc < ARCHIVE_WARN) {
        Fail(Error(EINVAL, "tar upload: " + ArchiveError(a)));
        break;
      }
      const char* name = A.entry_pathname(e);
      json entry = {{"name", name ? name : ""}, {"mode", A.entry_perm(e)}};
      const char* hard = A.entry_hardlink(e);
      const auto type = A.entry_filetype(e);
      if (hard) {
        entry["type"] = "hardlink";
        entry["target"] = hard;
      } else if (type == AE_IFDIR) {
        entry["type"] = "dir";
      } else if (type == AE_IFLNK) {
        entry["type"] = "symlink";
        const char* target = A.entry_symlink(e);
        entry["target"] = target ? target : "";
      } else if (type == AE_IFREG) {
        entry["type"] = "file";
      } else {
        continue;  // devices, fifos: not for a sandbox's files
      }
      Status s = stream_->Entry(entry);
      if (s.ok() && entry["type"] == "file") {
        while (true) {
          la_ssize_t n = A.read_data(a, buf.data(), buf.size());
          if (n < 0) {
            s = Error(EINVAL, "tar upload: " + ArchiveError(a));
            break;
          }
          if (n == 0) break;
          s = stream_->Data(std::string_view(buf.data(), static_cast<size_t>(n)));
          if (!s.ok()) break;
        }
        if (s.ok()) s = stream_->EndFile();
      }
      if (!s.ok()) {
        Fail(s);
        break;
      }
    }
    A.read_free(a);
    // (fd closes here: a writer still pushing gets EPIPE and stops.)
  }

  std::unique_ptr<AgentClient::TreeStream> stream_;
  UniqueFd write_end_;
  std::thread reader_;
  std::mutex mu_;
  Status error_;
};

struct WriteContext {
  const std::function<bool(std::string_view)>* write;
  bool gone = false;
};

la_ssize_t WriteCallback(archive*, void* ctx, const void* data, size_t n) {
  auto* c = static_cast<WriteContext*>(ctx);
  if (c->gone || !(*c->write)(std::string_view(static_cast<const char*>(data), n))) {
    c->gone = true;
    return -1;
  }
  return static_cast<la_ssize_t>(n);
}

}  // namespace

Result<std::unique_ptr<HttpServer::Upload>> TarUpload(std::unique_ptr<AgentClient::TreeStream> stream) {
  STRATA_RETURN_IF_ERROR(Archive().status.Annotate("tar upload"));
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) return ErrnoError(errno, "tar upload: pipe");
  return std::unique_ptr<HttpServer::Upload>(new TarToTree(std::move(stream), UniqueFd(p[0]), UniqueFd(p[1])));
}

Status CheckTree(AgentClient& agent, const std::string& path) {
  Status s = agent.GetTree(path, [](const json&) { return Error(ECANCELED, "enough"); }, [](std::string_view) { return OkStatus(); });
  return s.code() == ECANCELED ? OkStatus() : s;
}

Status TreeToTar(AgentClient& agent, const std::string& path, const std::function<bool(std::string_view)>& write) {
  STRATA_RETURN_IF_ERROR(Archive().status.Annotate("tar download"));
  const auto& A = Archive();
  archive* a = A.write_new();
  A.write_set_format_pax_restricted(a);
  WriteContext ctx{&write};
  if (A.write_open(a, &ctx, nullptr, WriteCallback, nullptr) != ARCHIVE_OK) {
    Status s = Error(EIO, "tar download: " + ArchiveError(a));
    A.write_free(a);
    return s;
  }
  Status s = agent.GetTree(
      path,
      [&](const json& entry) -> Status {
        archive_entry* e = A.entry_new();
        const std::string name = entry.value("name", "");
        const std::string type = entry.value("type", "");
        A.entry_set_pathname(e, name.c_str());
        A.entry_set_perm(e, entry.value("mode", 0644u));
        A.entry_set_mtime(e, entry.value("mtime", int64_t{0}), 0);
        if (type == "dir") {
          A.entry_set_filetype(e, AE_IFDIR);
        } else if (type == "symlink") {
          A.entry_set_filetype(e, AE_IFLNK);
          A.entry_set_symlink(e, entry.value("target", "").c_str());
        } else {
          A.entry_set_filetype(e, AE_IFREG);
          A.entry_set_size(e, entry.value("size", int64_t{0}));
        }
        int rc = A.write_header(a, e);
        A.entry_free(e);
        if (ctx.gone) return Error(ECANCELED, "tar download: the client went away");
        return rc < ARCHIVE_WARN ? Error(EIO, "tar download: " + ArchiveError(a)) : OkStatus();
      },
      [&](std::string_view data) -> Status {
        if (A.write_data(a, data.data(), data.size()) < 0) {
          return ctx.gone ? Error(ECANCELED, "tar download: the client went away") : Error(EIO, "tar download: " + ArchiveError(a));
        }
        return OkStatus();
      });
  if (s.ok() && A.write_close(a) != ARCHIVE_OK) s = Error(EIO, "tar download: " + ArchiveError(a));
  A.write_free(a);
  return s;
}

}  // namespace strata::launcher
