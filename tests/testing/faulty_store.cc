// FaultyStore: deliberate failures behind the ObjectStore interface.
#include "tests/testing/faulty_store.h"

#include <thread>

#include "common/strings.h"

namespace strata::testing {

void FaultyStore::CloseGate() {
  std::lock_guard lock(mu_);
  gate_closed_ = true;
}

void FaultyStore::OpenGate() {
  {
    std::lock_guard lock(mu_);
    gate_closed_ = false;
  }
  gate_cv_.notify_all();
}

int FaultyStore::GetsOf(std::string_view key) const {
  std::lock_guard lock(mu_);
  auto it = per_key_.find(key);
  return it == per_key_.end() ? 0 : it->second;
}

void FaultyStore::ResetCounts() {
  std::lock_guard lock(mu_);
  per_key_.clear();
  gets_ = 0;
}

Status FaultyStore::BeforeRead(std::string_view key) {
  ++gets_;
  {
    std::unique_lock lock(mu_);
    ++per_key_[std::string(key)];
    gate_cv_.wait(lock, [&] { return !gate_closed_; });
  }
  if (int64_t d = delay_ns_.load()) std::this_thread::sleep_for(std::chrono::nanoseconds(d));
  if (down_) return Error(ECONNREFUSED, StrCat("faulty store: get ", key, ": store is down"));
  if (fail_left_.fetch_sub(1) > 0) return Error(fail_code_.load(), StrCat("faulty store: get ", key, ": injected failure"));
  return OkStatus();
}

Status FaultyStore::Put(std::string_view key, std::string_view data) {
  // Count down to 0 and stay there: once failing, every put fails (a bare
  // fetch_sub would go negative, which means "let every put through").
  int left = puts_left_.load();
  while (left >= 0) {
    if (left == 0) return Error(put_code_.load(), StrCat("faulty store: put ", key, ": injected failure"));
    if (puts_left_.compare_exchange_weak(left, left - 1)) break;
  }
  ++puts_;
  if (int64_t ns = put_delay_ns_.load()) std::this_thread::sleep_for(std::chrono::nanoseconds(ns));
  return inner_->Put(key, data);
}

Result<std::string> FaultyStore::Get(std::string_view key) {
  STRATA_RETURN_IF_ERROR(BeforeRead(key));
  auto data = inner_->Get(key);
  if (data.ok() && corrupt_ && !data->empty()) (*data)[data->size() / 2] ^= 0x01;
  return data;
}

Result<size_t> FaultyStore::GetRange(std::string_view key, uint64_t offset, std::span<char> out) {
  STRATA_RETURN_IF_ERROR(BeforeRead(key));
  auto n = inner_->GetRange(key, offset, out);
  if (n.ok() && corrupt_ && *n > 0) out[*n / 2] ^= 0x01;
  return n;
}

}  // namespace strata::testing
