#include "engine/secret.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace collectived {

std::string RandomHex(size_t bytes) {
  std::vector<unsigned char> random(bytes);
  size_t filled = 0;
  while (filled < bytes) {
    ssize_t got = ::getrandom(random.data() + filled, bytes - filled, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      std::fprintf(stderr, "collectived: the kernel gives no random bytes (getrandom: %s)\n",
                   std::strerror(errno));
      std::abort();
    }
    filled += static_cast<size_t>(got);
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * bytes);
  for (unsigned char byte : random) {
    text.push_back(kHex[byte >> 4]);
    text.push_back(kHex[byte & 0x0f]);
  }
  return text;
}

bool SecretEquals(std::string_view a, std::string_view b) {
  // Every byte of the longer input is visited whatever the contents; a length mismatch is
  // folded in rather than returned early.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    difference |= static_cast<unsigned char>(x ^ y);
  }
  // Read through a volatile so the compiler cannot turn the loop into an early-exit memcmp.
  volatile unsigned char result = difference;
  return result == 0;
}

}  // namespace collectived
