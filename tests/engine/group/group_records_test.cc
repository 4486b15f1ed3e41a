// The records sidecars exchange through the rendezvous store: announcements, memberships and
// their refusals, topologies, members' digests, and job-token commitments.
#include "engine/group/rendezvous/group_records.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/group/core/topology.h"
#include "engine/group/rendezvous/job_token.h"
#include "engine/vocabulary/stable_hash.h"

namespace collectived {
namespace {

using ::testing::HasSubstr;

TEST(GroupRecordsTest, AnnouncementsCarryAFixedSizeMembersDigestAndRoundTrip) {
  std::vector<int> many(1024);
  for (int r = 0; r < 1024; ++r) many[r] = r;
  const RankAnnouncement announced{
      "sidecar-7", 2048,           MembersDigest(many), JobTokenCommitment("t", "scope"),
      "cuda:3",    "10.0.0.7:7490"};
  const std::string record = EncodeAnnouncement(announced);
  EXPECT_LT(record.size(), 160u);  // whatever the number of members
  StatusOr<RankAnnouncement> decoded = DecodeAnnouncement(record);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->sidecar_id, "sidecar-7");
  EXPECT_EQ(decoded->world_size, 2048);
  EXPECT_TRUE(decoded->SameGroupAs(announced));
  EXPECT_EQ(decoded->device, "cuda:3");
  EXPECT_EQ(decoded->admin_address, "10.0.0.7:7490");

  std::vector<int> other = many;
  other.back() = 1500;
  EXPECT_NE(MembersDigest(other), MembersDigest(many));
  EXPECT_NE(MembersDigest({0, 1}), MembersDigest({0, 1, 2}));
  EXPECT_EQ(MembersDigest({0, 1}), MembersDigest({0, 1}));

  // A record of the earlier format (the members listed) is refused by name, not half-read.
  StatusOr<RankAnnouncement> old = DecodeAnnouncement("cd11:a1:23:0,11:x");
  EXPECT_TRUE(old.status().IsInvalidArgument());
  EXPECT_THAT(old.status().message(), HasSubstr("rank announcement record is malformed: unknown "
                                                "version"));
}

TEST(GroupRecordsTest, MembershipNamesEachSidecarOnceAndRoundTrips) {
  std::vector<std::string> announcements;
  for (int r = 0; r < 6; ++r) {
    const std::string sidecar = r % 3 == 0 ? "a" : (r % 3 == 1 ? "b" : "c");
    announcements.push_back(EncodeAnnouncement(
        {sidecar, 6, MembersDigest({0, 1, 2, 3, 4, 5}), "none", "cpu", sidecar + ":7490"}));
  }
  GroupMembership membership = AssembleMembership("m", announcements);
  ASSERT_TRUE(membership.refusal.ok()) << membership.refusal.ToString();
  EXPECT_EQ(membership.sidecar_ids, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(membership.admin_addresses, (std::vector<std::string>{"a:7490", "b:7490", "c:7490"}));
  EXPECT_EQ(membership.sidecar_of_rank, (std::vector<int>{0, 1, 2, 0, 1, 2}));
  const std::string record = EncodeMembership(membership);
  EXPECT_EQ(record, "cm11:00:1:31:a6:a:74901:b6:b:74901:c6:c:749012:0,1,2,0,1,2,");
  StatusOr<GroupMembership> decoded = DecodeMembership(record);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->sidecar_ids, membership.sidecar_ids);
  EXPECT_EQ(decoded->admin_addresses, membership.admin_addresses);
  EXPECT_EQ(decoded->sidecar_of_rank, membership.sidecar_of_rank);

  // A record that is not one, or that points outside its sidecars, is refused by name.
  for (const char* bad : {"cm11:00:1:12:a1:x2:5,", "cm11:00:1:12:a1:x0:", "cd11:00:", "cm11:00:1:-",
                          "cm11:00:1:12:a1:x2:0,1"}) {
    StatusOr<GroupMembership> refused = DecodeMembership(bad);
    EXPECT_TRUE(refused.status().IsInvalidArgument()) << bad;
    EXPECT_THAT(refused.status().message(), HasSubstr("membership record is malformed")) << bad;
  }
}

TEST(GroupRecordsTest, MembershipRefusalsNameTheRanksThatDisagree) {
  const std::string digest = MembersDigest({0, 1, 2});
  auto announce = [&](const std::string& sidecar, const std::string& members_digest,
                      const std::string& token, const std::string& device) {
    return EncodeAnnouncement({sidecar, 3, members_digest, token, device, ""});
  };
  struct Case {
    std::vector<std::string> announcements;
    const char* expected;
  };
  const std::vector<Case> cases = {
      {{announce("a", digest, "t", "cpu"), announce("b", MembersDigest({0, 2}), "t", "cpu"),
        announce("b", digest, "t", "cpu")},
       "group rank 1 named different members or world size than group rank 0"},
      {{announce("a", digest, "t", "cpu"), announce("b", digest, "t", "cpu"),
        announce("b", digest, "u", "cpu")},
       "group rank 2 presented a different job token than group rank 0"},
      {{announce("a", digest, "t", "cuda:0"), announce("b", digest, "t", "cpu"),
        announce("b", digest, "t", "cpu")},
       "a group's tensors must all live on one kind of device"},
      {{announce("a", digest, "t", "cuda:0"), announce("b", digest, "t", "cuda:0"),
        announce("b", digest, "t", "cuda:1")},
       "the ranks of a group on one sidecar must share one GPU"},
      {{announce("a", digest, "t", "cpu"), "garbage", announce("b", digest, "t", "cpu")},
       "group 'g': group rank 1"},
  };
  for (const Case& c : cases) {
    GroupMembership refused = AssembleMembership("g", c.announcements);
    EXPECT_TRUE(refused.refusal.IsInvalidArgument()) << c.expected;
    EXPECT_THAT(refused.refusal.message(), HasSubstr(c.expected));
    // Every rank reads the same refusal from the record.
    StatusOr<GroupMembership> decoded = DecodeMembership(EncodeMembership(refused));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(decoded->refusal.ToString(), refused.refusal.ToString());
  }
}

// A membership's placement becomes the topology every sidecar builds alike; one that lists a
// sidecar with no rank, or places a rank outside its sidecars, is refused.
TEST(GroupRecordsTest, TopologyFromAMembershipsPlacement) {
  StatusOr<GroupTopology> topology = GroupTopology::FromNodeOfRank({0, 1, 0, 1}, {"a", "b"}, "b");
  ASSERT_TRUE(topology.ok()) << topology.status().ToString();
  EXPECT_EQ(topology->my_node, 1);
  EXPECT_EQ(topology->ranks_of_node, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_EQ(topology->node_major_position, (std::vector<int>{0, 2, 1, 3}));
  StatusOr<GroupTopology> by_ids = GroupTopology::FromSidecarIds({"a", "b", "a", "b"}, "b");
  ASSERT_TRUE(by_ids.ok());
  EXPECT_EQ(by_ids->ranks_of_node, topology->ranks_of_node);
  EXPECT_EQ(by_ids->node_ids, topology->node_ids);

  EXPECT_THAT(GroupTopology::FromNodeOfRank({0, 0}, {"a", "b"}, "a").status().message(),
              HasSubstr("sidecar b is listed but hosts no rank"));
  EXPECT_TRUE(GroupTopology::FromNodeOfRank({0, 2}, {"a", "b"}, "a").status().IsInvalidArgument());
  EXPECT_THAT(GroupTopology::FromNodeOfRank({0, 1}, {"a", "b"}, "c").status().message(),
              HasSubstr("sidecar c hosts no rank"));
}

TEST(GroupRecordsTest, RankListsInMessagesAreBounded) {
  EXPECT_EQ(FormatRanksBounded({1, 3}), "[1, 3]");
  std::vector<int> many(1000);
  for (int r = 0; r < 1000; ++r) many[r] = r * 2;
  EXPECT_EQ(FormatRanksBounded(many, 3), "[0, 2, 4, ... and 997 more]");
  EXPECT_LT(FormatRanksBounded(many).size(), 120u);
}

// FNV-1a 64's published test vectors (http://www.isthe.com/chongo/tech/comp/fnv/).
TEST(GroupRecordsTest, Fnv1a64GivesItsKnownAnswers) {
  static_assert(Fnv1a64("") == 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
  // Bytes over 0x7f are taken unsigned, whatever the signedness of char.
  EXPECT_EQ(Fnv1a64("\xff"), (0xcbf29ce484222325ull ^ 0xffull) * 0x100000001b3ull);
}

// The digest is part of the records sidecars of different builds exchange: a change of its
// scheme must change the announcement version, and this test says so.
TEST(GroupRecordsTest, MembersDigestOfAFixedMembershipIsAFixedString) {
  EXPECT_EQ(MembersDigest({0, 1, 2, 3}), "4:26d7e95ec6a0944d");  // FNV-1a 64 of "0,1,2,3,"
  EXPECT_EQ(MembersDigest({0, 2, 5, 7}), "4:9867d00f4c1742b5");
  EXPECT_EQ(MembersDigest({}), "0:cbf29ce484222325");
  const RankAnnouncement announced{"s", 4, MembersDigest({0, 1, 2, 3}), "t", "cpu", "h:1"};
  EXPECT_EQ(EncodeAnnouncement(announced),
            "cd61:s1:418:4:26d7e95ec6a0944d1:t3:cpu3:h:19:fail-fast");
  // An announcement of the std::hash era (version 3), or of version 4 (no listener address), is
  // refused by its version, not read as members that disagree.
  for (const char* older_record :
       {"cd31:s1:412:4:12345678901:t3:cpu", "cd41:s1:418:4:26d7e95ec6a0944d1:t3:cpu"}) {
    StatusOr<RankAnnouncement> older = DecodeAnnouncement(older_record);
    EXPECT_THAT(older.status().message(), HasSubstr("unknown version"));
  }
}

TEST(JobTokenTest, CommitmentIsKeyedByTheTokenAndBoundToTheScope) {
  EXPECT_EQ(JobTokenCommitment("", "scope"), "none");
  const std::string a = JobTokenCommitment("token", "scope");
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a, JobTokenCommitment("token", "scope"));
  EXPECT_NE(a, JobTokenCommitment("token2", "scope"));
  EXPECT_NE(a, JobTokenCommitment("token", "scope2"));
  EXPECT_TRUE(JobTokenMatches("token", "scope", a));
  EXPECT_FALSE(JobTokenMatches("token", "scope2", a));
  EXPECT_FALSE(JobTokenMatches("", "scope", a));
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(ConstantTimeEquals("abc", "abcd"));
}

}  // namespace
}  // namespace collectived
