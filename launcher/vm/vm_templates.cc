#include "launcher/vm/vm_templates.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "common/fs.h"
#include "common/log.h"
#include "common/strings.h"

namespace strata::launcher {

namespace {

bool IsKey(const std::string& name) {
  return !name.empty() && name[0] != '.' && name.find('.') == std::string::npos;
}

Status SyncFile(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(UniqueFd fd, OpenFile(path, O_RDONLY));
  if (::fsync(fd.get()) != 0) return ErrnoError(errno, "fsync " + path);
  return OkStatus();
}

}  // namespace

std::optional<VmTemplate> VmTemplates::Find(const std::string& key) const {
  if (!enabled()) return std::nullopt;
  VmTemplate t{key, StrCat(dir_, "/", key, "/state"), StrCat(dir_, "/", key, "/disk.img")};
  if (::access(t.state.c_str(), R_OK) != 0 || ::access(t.disk.c_str(), R_OK) != 0) return std::nullopt;
  ::utimensat(AT_FDCWD, t.state.c_str(), nullptr, 0);  // its last use, for Evict
  return t;
}

std::optional<VmTemplates::Claim> VmTemplates::Begin(const std::string& key) const {
  if (!enabled() || Find(key)) return std::nullopt;
  if (!MakeDirs(dir_, 0700).ok()) return std::nullopt;
  Claim c;
  c.lock_ = UniqueFd(::open(StrCat(dir_, "/.", key, ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!c.lock_ || ::flock(c.lock_.get(), LOCK_EX | LOCK_NB) != 0) return std::nullopt;
  if (Find(key)) return std::nullopt;  // made while we took the lock
  c.store_ = this;
  c.key_ = key;
  c.tmp_ = StrCat(dir_, "/.", key, ".tmp");
  RemoveTree(c.tmp_).IgnoreError();  // a maker that died
  if (!MakeDirs(c.tmp_, 0700).ok()) return std::nullopt;
  c.state_ = c.tmp_ + "/state";
  c.disk_ = c.tmp_ + "/disk.img";
  return c;
}

VmTemplates::Claim::~Claim() {
  if (store_ && !done_) RemoveTree(tmp_).IgnoreError();
}

Status VmTemplates::Claim::Publish() {
  const std::string target = StrCat(store_->dir_, "/", key_);
  STRATA_RETURN_IF_ERROR(SyncFile(state_).Annotate("publish the microVM template " + key_));
  STRATA_RETURN_IF_ERROR(SyncFile(disk_).Annotate("publish the microVM template " + key_));
  if (::rename(tmp_.c_str(), target.c_str()) != 0) return ErrnoError(errno, "publish the microVM template " + key_);
  done_ = true;
  if (UniqueFd dir(::open(store_->dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); dir) ::fsync(dir.get());
  store_->Evict();
  return OkStatus();
}

void VmTemplates::Drop(const std::string& key) const {
  Status s = RemoveTree(StrCat(dir_, "/", key));
  if (!s.ok()) STRATA_LOG(kWarn) << "remove the microVM template " << key << ": " << s.ToString();
}

void VmTemplates::Evict() const {
  std::vector<std::pair<int64_t, std::string>> found;  // (last use, key)
  if (DIR* d = ::opendir(dir_.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      struct ::stat st{};
      if (!IsKey(name) || ::stat(StrCat(dir_, "/", name, "/state").c_str(), &st) != 0) continue;
      found.emplace_back(static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec, name);
    }
    ::closedir(d);
  }
  if (found.size() <= keep_) return;
  std::sort(found.begin(), found.end());
  for (size_t i = 0; i + keep_ < found.size(); ++i) {
    Drop(found[i].second);
    ::unlink(StrCat(dir_, "/.", found[i].second, ".lock").c_str());
  }
}

}  // namespace strata::launcher
