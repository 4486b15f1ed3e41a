#include "engine/vocabulary/random_id.h"

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
  return ToHex(std::string_view(reinterpret_cast<const char*>(random.data()), random.size()));
}

std::string ToHex(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string text;
  text.reserve(2 * bytes.size());
  for (unsigned char byte : bytes) {
    text.push_back(kHex[byte >> 4]);
    text.push_back(kHex[byte & 0x0f]);
  }
  return text;
}

bool FromHex(std::string_view text, void* out, size_t bytes) {
  if (text.size() != 2 * bytes) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  auto* p = static_cast<unsigned char*>(out);
  for (size_t i = 0; i < bytes; ++i) {
    const int high = digit(text[2 * i]);
    const int low = digit(text[2 * i + 1]);
    if (high < 0 || low < 0) return false;
    p[i] = static_cast<unsigned char>(high * 16 + low);
  }
  return true;
}

}  // namespace collectived
