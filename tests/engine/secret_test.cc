// engine/secret.h: random hex identifiers and constant-time comparison of secrets.
#include "engine/secret.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace collectived {
namespace {

TEST(SecretTest, RandomHexHasTheAskedLengthInLowercaseHex) {
  for (size_t bytes : {1u, 16u, 32u}) {
    const std::string id = RandomHex(bytes);
    EXPECT_EQ(id.size(), 2 * bytes);
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  }
}

TEST(SecretTest, RandomHexNeverRepeatsAndUsesEveryDigit) {
  std::set<std::string> seen;
  std::set<char> digits;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = RandomHex(16);
    EXPECT_TRUE(seen.insert(id).second) << "repeated " << id;
    digits.insert(id.begin(), id.end());
  }
  EXPECT_EQ(digits.size(), 16u);
}

TEST(SecretTest, SecretEqualsComparesWholeContents) {
  EXPECT_TRUE(SecretEquals("", ""));
  EXPECT_TRUE(SecretEquals("token", "token"));
  EXPECT_FALSE(SecretEquals("token", "Token"));
  EXPECT_FALSE(SecretEquals("token", "tokeN"));
  EXPECT_FALSE(SecretEquals("token", "token2"));
  EXPECT_FALSE(SecretEquals("token2", "token"));
  EXPECT_FALSE(SecretEquals("", "x"));
  // A shorter input that is a prefix padded with NULs is not equal either.
  EXPECT_FALSE(SecretEquals(std::string("ab\0", 3), "ab"));
}

}  // namespace
}  // namespace collectived
