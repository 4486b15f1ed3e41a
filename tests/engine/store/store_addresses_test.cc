// The store address a group is created with: one store, or an ordered list of them.
#include "engine/store/store_addresses.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace collectived {
namespace {

using ::testing::HasSubstr;
using Addresses = std::vector<std::string>;

TEST(StoreAddressesTest, OneAddressOrNoneIsItself) {
  EXPECT_EQ(*ParseStoreAddresses(""), Addresses{""});
  EXPECT_EQ(*ParseStoreAddresses("unix:/run/collectived.sock"),
            Addresses{"unix:/run/collectived.sock"});
}

TEST(StoreAddressesTest, AListKeepsItsOrder) {
  EXPECT_EQ(*ParseStoreAddresses("store-0:7490,node-1:7490,node-0:7490"),
            (Addresses{"store-0:7490", "node-1:7490", "node-0:7490"}));
}

TEST(StoreAddressesTest, AnEmptyOrRepeatedEntryIsRefusedByItsPlace) {
  Status empty = ParseStoreAddresses("a:1,,b:2").status();
  EXPECT_TRUE(empty.IsInvalidArgument());
  EXPECT_THAT(empty.message(), HasSubstr("entry 2 is empty"));
  EXPECT_THAT(ParseStoreAddresses("a:1,").status().message(), HasSubstr("entry 2 is empty"));
  Status twice = ParseStoreAddresses("a:1,b:2,a:1").status();
  EXPECT_TRUE(twice.IsInvalidArgument());
  EXPECT_THAT(twice.message(), HasSubstr("entry 3 ('a:1') is listed twice"));
}

TEST(StoreAddressesTest, TheListAndEachAddressAreBounded) {
  std::string many;
  for (size_t i = 0; i <= kMaxStoreAddresses; ++i) many += (i ? ",h" : "h") + std::to_string(i);
  EXPECT_THAT(ParseStoreAddresses(many).status().message(), HasSubstr("more than 16 stores"));
  const std::string long_address(kMaxStoreAddressBytes + 1, 'x');
  EXPECT_THAT(ParseStoreAddresses("a:1," + long_address).status().message(),
              HasSubstr("entry 2 has 257 bytes"));
  EXPECT_THAT(ParseStoreAddresses(long_address).status().message(),
              HasSubstr("257 bytes, more than the 256 accepted"));
  std::string at_most;
  for (size_t i = 0; i < kMaxStoreAddresses; ++i) at_most += (i ? ",h" : "h") + std::to_string(i);
  EXPECT_EQ(ParseStoreAddresses(at_most)->size(), kMaxStoreAddresses);
}

}  // namespace
}  // namespace collectived
