// ResourceLedger: per-session shares and sidecar-wide totals, refusals that name the resource,
// the limit and the flag, and what claims give back.
#include "engine/sidecar/resource_ledger.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace collectived {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<ResourceLedger> GroupsLedger(uint64_t each, uint64_t total,
                                             std::vector<Resource>* refused = nullptr) {
  ResourceCeilings ceilings = ResourceCeilings::Defaults(MachineLimits::OfThisProcess());
  ceilings[Resource::kGroups] = {each, total};
  return ResourceLedger::Create(ceilings, [refused](Resource r) {
    if (refused) refused->push_back(r);
  });
}

TEST(ResourceLedger, ASessionGetsItsShareAndNoMore) {
  std::vector<Resource> refused;
  auto ledger = GroupsLedger(2, 10, &refused);
  auto share = std::make_shared<ResourceShare>("session s4");
  auto a = ledger->Claim(share, Resource::kGroups, 1);
  auto b = ledger->Claim(share, Resource::kGroups, 1);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = ledger->Claim(share, Resource::kGroups, 1);
  ASSERT_EQ(c.status().kind(), ErrorKind::kResourceExhausted);
  EXPECT_THAT(c.status().message(),
              HasSubstr("groups: session s4 holds 2, its share is 2 (--client-max-groups "
                        "raises it)"));
  EXPECT_EQ(refused, std::vector<Resource>{Resource::kGroups});
  EXPECT_EQ(ledger->HeldBy(*share, Resource::kGroups), 2u);
}

TEST(ResourceLedger, TheTotalBoundsAllSessionsAndClaimsGiveBack) {
  auto ledger = GroupsLedger(3, 4);
  auto first = std::make_shared<ResourceShare>("session s1");
  auto second = std::make_shared<ResourceShare>("session s2");
  std::vector<ResourceClaim> held;
  for (int i = 0; i < 3; ++i) held.push_back(*ledger->Claim(first, Resource::kGroups, 1));
  held.push_back(*ledger->Claim(second, Resource::kGroups, 1));
  auto refused = ledger->Claim(second, Resource::kGroups, 1);
  ASSERT_EQ(refused.status().kind(), ErrorKind::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("groups: the sidecar holds 4 for all clients, its total is 4 "
                        "(--max-groups raises it)"));
  held.erase(held.begin());  // first gives one back
  EXPECT_EQ(ledger->InUse(Resource::kGroups), 3u);
  EXPECT_TRUE(ledger->Claim(second, Resource::kGroups, 1).ok());  // and gives it back at once
  EXPECT_EQ(ledger->InUse(Resource::kGroups), 3u);
  held.clear();
  EXPECT_EQ(ledger->InUse(Resource::kGroups), 0u);
  EXPECT_EQ(ledger->HeldBy(*first, Resource::kGroups), 0u);
}

TEST(ResourceLedger, AnAmountLargerThanWhatIsLeftIsRefusedWithoutOverflow) {
  ResourceCeilings ceilings = ResourceCeilings::Defaults(MachineLimits::OfThisProcess());
  ceilings[Resource::kMappedBytes] = {1 << 20, 1 << 21};
  auto ledger = ResourceLedger::Create(ceilings, nullptr);
  auto share = std::make_shared<ResourceShare>("session s1");
  auto huge = ledger->Claim(share, Resource::kMappedBytes, ~uint64_t{0});
  ASSERT_EQ(huge.status().kind(), ErrorKind::kResourceExhausted);
  EXPECT_THAT(huge.status().message(), HasSubstr("--client-max-mapped-bytes"));
  EXPECT_EQ(ledger->InUse(Resource::kMappedBytes), 0u);
}

TEST(ResourceLedger, ConcurrentClaimsNeverPassTheTotal) {
  auto ledger = GroupsLedger(1000, 100);
  std::vector<std::thread> threads;
  std::vector<std::vector<ResourceClaim>> held(8);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto share = std::make_shared<ResourceShare>("s" + std::to_string(t));
      for (int i = 0; i < 50; ++i) {
        auto claim = ledger->Claim(share, Resource::kGroups, 1);
        if (claim.ok()) held[t].push_back(std::move(*claim));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  size_t granted = 0;
  for (const auto& claims : held) granted += claims.size();
  EXPECT_EQ(granted, 100u);
  EXPECT_EQ(ledger->InUse(Resource::kGroups), 100u);
}

TEST(ResourceCeilings, DefaultsFollowTheMachine) {
  MachineLimits small;
  small.physical_memory_bytes = uint64_t{8} << 30;
  small.address_space_bytes = uint64_t{1} << 47;
  small.open_files = 1024;
  small.max_map_count = 65530;
  ResourceCeilings c = ResourceCeilings::Defaults(small);
  // A reserve of descriptors stays for connections and the sidecar's own files.
  EXPECT_EQ(c[Resource::kDescriptors].total, 512u);
  EXPECT_LE(c[Resource::kDescriptors].per_client, c[Resource::kDescriptors].total);
  EXPECT_EQ(c[Resource::kMappedBytes].total, uint64_t{8} << 30);
  EXPECT_EQ(c[Resource::kBuffers].total, 65530u / 4);
  EXPECT_EQ(c[Resource::kPendingBytes].total, uint64_t{2} << 30);
  for (size_t i = 0; i < kResourceCount; ++i) {
    EXPECT_LE(c.of[i].per_client, c.of[i].total) << ResourceName(static_cast<Resource>(i));
    EXPECT_GT(c.of[i].total, 0u) << ResourceName(static_cast<Resource>(i));
  }
  // An address space limit bounds the mappings too.
  small.address_space_bytes = uint64_t{8} << 30;
  EXPECT_EQ(ResourceCeilings::Defaults(small)[Resource::kMappedBytes].total, uint64_t{2} << 30);
}

}  // namespace
}  // namespace collectived
