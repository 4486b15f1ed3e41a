// engine/random_id.h: random hex identifiers.
#include "engine/random_id.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace collectived {
namespace {

TEST(RandomIdTest, RandomHexHasTheAskedLengthInLowercaseHex) {
  for (size_t bytes : {1u, 16u, 32u}) {
    const std::string id = RandomHex(bytes);
    EXPECT_EQ(id.size(), 2 * bytes);
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  }
}

TEST(RandomIdTest, RandomHexNeverRepeatsAndUsesEveryDigit) {
  std::set<std::string> seen;
  std::set<char> digits;
  for (int i = 0; i < 1000; ++i) {
    const std::string id = RandomHex(16);
    EXPECT_TRUE(seen.insert(id).second) << "repeated " << id;
    digits.insert(id.begin(), id.end());
  }
  EXPECT_EQ(digits.size(), 16u);
}

}  // namespace
}  // namespace collectived
