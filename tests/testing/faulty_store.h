// FaultyStore: an ObjectStore wrapper that fails, stalls and corrupts on
// purpose, and counts requests, so tests can show what the layers above do
// with a bad back end.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

#include "cache/object_store.h"
#include "common/units.h"

namespace strata::testing {

class FaultyStore : public cache::ObjectStore {
 public:
  explicit FaultyStore(std::shared_ptr<cache::ObjectStore> inner) : inner_(std::move(inner)) {}

  // The next `n` reads fail with errno `code`.
  void FailNext(int n, int code = EIO) { fail_left_ = n; fail_code_ = code; }
  // Every read fails while set.
  void SetDown(bool down) { down_ = down; }
  // Every read sleeps this long first.
  void SetDelay(Duration d) { delay_ns_ = d.count(); }
  // Every put sleeps this long first.
  void SetPutDelay(Duration d) { put_delay_ns_ = d.count(); }
  // Every read returns its bytes with one bit flipped while set.
  void SetCorrupt(bool corrupt) { corrupt_ = corrupt; }
  // After `n` more successful puts, every put fails with errno `code`;
  // a negative n lets every put through again.
  void FailPutsAfter(int n, int code = ENOSPC) { puts_left_ = n; put_code_ = code; }
  int puts() const { return puts_.load(); }
  // While closed, reads block until Open() (or the test ends).
  void CloseGate();
  void OpenGate();

  int gets() const { return gets_.load(); }
  int GetsOf(std::string_view key) const;
  void ResetCounts();

  const std::string& url() const override { return inner_->url(); }
  Result<std::string> Get(std::string_view key) override;
  Result<size_t> GetRange(std::string_view key, uint64_t offset, std::span<char> out) override;
  Status Put(std::string_view key, std::string_view data) override;
  Result<uint64_t> Size(std::string_view key) override { return inner_->Size(key); }
  Result<cache::ListPage> List(std::string_view prefix, std::string_view token, size_t max_keys) override {
    return inner_->List(prefix, token, max_keys);
  }
  Status Delete(std::string_view key) override { return inner_->Delete(key); }

 private:
  Status BeforeRead(std::string_view key);

  std::shared_ptr<cache::ObjectStore> inner_;
  std::atomic<int> fail_left_{0};
  std::atomic<int> fail_code_{EIO};
  std::atomic<bool> down_{false};
  std::atomic<bool> corrupt_{false};
  std::atomic<int64_t> delay_ns_{0};
  std::atomic<int64_t> put_delay_ns_{0};
  std::atomic<int> gets_{0};
  std::atomic<int> puts_{0};
  std::atomic<int> puts_left_{-1};
  std::atomic<int> put_code_{ENOSPC};
  mutable std::mutex mu_;
  std::condition_variable gate_cv_;
  bool gate_closed_ = false;
  std::map<std::string, int, std::less<>> per_key_;
};

}  // namespace strata::testing
