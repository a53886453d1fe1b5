// Leveled logging to stderr, one write(2) per line so lines from threads and
// processes never interleave.
//
//   STRATA_LOG(kInfo) << "mounted " << digest << " at " << path;
//
// The level comes from SetLogLevel() or the STRATA_LOG environment variable
// (error, warn, info, debug); the default is warn.
#pragma once

#include <sstream>
#include <string_view>

namespace strata {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
bool ParseLogLevel(std::string_view name, LogLevel* level);
// Prefix for every line, normally the program name ("lazyfs").
void SetLogTag(std::string_view tag);

class LogLine {
 public:
  explicit LogLine(LogLevel level) : level_(level) {}
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace strata

namespace strata {
// Turns the streamed LogLine into void so STRATA_LOG fits in a ?: expression.
struct LogVoidify {
  void operator&(const LogLine&) {}
};
}  // namespace strata

#define STRATA_LOG(level)                                              \
  (::strata::LogLevel::level > ::strata::GetLogLevel())                \
      ? (void)0                                                        \
      : ::strata::LogVoidify() & ::strata::LogLine(::strata::LogLevel::level)
