// engine/vocabulary/random_id.h: random hex identifiers.
#include "engine/vocabulary/random_id.h"

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

TEST(RandomIdTest, FromHexReadsBackWhatToHexWroteAndRefusesAnythingElse) {
  const std::string bytes("\x00\x01\x7f\x80\xfe\xff", 6);
  const std::string text = ToHex(bytes);
  EXPECT_EQ(text, "00017f80feff");
  std::string back(6, '?');
  ASSERT_TRUE(FromHex(text, back.data(), back.size()));
  EXPECT_EQ(back, bytes);
  EXPECT_FALSE(FromHex(text, back.data(), 5));            // wrong length
  EXPECT_FALSE(FromHex("00017f80feFF", back.data(), 6));  // uppercase is not what ToHex writes
  EXPECT_FALSE(FromHex("00017f80fexz", back.data(), 6));  // not hex
  EXPECT_TRUE(FromHex("", back.data(), 0));
}

}  // namespace
}  // namespace collectived
