// Progress line on a terminal.
#include "common/progress.h"

#include <unistd.h>

#include <cstdio>

#include "common/strings.h"

namespace strata {

Progress::Progress(std::string label, uint64_t total)
    : label_(std::move(label)), total_(total), enabled_(::isatty(STDERR_FILENO)), start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() {
  if (!enabled_) return;
  std::lock_guard lock(mu_);
  if (drawn_) std::fprintf(stderr, "\r\033[K");
}

void Progress::Add(uint64_t bytes) {
  done_ += bytes;
  if (enabled_) Draw(false);
}

void Progress::Draw(bool force) {
  auto now = std::chrono::steady_clock::now();
  std::unique_lock lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  if (!force && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  drawn_ = true;
  double secs = std::chrono::duration<double>(now - start_).count();
  uint64_t done = done_.load(), total = total_.load();
  double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
  std::string line = StrCat(label_, "  ", FormatBytes(done));
  if (total) line += " / " + FormatBytes(total);
  line += "  " + FormatBytes(static_cast<uint64_t>(rate)) + "/s";
  if (total && rate > 0 && done < total) {
    line += StrCat("  ETA ", static_cast<uint64_t>(static_cast<double>(total - done) / rate + 0.5), "s");
  }
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
}

}  // namespace strata
