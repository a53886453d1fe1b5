#include "launcher/vm/vm_templates.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
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
  VmTemplate t;
  t.key = key;
  t.dir = UniqueFd(::open(StrCat(dir_, "/", key).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!t.dir) return std::nullopt;
  if (::faccessat(t.dir.get(), "state", R_OK, 0) != 0 || ::faccessat(t.dir.get(), "disk.img", R_OK, 0) != 0) return std::nullopt;
  t.state = StrCat("/proc/self/fd/", t.dir.get(), "/state");
  t.disk = StrCat("/proc/self/fd/", t.dir.get(), "/disk.img");
  ::utimensat(t.dir.get(), "state", nullptr, 0);  // its last use, for Evict
  return t;
}

std::optional<VmTemplates::Claim> VmTemplates::Begin(const std::string& key) const {
  if (!enabled() || Find(key)) return std::nullopt;
  if (!MakeDirs(dir_, 0700).ok()) return std::nullopt;
  Claim c;
  c.lock_ = UniqueFd(::open(StrCat(dir_, "/.", key, ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!c.lock_ || ::flock(c.lock_.get(), LOCK_EX | LOCK_NB) != 0) return std::nullopt;
  if (Find(key)) return std::nullopt;  // made while we took the lock
  // What makers of this key that died left (only the lock's holder makes).
  const std::string prefix = StrCat(".", key, ".tmp-");
  if (DIR* d = ::opendir(dir_.c_str())) {
    std::vector<std::string> stale;
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).starts_with(prefix)) stale.push_back(StrCat(dir_, "/", e->d_name));
    }
    ::closedir(d);
    for (const auto& path : stale) RemoveTree(path).IgnoreError();
  }
  std::string tmp = StrCat(dir_, "/", prefix, "XXXXXX");
  if (::mkdtemp(tmp.data()) == nullptr) return std::nullopt;
  c.store_ = this;
  c.key_ = key;
  c.tmp_ = tmp;
  c.state_ = c.tmp_ + "/state";
  c.disk_ = c.tmp_ + "/disk.img";
  return c;
}

VmTemplates::Claim& VmTemplates::Claim::operator=(Claim&& other) noexcept {
  if (this != &other) {
    if (store_ && !done_) RemoveTree(tmp_).IgnoreError();
    store_ = std::exchange(other.store_, nullptr);
    key_ = std::move(other.key_);
    tmp_ = std::move(other.tmp_);
    state_ = std::move(other.state_);
    disk_ = std::move(other.disk_);
    lock_ = std::move(other.lock_);
    done_ = other.done_;
  }
  return *this;
}

VmTemplates::Claim::~Claim() {
  if (store_ && !done_) RemoveTree(tmp_).IgnoreError();
}

Status VmTemplates::Claim::Publish() {
  const std::string target = StrCat(store_->dir_, "/", key_);
  STRATA_RETURN_IF_ERROR(SyncFile(state_).Annotate("publish the microVM template " + key_));
  STRATA_RETURN_IF_ERROR(SyncFile(disk_).Annotate("publish the microVM template " + key_));
  if (::rename(tmp_.c_str(), target.c_str()) != 0) {
    // A key's directory without both files (Find saw none): what a removal
    // cut short left. The lock is ours: it goes.
    if (errno != ENOTEMPTY && errno != EEXIST) return ErrnoError(errno, "publish the microVM template " + key_);
    RemoveTree(target).IgnoreError();
    if (::rename(tmp_.c_str(), target.c_str()) != 0) return ErrnoError(errno, "publish the microVM template " + key_);
  }
  done_ = true;
  if (UniqueFd dir(::open(store_->dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)); dir) ::fsync(dir.get());
  store_->Evict();
  return OkStatus();
}

void VmTemplates::Drop(const VmTemplate& t) const {
  struct ::stat found{}, now{};
  if (::fstat(t.dir.get(), &found) != 0 || ::stat(StrCat(dir_, "/", t.key).c_str(), &now) != 0) return;
  if (found.st_ino != now.st_ino || found.st_dev != now.st_dev) return;  // replaced meanwhile
  Remove(t.key);
}

void VmTemplates::Remove(const std::string& key) const {
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
  // (Their lock files stay: a maker may hold one. A restore that found
  // one of these holds its directory open and still reads it.)
  for (size_t i = 0; i + keep_ < found.size(); ++i) Remove(found[i].second);
}

}  // namespace strata::launcher
