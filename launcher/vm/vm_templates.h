// VmTemplates: saved states of freshly booted microVMs, from which later
// microVMs of the same stack and machine resume instead of booting
// (DESIGN.md's fast starts; docs/vmm.md, "Templates").
//
// A template is a directory `<dir>/<key>/` holding `state` (QEMU's
// migration stream of the whole machine, saved after the guest's agent
// first answered and before it learnt whose sandbox it is: no sandbox's
// data or name is in it) and `disk.img` (the upper disk as the guest had
// it then). The key names everything the saved machine depends on
// (MicroVm::TemplateKey). One process makes a key's template at a time
// (an flock on `.<key>.lock`, never removed), in a directory
// `.<key>.tmp-*` of its own, published by a rename; the least recently used
// beyond `keep` are removed.
#pragma once

#include <optional>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace strata::launcher {

// A template as found: its directory held open, so its two files are one
// template's even if it is replaced or removed meanwhile (paths through
// /proc/self/fd).
struct VmTemplate {
  std::string key, state, disk;
  UniqueFd dir;
};

class VmTemplates {
 public:
  VmTemplates(std::string dir, size_t keep) : dir_(std::move(dir)), keep_(keep) {}
  bool enabled() const { return keep_ > 0; }

  // The template of `key`, if one is ready; its use is recorded.
  std::optional<VmTemplate> Find(const std::string& key) const;

  // The right to make `key`'s template: where to write it, then Publish.
  // Dropping it unpublished removes what was written.
  class Claim {
   public:
    Claim(Claim&& other) noexcept { *this = std::move(other); }
    Claim& operator=(Claim&& other) noexcept;
    ~Claim();
    const std::string& state_path() const { return state_; }
    const std::string& disk_path() const { return disk_; }
    // Makes it the key's template (written to disk first), then removes the
    // least recently used beyond the store's `keep`.
    Status Publish();

   private:
    friend class VmTemplates;
    Claim() = default;
    const VmTemplates* store_ = nullptr;
    std::string key_, tmp_, state_, disk_;
    UniqueFd lock_;
    bool done_ = false;
  };
  // nullopt when the key has a template, another process is making one,
  // or templates are off.
  std::optional<Claim> Begin(const std::string& key) const;

  // Removes the template `t` found, if it is still the key's (one that
  // failed to restore).
  void Drop(const VmTemplate& t) const;

 private:
  void Evict() const;
  void Remove(const std::string& key) const;
  std::string dir_;
  size_t keep_;
};

}  // namespace strata::launcher
