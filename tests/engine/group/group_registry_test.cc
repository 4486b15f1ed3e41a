// Groups formed through GroupRegistry over the in-process fabric (one registry per sidecar, one
// shared store): the store's cost, ranks that never join, join and leave, failures through the
// store, refused joins (sizes, members, job tokens), and a sidecar that never connects.
#include "engine/group/rendezvous/group_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/core/group.h"
#include "engine/group/rendezvous/group_records.h"
#include "engine/group/rendezvous/job_token.h"
#include "engine/group/transport/in_process/in_process_fabric.h"
#include "engine/store/counting_store.h"
#include "engine/store/memory_store.h"
#include "tests/engine/group/group_cluster.h"
#include "tests/engine/group/registry_cluster.h"

namespace collectived {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

using namespace group_testing;  // NOLINT: the helpers of this suite

// Formation costs the store a fixed number of calls per rank and keys named per rank, whatever
// the group's size: no rank waits on every rank's key (which made the store's work grow as R^2).
TEST(GroupRegistryOverFabricTest, FormationCostsTheStoreTheSameForEveryRankWhateverTheSize) {
  std::vector<CountingStore::Counts> per_size;
  for (int ranks : {8, 64}) {
    std::vector<std::string> sidecar_of_rank;
    for (int r = 0; r < ranks; ++r) sidecar_of_rank.push_back("s" + std::to_string(r % 4));
    RegistryCluster cluster(sidecar_of_rank);
    std::vector<Status> results(ranks);
    ForEachRank(
        ranks, [&](int r) { results[r] = cluster.Join("sized", r, milliseconds(20000)).status(); });
    for (int r = 0; r < ranks; ++r) ASSERT_TRUE(results[r].ok()) << results[r].ToString();
    per_size.push_back(cluster.store().counts());
    const CountingStore::Counts& c = per_size.back();
    std::printf("%d ranks over 4 sidecars: %.2f store calls, %.2f keys per rank\n", ranks,
                static_cast<double>(c.calls) / ranks, static_cast<double>(c.keys) / ranks);
  }
  // Per rank: the token, its incarnation, its announcement, the arrivals, the count, the
  // membership; per sidecar: one read of the membership; once: the assembler's reads of the R
  // announcements. So calls per rank are the same for 8 and 64 ranks, give or take the once.
  const double calls8 = static_cast<double>(per_size[0].calls) / 8;
  const double calls64 = static_cast<double>(per_size[1].calls) / 64;
  EXPECT_LE(calls64, calls8 + 0.5);
  EXPECT_LE(calls64, 9.0);
  // Keys named per rank grow by at most the assembler's one read of R keys (1 per rank).
  const double keys8 = static_cast<double>(per_size[0].keys) / 8;
  const double keys64 = static_cast<double>(per_size[1].keys) / 64;
  EXPECT_LE(keys64, keys8 + 1.5);
}

// Ranks that never join are named, the first few and then how many more: the message stays
// short for a group of thousands.
TEST(GroupRegistryOverFabricTest, RanksThatNeverJoinAreNamedInBoundedText) {
  std::vector<std::string> sidecar_of_rank;
  for (int r = 0; r < 200; ++r) sidecar_of_rank.push_back("s" + std::to_string(r % 2));
  RegistryCluster cluster(sidecar_of_rank);
  // Ranks 0..9 come; 10..199 never do.
  std::vector<Status> results(10);
  ForEachRank(10,
              [&](int r) { results[r] = cluster.Join("partial", r, milliseconds(500)).status(); });
  for (const Status& status : results) {
    EXPECT_TRUE(status.IsTimeout()) << status.ToString();
    EXPECT_THAT(status.message(), AllOf(HasSubstr("190 of 200 group ranks [10, 11, 12,"),
                                        HasSubstr("... and 174 more] (global ranks [10, 11,"),
                                        HasSubstr("never joined")));
    EXPECT_LT(status.message().size(), 400u) << status.message();
  }
}

// The same with a job token: the arrivals list is read beneath the group's signed records.
TEST(GroupRegistryOverFabricTest, RanksThatNeverJoinAreNamedWhenTheGroupHasAJobToken) {
  RegistryCluster cluster({"a", "b", "b"});
  JoinRequest request;
  request.name = "tokened";
  request.rank = 0;
  request.world_size = 3;
  request.store = std::make_shared<MemoryStore>();
  request.timeout = milliseconds(300);
  request.job_token = "secret-token";
  Status status = cluster.registry("a").Join(request).status();
  EXPECT_TRUE(status.IsTimeout()) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("2 of 3 group ranks [1, 2] (global ranks [1, 2]) never "
                                          "joined"));
}

TEST(GroupRegistryOverFabricTest, JoinRunLeaveAndJoinAgain_TwoNodesTwoRanks) {
  RegistryCluster cluster({"a", "a", "b", "b"});
  for (int incarnation = 0; incarnation < 2; ++incarnation) {
    ForEachRank(4, [&](int r) {
      StatusOr<Membership> membership = cluster.Join("g", r, milliseconds(5000));
      ASSERT_TRUE(membership.ok()) << membership.status().ToString();
      EXPECT_EQ(membership->group_rank, r);
      EXPECT_EQ(membership->group->topology().node_count(), 2);
      TensorView t = Tensor<int64_t>({r, 1});
      EXPECT_TRUE(WaitFor(membership->group->Submit(r, AllReduce(t))).ok());
      EXPECT_EQ(Values(t), (std::vector<int64_t>{6, 4}));
      EXPECT_EQ(membership->group->SequenceNumber(r), 1u);
    });
    ForEachRank(
        4, [&](int r) { EXPECT_TRUE(cluster.registry(r < 2 ? "a" : "b").Leave("g", r).ok()); });
    // The last sidecar to leave removes the incarnation's keys (on its watchdog thread): only
    // the 4 ranks' incarnation counters and the token commitment stay.
    const auto deadline = SteadyClock::now() + std::chrono::seconds(5);
    while (cluster.store().NumKeys().value() != 5 && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(2));
    }
    EXPECT_EQ(cluster.store().NumKeys().value(), 5) << "incarnation " << incarnation;
    EXPECT_FALSE(*cluster.store().Check({GroupKeys("test", "g", incarnation + 1).Rank(0)}));
  }
}

TEST(GroupRegistryOverFabricTest, FailGroupReachesThePeerSidecarThroughTheStore_TwoNodesOneRank) {
  RegistryCluster cluster({"a", "b"});
  std::vector<std::shared_ptr<Group>> groups(2);
  ForEachRank(2, [&](int r) {
    StatusOr<Membership> membership = cluster.Join("g", r, milliseconds(5000));
    ASSERT_TRUE(membership.ok()) << membership.status().ToString();
    groups[r] = membership->group;
  });
  ASSERT_TRUE(groups[0] && groups[1]);
  auto pending = groups[1]->Submit(1, AllReduce(Zeros(1)));
  ASSERT_TRUE(cluster.registry("a").FailGroup("g", Status::Aborted("operator abort")).ok());
  Status status = WaitFor(pending);
  EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("operator abort"));
  const auto deadline = SteadyClock::now() + std::chrono::seconds(2);
  while (groups[1]->failure().ok() && SteadyClock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(1));
  EXPECT_EQ(groups[1]->failure().kind(), ErrorKind::kAborted);
  groups.clear();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(cluster.registry(r == 0 ? "a" : "b").Leave("g", r).ok());
}

TEST(GroupRegistryOverFabricTest, AbsurdWorldSizesMembersAndTimeoutsAreRefusedAtOnce) {
  RegistryCluster cluster({"a"});
  JoinRequest request;
  request.name = "huge";
  request.rank = 0;
  request.world_size = std::numeric_limits<int>::max();
  request.store = std::make_shared<MemoryStore>();
  StatusOr<Membership> huge = cluster.registry("a").Join(request);
  EXPECT_TRUE(huge.status().IsInvalidArgument()) << huge.status().ToString();
  EXPECT_THAT(huge.status().message(),
              HasSubstr("world size 2147483647 is larger than 131072, the most this sidecar "
                        "accepts"));

  request.world_size = 2;
  request.members = {0, 1, 1};
  StatusOr<Membership> members = cluster.registry("a").Join(request);
  EXPECT_THAT(members.status().message(), HasSubstr("3 members listed for world size 2"));

  request.members = {};
  request.world_size = 1;
  request.timeout = milliseconds::max();
  StatusOr<Membership> forever = cluster.registry("a").Join(request);
  EXPECT_TRUE(forever.status().IsInvalidArgument()) << forever.status().ToString();
  EXPECT_THAT(forever.status().message(), HasSubstr("longer than the longest accepted"));
}

// Ranks announce a digest of the members they name, not the list: ranks that disagree about the
// members (or the job token) are still refused when the group is formed, on every sidecar.
TEST(GroupRegistryOverFabricTest, RanksThatDisagreeOnMembersOrTokenAreRefused_TwoNodesOneRank) {
  RegistryCluster cluster({"a", "b", "b"});
  auto store = std::make_shared<MemoryStore>();
  // Global ranks 0 and 2 are group ranks 0 and 1 of a group of 2 in both lists, so they meet
  // under the same keys, but they name different members.
  std::vector<JoinRequest> requests(2);
  for (int r = 0; r < 2; ++r) {
    requests[r].name = "disagree";
    requests[r].world_size = 3;
    requests[r].store = store;
    requests[r].timeout = milliseconds(5000);
  }
  requests[0].rank = 0;
  requests[0].members = {0, 2};
  requests[1].rank = 2;
  requests[1].members = {1, 2};
  std::vector<Status> results(2);
  ForEachRank(2, [&](int r) {
    results[r] = cluster.registry(r == 0 ? "a" : "b").Join(requests[r]).status();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(results[r].IsInvalidArgument()) << results[r].ToString();
    EXPECT_THAT(results[r].message(), HasSubstr("named different members or world size"));
  }
}

// Naming no members means the whole world: such ranks meet ranks that list every rank, and a
// sidecar that computed the whole world's digest for one size does not reuse it for another.
TEST(GroupRegistryOverFabricTest, RanksNamingNoMembersMeetRanksListingTheWholeWorld) {
  RegistryCluster cluster({"a", "a", "b"});
  auto store = std::make_shared<MemoryStore>();
  auto join_all = [&](const std::string& name, const std::vector<std::string>& sidecars,
                      const std::vector<std::vector<int>>& members) {
    const int ranks = static_cast<int>(sidecars.size());
    std::vector<StatusOr<Membership>> results(ranks, Status::Unavailable("not run"));
    ForEachRank(ranks, [&](int r) {
      JoinRequest request;
      request.name = name;
      request.rank = r;
      request.world_size = ranks;
      request.members = members[r];
      request.store = store;
      request.timeout = milliseconds(5000);
      results[r] = cluster.registry(sidecars[r]).Join(request);
    });
    for (int r = 0; r < ranks; ++r) {
      ASSERT_TRUE(results[r].ok())
          << name << " rank " << r << ": " << results[r].status().ToString();
      EXPECT_EQ(results[r]->group_rank, r);
      EXPECT_EQ(results[r]->group->topology().group_size, ranks);
      (void)cluster.registry(sidecars[r]).Leave(name, r);
    }
  };
  join_all("world-of-3", {"a", "a", "b"}, {{}, {0, 1, 2}, {}});
  join_all("world-of-2", {"a", "b"}, {{}, {0, 1}});
  join_all("world-of-2-again", {"b", "a"}, {{0, 1}, {}});
}

// The job token is fixed by group rank 0; a joiner presenting another one (or none) is refused
// alone, before it takes an incarnation, and the rightful ranks still form the group.
TEST(GroupRegistryOverFabricTest, WrongJobTokenIsRefusedAloneAndTheRightfulRanksFormTheGroup) {
  RegistryCluster cluster({"a", "b"});
  auto store = std::make_shared<MemoryStore>();
  auto request = [&](int rank, std::string token) {
    JoinRequest join;
    join.name = "tokens";
    join.rank = rank;
    join.world_size = 2;
    join.store = store;
    join.timeout = milliseconds(20000);
    join.job_token = std::move(token);
    return join;
  };
  StatusOr<Membership> rank0 = Status::Internal("not run");
  std::thread first([&] { rank0 = cluster.registry("a").Join(request(0, "job-secret")); });
  // Intruders on the other sidecar, while rank 0 waits: a wrong token, and no token.
  Status wrong = cluster.registry("b").Join(request(1, "guess")).status();
  EXPECT_EQ(wrong.kind(), ErrorKind::kPermissionDenied) << wrong.ToString();
  EXPECT_THAT(wrong.message(),
              HasSubstr("the job token presented is not the one the group was created with"));
  EXPECT_THAT(wrong.message(), Not(HasSubstr("guess")));
  EXPECT_THAT(wrong.message(), Not(HasSubstr("job-secret")));
  Status huge = cluster.registry("b").Join(request(1, std::string(5000, 'x'))).status();
  EXPECT_TRUE(huge.IsInvalidArgument()) << huge.ToString();
  EXPECT_THAT(huge.message(), HasSubstr("the job token has 5000 bytes"));
  Status none = cluster.registry("b").Join(request(1, "")).status();
  EXPECT_EQ(none.kind(), ErrorKind::kPermissionDenied) << none.ToString();
  EXPECT_THAT(none.message(), HasSubstr("created with a job token and this rank presented none"));

  StatusOr<Membership> rank1 = cluster.registry("b").Join(request(1, "job-secret"));
  first.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status().ToString();
  ASSERT_TRUE(rank1.ok()) << rank1.status().ToString();
  EXPECT_TRUE(rank0->group->AcceptsJobToken("job-secret"));
  EXPECT_FALSE(rank0->group->AcceptsJobToken("job-secreT"));
  EXPECT_FALSE(rank0->group->AcceptsJobToken(""));

  // The store holds a keyed commitment: neither the token nor a plain hash of it.
  StatusOr<std::string> commitment = store->Get(GroupKeys::TokenCommitment("", "tokens"));
  ASSERT_TRUE(commitment.ok());
  EXPECT_EQ(commitment->size(), 64u);
  EXPECT_EQ(commitment->find("job-secret"), std::string::npos);
  EXPECT_EQ(*commitment, JobTokenCommitment("job-secret", GroupKeys::TokenScope("", "tokens")));
  EXPECT_NE(*commitment, JobTokenCommitment("job-secret", GroupKeys::TokenScope("", "other")));

  // A failure record forged in the store (by anything without the token, even a sidecar) is
  // not believed: the group goes on.
  ASSERT_TRUE(
      store->Set(GroupKeys("", "tokens", 1).Failed(), EncodeFailure(Status::Aborted("forged")))
          .ok());
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_TRUE(rank0->group->failure().ok()) << rank0->group->failure().ToString();
  EXPECT_TRUE(rank1->group->failure().ok()) << rank1->group->failure().ToString();
  std::vector<Membership> members = {*rank0, *rank1};
  ForEachRank(2, [&](int r) {
    TensorView t = Tensor<int64_t>({r + 1});
    EXPECT_TRUE(WaitFor(members[r].group->Submit(r, AllReduce(t))).ok());
    EXPECT_EQ(Values(t), (std::vector<int64_t>{3}));
  });
  EXPECT_TRUE(cluster.registry("a").Leave("tokens", 0).ok());
  EXPECT_TRUE(cluster.registry("b").Leave("tokens", 1).ok());

  // A group created without a token refuses a joiner that presents one.
  StatusOr<Membership> open0 = Status::Internal("not run");
  auto open_request = [&](int rank, std::string token) {
    JoinRequest join = request(rank, std::move(token));
    join.name = "open";
    return join;
  };
  std::thread open_first([&] { open0 = cluster.registry("a").Join(open_request(0, "")); });
  Status tokened = cluster.registry("b").Join(open_request(1, "job-secret")).status();
  EXPECT_EQ(tokened.kind(), ErrorKind::kPermissionDenied) << tokened.ToString();
  EXPECT_THAT(tokened.message(), HasSubstr("created without a job token"));
  StatusOr<Membership> open1 = cluster.registry("b").Join(open_request(1, ""));
  open_first.join();
  ASSERT_TRUE(open0.ok()) << open0.status().ToString();
  ASSERT_TRUE(open1.ok()) << open1.status().ToString();
  EXPECT_FALSE(open0->group->has_job_token());
  EXPECT_FALSE(open0->group->AcceptsJobToken(""));
}

TEST(GroupRegistryOverFabricTest, MissingSidecarIsUnavailableFromConnect) {
  auto fabric = InProcessFabric::Create();
  StatusOr<GroupTopology> topology = GroupTopology::FromSidecarIds({"a", "b"}, "a");
  ASSERT_TRUE(topology.ok());
  const auto start = SteadyClock::now();
  StatusOr<GroupTransport> transport = fabric->Connect(
      ConnectRequest{"lonely", DeviceKind::kCpu, *topology, nullptr, milliseconds(100)});
  EXPECT_GE(SteadyClock::now() - start, milliseconds(95));
  ASSERT_FALSE(transport.ok());
  EXPECT_EQ(transport.status().kind(), ErrorKind::kUnavailable);
  EXPECT_THAT(transport.status().message(),
              HasSubstr("group 'lonely': sidecar nodes [1] never connected within 100 ms"));
  // CUDA groups get the fabric's simulated device, and wait for their peers the same way.
  StatusOr<GroupTransport> cuda = fabric->Connect(
      ConnectRequest{"gpu", DeviceKind::kCuda, *topology, nullptr, milliseconds(100)});
  EXPECT_EQ(cuda.status().kind(), ErrorKind::kUnavailable) << cuda.status().ToString();
}

}  // namespace
}  // namespace collectived
