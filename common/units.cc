// Size and duration parsing.
#include "common/units.h"

#include <cerrno>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <string>

#include "common/strings.h"

namespace strata {
namespace {

// Splits "1.5GiB" into 1.5 and "GiB".
bool SplitNumber(std::string_view text, double* number, std::string_view* suffix) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return false;
  std::string digits(text.substr(0, i));
  char* end = nullptr;
  errno = 0;
  *number = std::strtod(digits.c_str(), &end);
  if (errno != 0 || end != digits.c_str() + digits.size() || !std::isfinite(*number)) return false;
  *suffix = text.substr(i);
  while (!suffix->empty() && suffix->front() == ' ') suffix->remove_prefix(1);
  return true;
}

}  // namespace

Result<uint64_t> ParseSize(std::string_view text) {
  double number;
  std::string_view suffix;
  if (!SplitNumber(text, &number, &suffix)) {
    return Error(EINVAL, StrCat("size ", Quote(text), ": expected a number with an optional unit (K, M, G, T)"));
  }
  double scale = 1;
  std::string unit(suffix);
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (unit.ends_with("IB")) unit.resize(unit.size() - 2);
  else if (unit.ends_with("B")) unit.resize(unit.size() - 1);
  if (unit.empty()) scale = 1;
  else if (unit == "K") scale = 1024.0;
  else if (unit == "M") scale = 1024.0 * 1024;
  else if (unit == "G") scale = 1024.0 * 1024 * 1024;
  else if (unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "P") scale = 1024.0 * 1024 * 1024 * 1024 * 1024;
  else return Error(EINVAL, StrCat("size ", Quote(text), ": unknown unit ", Quote(suffix)));
  double bytes = number * scale;
  if (bytes >= 1.8e19) return Error(EINVAL, StrCat("size ", Quote(text), ": too large"));
  return static_cast<uint64_t>(std::llround(bytes));
}

Result<Duration> ParseDuration(std::string_view text) {
  double number;
  std::string_view suffix;
  if (!SplitNumber(text, &number, &suffix)) {
    return Error(EINVAL, StrCat("duration ", Quote(text), ": expected a number with a unit (ms, s, m, h, d)"));
  }
  double seconds;
  if (suffix.empty() || suffix == "s") seconds = number;
  else if (suffix == "ms") seconds = number / 1e3;
  else if (suffix == "us") seconds = number / 1e6;
  else if (suffix == "m" || suffix == "min") seconds = number * 60;
  else if (suffix == "h") seconds = number * 3600;
  else if (suffix == "d") seconds = number * 86400;
  else return Error(EINVAL, StrCat("duration ", Quote(text), ": unknown unit ", Quote(suffix)));
  if (seconds > 1e9) return Error(EINVAL, StrCat("duration ", Quote(text), ": too long"));
  return Duration(static_cast<int64_t>(std::llround(seconds * 1e9)));
}

}  // namespace strata
