// Command-line values shared by the benchmarks: byte sizes ("64M") and lists or ranges of them.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace collectived {

// "a,b,,c" -> {"a", "b", "", "c"}.
std::vector<std::string> Split(const std::string& text, char separator);

// "64M" -> 67108864 (suffixes K, M, G as powers of 1024, also KiB/MiB/GiB, and B). Returns 0 when
// malformed.
size_t ParseBytes(const std::string& text);

// "8,1K,32M", or "MIN:MAX[:FACTOR]" (factor 4 by default; MAX always included). Empty on error.
std::vector<size_t> ParseSizes(const std::string& text);

}  // namespace collectived
