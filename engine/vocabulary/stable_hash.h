// Hashes that every build computes alike (unlike std::hash, which each standard library defines
// its own way), for values that one sidecar writes and another compares.
#pragma once

#include <cstdint>
#include <string_view>

namespace collectived {

// 64-bit FNV-1a (http://www.isthe.com/chongo/tech/comp/fnv/) of `bytes`: offset basis
// 0xcbf29ce484222325, prime 0x100000001b3. Not a defence against someone who chooses the input.
constexpr uint64_t kFnv1a64Offset = 0xcbf29ce484222325ull;

// The hash of what `hash` covered followed by `bytes` (a hash fed piece by piece).
constexpr uint64_t Fnv1a64Extend(uint64_t hash, std::string_view bytes) {
  for (char c : bytes) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

constexpr uint64_t Fnv1a64(std::string_view bytes) {
  return Fnv1a64Extend(kFnv1a64Offset, bytes);
}

}  // namespace collectived
