// A shrinking group that loses a whole sidecar (docs/fault-tolerance.md, losing a sidecar),
// through GroupRegistry over the in-process fabric: the survivors freeze the epoch, retire it at
// the lowest point their data phases reached, hand out the ops every one of them finished and run
// the others again, from their kept inputs, in the next epoch among the live ranks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/group/group_cluster.h"
#include "tests/engine/group/registry_cluster.h"

namespace collectived {
namespace {

using namespace group_testing;  // NOLINT: the helpers of this suite
using ::testing::HasSubstr;

constexpr milliseconds kJoin{10000};

const char* SidecarOf(int rank) {
  static const char* const kIds[] = {"a", "a", "b", "b", "c", "c"};
  return kIds[rank];
}

// Ranks 0, 1 on sidecar "a", 2, 3 on "b", 4, 5 on "c", in one shrinking group "g" that ran one
// allreduce. Rank r contributes r + 1: 21 over every rank, and 10 over the ranks of "a" and "b",
// scaled by 6 / 4 to 15 once "c" is lost.
//
// Each test runs on host memory (Gloo-like, synchronous) and on the in-process fabric's
// simulated device (a CUDA group: an asynchronous backend whose kept outputs live on the device).
class SidecarLossTest : public ::testing::TestWithParam<DeviceKind> {
 protected:
  static constexpr float kWhole = 21;
  static constexpr float kWithoutC = 15;

  void Form() {
    ForEachRank(6, [&](int r) {
      StatusOr<Membership> membership =
          cluster_.Join("g", r, kJoin, FaultTolerance{FaultToleranceMode::kShrink, 1}, GetParam());
      ASSERT_TRUE(membership.ok()) << membership.status().ToString();
    });
    ForEachRank(6, [&](int r) {
      TensorView t = On({static_cast<float>(r + 1)});
      ASSERT_TRUE(WaitFor(Submit(r, AllReduce(t))).ok());
      EXPECT_EQ(Values<float>(t), std::vector<float>{kWhole});
    });
  }
  std::shared_ptr<Work> Submit(int rank, OpRequest request) {
    return cluster_.registry(SidecarOf(rank)).Submit("g", rank, std::move(request));
  }
  // The ranks of "b" and "c" run an allreduce once "a" is lost: (3 + 4 + 5 + 6) scaled by 6 / 4.
  void AllReduceWithoutA() {
    ForEachRank(4, [&](int i) {
      const int r = i + 2;
      TensorView t = On({static_cast<float>(r + 1)});
      Status done = WaitFor(Submit(r, AllReduce(t)));
      ASSERT_TRUE(done.ok()) << done.ToString();
      EXPECT_EQ(Values<float>(t), std::vector<float>{27});
    });
  }
  // A tensor of the group's memory.
  static TensorView On(std::vector<float> values) {
    return Tensor<float>(std::move(values),
                         GetParam() == DeviceKind::kCuda ? Device{DeviceKind::kCuda, 0} : Device{});
  }
  // The epoch and lost ranks of the group on sidecar `id` once it is past epoch 0.
  std::pair<int, std::vector<int>> EpochOn(const std::string& id) {
    const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
    std::shared_ptr<Group> group = cluster_.registry(id).Find("g");
    while (group && group->spec().epoch == 0 && SteadyClock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(2));
      group = cluster_.registry(id).Find("g");
    }
    if (!group) return {-1, {}};
    return {group->spec().epoch, group->spec().LostGroupRanks()};
  }

  RegistryCluster cluster_{{"a", "a", "b", "b", "c", "c"}};
};

TEST_P(SidecarLossTest, ASidecarLostBetweenOpsLeavesTheOthersGoingOnInTheNextEpoch) {
  Form();
  cluster_.Kill("c");
  ForEachRank(4, [&](int r) {
    TensorView t = On({static_cast<float>(r + 1)});
    Status done = WaitFor(Submit(r, AllReduce(t)));
    ASSERT_TRUE(done.ok()) << done.ToString();
    EXPECT_EQ(Values<float>(t), std::vector<float>{kWithoutC});
  });
  for (const char* id : {"a", "b"}) {
    EXPECT_EQ(EpochOn(id), (std::pair<int, std::vector<int>>{1, {4, 5}})) << id;
    EXPECT_EQ(cluster_.registry(id).Find("g")->topology().node_count(), 2) << id;
  }
}

TEST_P(SidecarLossTest, AnOpWaitingForTheLostSidecarRunsAmongTheSurvivors) {
  Form();
  std::vector<TensorView> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < 4; ++r) {
    tensors.push_back(On({static_cast<float>(r + 1)}));
    works.push_back(Submit(r, AllReduce(tensors.back())));
  }
  std::this_thread::sleep_for(milliseconds(50));
  for (const auto& work : works) EXPECT_FALSE(work->IsCompleted());
  cluster_.Kill("c");
  for (size_t i = 0; i < works.size(); ++i) {
    ASSERT_TRUE(WaitFor(works[i]).ok()) << works[i]->status().ToString();
    EXPECT_EQ(Values<float>(tensors[i]), std::vector<float>{kWithoutC});
  }
}

// Every rank runs allreduces back to back; "c" dies among them, at whatever point of an op each
// sidecar is (agreeing, moving data, committing). Each op's outcome is one on every survivor:
// the whole group's sum up to the cut, the survivors' (rescaled, from the inputs kept) after it,
// and none fails.
TEST_P(SidecarLossTest, OpsInFlightAtTheLossHaveOneOutcomeOnEverySurvivor) {
  Form();
  constexpr int kOps = 400;
  constexpr int kLargeElements = 4096;  // a data phase that takes a few messages
  std::vector<std::vector<float>> got(4, std::vector<float>(kOps, -1));
  std::vector<Status> failures(4);
  // "c"'s ranks call its registry under a shared lock, which its death takes whole: they issue
  // ops up to the moment it dies.
  std::shared_mutex c_alive;
  bool c_dead = false;  // guarded by c_alive
  std::atomic<int> c_ops{0};
  std::vector<std::thread> threads;
  for (int r = 0; r < 6; ++r) {
    threads.emplace_back([&, r] {
      for (int op = 0; op < kOps; ++op) {
        TensorView t =
            On(std::vector<float>(op % 2 ? kLargeElements : 1, static_cast<float>(r + 1)));
        if (r >= 4) {
          std::shared_ptr<Work> work;
          {
            std::shared_lock<std::shared_mutex> alive(c_alive);
            if (c_dead) return;
            work = Submit(r, AllReduce(t));
          }
          c_ops.fetch_add(1);
          if (!WaitFor(work).ok()) return;  // Aborted when "c" goes
          continue;
        }
        Status done = WaitFor(Submit(r, AllReduce(t)));
        if (!done.ok()) {
          failures[r] = done;
          return;
        }
        std::vector<float> values = Values<float>(t);
        got[r][op] = values.front();
        for (float v : values) {
          if (v != values.front()) got[r][op] = -2;  // torn: not one outcome
        }
      }
    });
  }
  while (c_ops.load() < 2 * 40) std::this_thread::sleep_for(milliseconds(1));
  {
    std::unique_lock<std::shared_mutex> dying(c_alive);
    c_dead = true;
    cluster_.Kill("c");
  }
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < 4; ++r) ASSERT_TRUE(failures[r].ok()) << r << ": " << failures[r].ToString();
  int cut = 0;
  while (cut < kOps && got[0][cut] == kWhole) ++cut;
  EXPECT_GE(cut, 30);  // "c" died among the ops, not before them
  EXPECT_LT(cut, kOps);
  for (int op = 0; op < kOps; ++op) {
    const float expected = op < cut ? kWhole : kWithoutC;
    for (int r = 0; r < 4; ++r) EXPECT_EQ(got[r][op], expected) << "rank " << r << ", op " << op;
  }
  EXPECT_EQ(EpochOn("a").second, (std::vector<int>{4, 5}));
}

// "c" dies while the group is idle (nobody notices: no op needs it), then rank 0's trainer is
// lost: the epoch retires at its cut on "a" and "b", and "c" never announces its part in the
// next one. After a second without the next epoch, the sidecars that did not announce it are
// asked to answer; "c" does not, and the group goes on without it rather than failing once the
// formation's 30 s budget ends.
TEST_P(SidecarLossTest, ASidecarLostBeforeItAnnouncedTheNextEpochIsLeftOut) {
  Form();
  cluster_.Kill("c");
  GroupRegistry& a = cluster_.registry("a");
  ASSERT_TRUE(a.LoseRank("g", 0, Status::PeerLost("rank 0 was lost: its session ended")).ok());
  ASSERT_TRUE(a.Leave("g", 0).ok());
  const auto started = SteadyClock::now();
  ForEachRank(3, [&](int i) {
    const int r = i + 1;
    TensorView t = On({static_cast<float>(r + 1)});
    Status done = WaitFor(Submit(r, AllReduce(t)));
    ASSERT_TRUE(done.ok()) << done.ToString();
    EXPECT_EQ(Values<float>(t), std::vector<float>{18});  // (2 + 3 + 4) scaled by 6 / 3
  });
  EXPECT_LT(SteadyClock::now() - started, std::chrono::seconds(5));
  for (const char* id : {"a", "b"}) {
    EXPECT_EQ(EpochOn(id), (std::pair<int, std::vector<int>>{1, {0, 4, 5}})) << id;
  }
}

// The group meets in "a"'s own store, and "a" dies: its store goes with it. The survivors move
// the group's store to the lowest of them that answers ("b"), find there that "a" is lost, and
// go on without it, as after any sidecar's loss.
TEST_P(SidecarLossTest, TheSidecarWhoseStoreTheGroupMetInIsLostAndTheOthersGoOn) {
  cluster_.MeetIn("a");
  Form();
  cluster_.Kill("a");
  AllReduceWithoutA();
  for (const char* id : {"b", "c"}) {
    EXPECT_EQ(EpochOn(id), (std::pair<int, std::vector<int>>{1, {0, 1}})) << id;
  }
  // The next change is agreed in the moved store too: "c" is lost next, and "b" goes on alone.
  cluster_.Kill("c");
  ForEachRank(2, [&](int i) {
    const int r = i + 2;
    TensorView t = On({static_cast<float>(r + 1)});
    Status done = WaitFor(Submit(r, AllReduce(t)));
    ASSERT_TRUE(done.ok()) << done.ToString();
    EXPECT_EQ(Values<float>(t), std::vector<float>{21});  // (3 + 4) scaled by 6 / 2
  });
  EXPECT_EQ(EpochOn("b").second, (std::vector<int>{0, 1, 4, 5}));
}

// The group meets in "a"'s store with "c"'s, then "b"'s, after it in its address list. "a" dies:
// the survivors move the group's store to "c" (the list's order before their own), carry there
// what a replacement reads, and go on. A replacement for rank 0, started on "b" with the same
// list, finds the group in "c" and joins it; rank 1's replacement, claiming the rank that is live
// again, or any live rank, is refused as in the store the group met in.
TEST_P(SidecarLossTest, AReplacementFindsTheGroupThroughItsAddressListOnceTheStoreIsLost) {
  cluster_.MeetIn("a", {"c", "b"});
  Form();
  for (int r = 0; r < 6; ++r) {
    ASSERT_TRUE(cluster_.registry(SidecarOf(r)).AcceptReplacements("g", r).ok()) << r;
  }
  cluster_.Kill("a");
  AllReduceWithoutA();
  const FaultTolerance shrink{FaultToleranceMode::kShrink, 1};
  StatusOr<Membership> live = cluster_.JoinOn("b", "g", 4, kJoin, shrink, GetParam());
  EXPECT_TRUE(live.status().IsInvalidArgument()) << live.status().ToString();
  EXPECT_THAT(live.status().message(), HasSubstr("is live in the running group"));

  StatusOr<Membership> replacement = Status::Internal("not joined");
  std::thread joiner(
      [&] { replacement = cluster_.JoinOn("b", "g", 0, kJoin, shrink, GetParam()); });
  cluster_.AdmitOnEachSurvivor({2, 3, 4, 5}, 0);
  joiner.join();
  ASSERT_TRUE(replacement.ok()) << replacement.status().ToString();
  EXPECT_TRUE(replacement->replacement);
  // Rank 0 now runs on "b": (1 + 3 + 4 + 5 + 6) scaled by 6 / 5.
  ForEachRank(5, [&](int i) {
    const int r = i == 0 ? 0 : i + 1;
    TensorView t = On({static_cast<float>(r + 1)});
    GroupRegistry& on = cluster_.registry(r == 0 ? "b" : SidecarOf(r));
    Status done = WaitFor(on.Submit("g", r, AllReduce(t)));
    ASSERT_TRUE(done.ok()) << done.ToString();
    EXPECT_FLOAT_EQ(Values<float>(t)[0], 19.0f * 6 / 5) << "rank " << r;
  });
  EXPECT_EQ(EpochOn("c").second, (std::vector<int>{1}));
}

TEST_P(SidecarLossTest, AnOpWaitingWhenTheStoresSidecarIsLostRunsAmongTheSurvivors) {
  cluster_.MeetIn("a");
  Form();
  std::vector<TensorView> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 2; r < 6; ++r) {
    tensors.push_back(On({static_cast<float>(r + 1)}));
    works.push_back(Submit(r, AllReduce(tensors.back())));
  }
  std::this_thread::sleep_for(milliseconds(50));
  for (const auto& work : works) EXPECT_FALSE(work->IsCompleted());
  cluster_.Kill("a");
  for (size_t i = 0; i < works.size(); ++i) {
    ASSERT_TRUE(WaitFor(works[i]).ok()) << works[i]->status().ToString();
    EXPECT_EQ(Values<float>(tensors[i]), std::vector<float>{27});
  }
}

// "a", whose store the group meets in, dies, and "b" stops while the survivors move the store:
// "b"'s registry goes while its move is in progress (the move's probes and its callback run on
// after the loss's watches fired). What "b" left must not be touched from then on (the sanitizer
// builds check it); "c" goes on, alone or with "b" when "b" answered the roll call before it
// went, and either way its op ends.
TEST_P(SidecarLossTest, ASidecarThatStopsWhileTheStoreMovesIsNotTouchedAfterwards) {
  cluster_.MeetIn("a");
  Form();
  cluster_.Kill("a");
  cluster_.Stop("b");
  ForEachRank(2, [&](int i) {
    const int r = i + 4;
    TensorView t = On({static_cast<float>(r + 1)});
    Status done = WaitFor(Submit(r, AllReduce(t)));
    if (done.ok()) {
      EXPECT_EQ(Values<float>(t), std::vector<float>{33});  // (5 + 6) scaled by 6 / 2
    } else {
      EXPECT_EQ(done.kind(), ErrorKind::kPeerLost) << done.ToString();
    }
  });
}

// On the simulated device only: its completions can be held.
class DeviceSidecarLossTest : public SidecarLossTest {};

// "a"'s device ran an allreduce (its ranks' tensors now hold the whole group's sum) but has not
// completed it when "c" dies: "b" finished the op, "a" did not, so it runs again among the
// survivors, from the inputs both kept on the device, and gives the survivors' sum (the whole
// group's sum again would make 73.5).
TEST_P(DeviceSidecarLossTest, AnOpTheDeviceRanButDidNotCompleteRunsAgainFromItsKeptInput) {
  Form();
  ASSERT_TRUE(cluster_.fabric().HoldDevice("g", 0).ok());  // node 0: sidecar "a"
  std::vector<TensorView> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < 6; ++r) {
    tensors.push_back(On({static_cast<float>(r + 1)}));
    works.push_back(Submit(r, AllReduce(tensors.back())));
  }
  // The allreduce of one float runs in microseconds once every rank issued it; its completion
  // on "a" waits.
  std::this_thread::sleep_for(milliseconds(300));
  for (const auto& work : works) EXPECT_FALSE(work->IsCompleted());
  cluster_.Kill("c");
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(WaitFor(works[i]).ok()) << works[i]->status().ToString();
    EXPECT_EQ(Values<float>(tensors[i]), std::vector<float>{kWithoutC}) << "rank " << i;
  }
  EXPECT_EQ(EpochOn("a").second, (std::vector<int>{4, 5}));
}

INSTANTIATE_TEST_SUITE_P(Device, DeviceSidecarLossTest, ::testing::Values(DeviceKind::kCuda),
                         [](const ::testing::TestParamInfo<DeviceKind>&) {
                           return std::string("SimulatedCuda");
                         });

INSTANTIATE_TEST_SUITE_P(HostAndDevice, SidecarLossTest,
                         ::testing::Values(DeviceKind::kCpu, DeviceKind::kCuda),
                         [](const ::testing::TestParamInfo<DeviceKind>& info) {
                           return info.param == DeviceKind::kCuda ? "SimulatedCuda" : "Host";
                         });

}  // namespace
}  // namespace collectived
