// Leveled stderr logging.
#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <ctime>
#include <mutex>
#include <string>

namespace strata {
namespace {

LogLevel LevelFromEnv() {
  LogLevel level = LogLevel::kWarn;
  if (const char* env = std::getenv("STRATA_LOG")) ParseLogLevel(env, &level);
  return level;
}

std::atomic<int> g_level{static_cast<int>(LevelFromEnv())};
std::mutex g_tag_mu;
std::string g_tag = "strata";

}  // namespace

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }

bool ParseLogLevel(std::string_view name, LogLevel* level) {
  if (name == "error") *level = LogLevel::kError;
  else if (name == "warn" || name == "warning") *level = LogLevel::kWarn;
  else if (name == "info") *level = LogLevel::kInfo;
  else if (name == "debug") *level = LogLevel::kDebug;
  else return false;
  return true;
}

void SetLogTag(std::string_view tag) {
  std::lock_guard lock(g_tag_mu);
  g_tag = tag;
}

LogLine::~LogLine() {
  static constexpr const char* kNames[] = {"error", "warn", "info", "debug"};
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  tm tm_utc;
  gmtime_r(&ts.tv_sec, &tm_utc);
  char stamp[40];
  strftime(stamp, sizeof stamp, "%H:%M:%S", &tm_utc);
  std::string line;
  {
    std::lock_guard lock(g_tag_mu);
    line = g_tag;
  }
  char frac[16];
  snprintf(frac, sizeof frac, ".%03ld", ts.tv_nsec / 1000000);
  line += std::string(" ") + stamp + frac + " " + kNames[static_cast<int>(level_)] + ": " +
          stream_.str() + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;  // nowhere to report a failed log write
}

}  // namespace strata
