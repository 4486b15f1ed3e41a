#include "bench/bench_args.h"

#include <cstdlib>

namespace collectived {

std::vector<std::string> Split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string::npos) return parts;
    start = end + 1;
  }
}

size_t ParseBytes(const std::string& text) {
  char* end = nullptr;
  unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str()) return 0;
  std::string suffix(end);
  if (suffix == "K" || suffix == "k" || suffix == "KiB")
    value <<= 10;
  else if (suffix == "M" || suffix == "MiB")
    value <<= 20;
  else if (suffix == "G" || suffix == "GiB")
    value <<= 30;
  else if (!suffix.empty() && suffix != "B")
    return 0;
  return static_cast<size_t>(value);
}

std::vector<size_t> ParseSizes(const std::string& text) {
  std::vector<size_t> sizes;
  if (text.find(':') != std::string::npos) {
    std::vector<std::string> parts = Split(text, ':');
    if (parts.size() < 2 || parts.size() > 3) return {};
    size_t min = ParseBytes(parts[0]), max = ParseBytes(parts[1]);
    size_t factor = parts.size() == 3 ? ParseBytes(parts[2]) : 4;
    if (min == 0 || max < min || factor < 2) return {};
    for (size_t s = min; s <= max; s *= factor) sizes.push_back(s);
    if (sizes.back() != max) sizes.push_back(max);
    return sizes;
  }
  for (const std::string& part : Split(text, ',')) {
    size_t bytes = ParseBytes(part);
    if (bytes == 0) return {};
    sizes.push_back(bytes);
  }
  return sizes;
}

}  // namespace collectived
