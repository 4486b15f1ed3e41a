#include "engine/group/rendezvous/job_token.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace collectived {
namespace {

std::string Hex(const std::string& bytes) {
  static const char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : bytes) {
    hex.push_back(kDigits[c >> 4]);
    hex.push_back(kDigits[c & 15]);
  }
  return hex;
}

// RFC 4231, test case 2: key "Jefe", data "what do ya want for nothing?".
constexpr char kRfc4231Case2[] = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843";

TEST(HmacSha256Test, MatchesRfc4231) {
  EXPECT_EQ(Hex(HmacSha256("Jefe", "what do ya want for nothing?")), kRfc4231Case2);
}

TEST(KeyedHmacSha256Test, MatchesRfc4231AndTheOneShotDigest) {
  const KeyedHmacSha256 keyed("Jefe");
  EXPECT_EQ(Hex(keyed.Digest("what do ya want for nothing?")), kRfc4231Case2);
  // The keyed context is copied, never consumed: every digest starts from the key alone.
  const std::string long_key(200, 'k');  // longer than a SHA-256 block: hashed into the key
  const KeyedHmacSha256 keyed_long(long_key);
  for (const std::string message : {"", "a", "session-id-0123456789abcdef", "a"}) {
    EXPECT_EQ(keyed.Digest(message), HmacSha256("Jefe", message)) << message;
    EXPECT_EQ(keyed_long.Digest(message), HmacSha256(long_key, message)) << message;
  }
}

TEST(KeyedHmacSha256Test, ConcurrentDigestsAgree) {
  const KeyedHmacSha256 keyed("registry secret");
  const std::string expected = HmacSha256("registry secret", "id");
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000; ++i) mismatches[t] += keyed.Digest("id") != expected;
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

}  // namespace
}  // namespace collectived
