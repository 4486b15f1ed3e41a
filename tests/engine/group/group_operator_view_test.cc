// Group over the in-process fabric, as an operator sees it: the stuck-op watchdog, the data
// backend's aborts and errors as the metrics are told them, in-flight ops and flight records.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/core/group.h"
#include "tests/engine/group/group_test_helpers.h"

namespace collectived {
namespace {

using namespace group_testing;  // NOLINT: the helpers of this suite

// The stuck-op watchdog is the group's timer: an op in flight longer than the threshold is
// reported once, exactly when it passes (no periodic scan), whatever the op's state.
class StuckReports : public OpObserver {
 public:
  void OnOpFinished(const OpRecord&) override {}
  void OnOpStuck(const OpRecord& record) override {
    std::lock_guard<std::mutex> lock(mutex_);
    reported_.push_back(record.sequence_number);
  }
  void OnGroupGone(const std::string&) override {}
  void OnBackendAborted(const std::string&, DeviceKind, ErrorKind) override {}
  void OnBackendError(const std::string&, DeviceKind, ErrorKind) override {}
  std::vector<uint64_t> reported() {
    std::lock_guard<std::mutex> lock(mutex_);
    return reported_;
  }

 private:
  std::mutex mutex_;
  std::vector<uint64_t> reported_;
};

TEST(GroupTest, AStuckOpIsReportedOnceWhenItsThresholdPasses_TwoNodesOneRank) {
  ManualClock clock;
  auto reports = std::make_shared<StuckReports>();
  Cluster::Options options = OnManualClock(clock);
  options.stuck_threshold = std::chrono::seconds(60);
  options.timeout = std::chrono::hours(1);
  options.observer = reports;
  Cluster cluster("stuck", {"a", "b"}, options);
  auto first = cluster.Submit(0, AllReduce(Zeros(2)));  // node 1's rank never issues it
  clock.Advance(std::chrono::seconds(30));
  auto second = cluster.Submit(0, AllReduce(Zeros(2)));  // waits behind the first
  clock.Advance(std::chrono::seconds(29));
  cluster.runtime(0).timers().Settle();
  EXPECT_TRUE(reports->reported().empty()) << "reported before its threshold";
  clock.Advance(std::chrono::seconds(1));  // the first op is 60 s old
  cluster.runtime(0).timers().Settle();
  EXPECT_EQ(reports->reported(), std::vector<uint64_t>{1});
  clock.Advance(std::chrono::seconds(29));
  cluster.runtime(0).timers().Settle();
  EXPECT_EQ(reports->reported(), std::vector<uint64_t>{1}) << "reported once";
  clock.Advance(std::chrono::seconds(1));  // the second is 60 s old
  cluster.runtime(0).timers().Settle();
  EXPECT_EQ(reports->reported(), (std::vector<uint64_t>{1, 2}));
  std::vector<OpRecord> flight = cluster.node(0).FlightRecords(0);
  ASSERT_EQ(flight.size(), 2u);
  EXPECT_EQ(flight[0].state, OpRecord::State::kRunning);
  EXPECT_EQ(flight[1].state, OpRecord::State::kWaitingForPeers);
  EXPECT_FALSE(first->IsCompleted());
  EXPECT_FALSE(second->IsCompleted());
}

// --- what the metrics are told about the data backend ---

// Counts the backend reports of every node, as "abort:<kind>" and "error:<kind>".
class BackendReports : public OpObserver {
 public:
  void OnOpFinished(const OpRecord&) override {}
  void OnOpStuck(const OpRecord&) override {}
  void OnGroupGone(const std::string&) override {}
  void OnBackendAborted(const std::string& group, DeviceKind device, ErrorKind reason) override {
    Add(group, device, "abort:" + std::string(ErrorKindName(reason)));
  }
  void OnBackendError(const std::string& group, DeviceKind device, ErrorKind kind) override {
    Add(group, device, "error:" + std::string(ErrorKindName(kind)));
  }
  std::map<std::string, int> Counts() {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_;
  }

 private:
  void Add(const std::string& group, DeviceKind device, const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++counts_[group + " " + std::string(DeviceKindName(device)) + " " + what];
  }
  std::mutex mutex_;
  std::map<std::string, int> counts_;
};

TEST(GroupTest, BackendAbortsAreReportedOncePerNodeAndNotForAnIdleTeardown_TwoNodesTwoRanks) {
  auto reports = std::make_shared<BackendReports>();
  Cluster::Options options;
  options.observer = reports;
  {
    Cluster idle("idle", {"a", "a", "b", "b"}, options);
    std::vector<std::shared_ptr<Work>> works;
    for (int r = 0; r < 4; ++r) works.push_back(idle.Submit(r, AllReduce(Zeros(4))));
    for (auto& work : works) EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  }  // every node stopped, none in use
  EXPECT_TRUE(reports->Counts().empty());

  Cluster cluster("aborted", {"a", "a", "b", "b"}, options);
  auto pending = cluster.Submit(0, AllReduce(Zeros(1)));  // rank 1 never issues
  std::vector<std::shared_ptr<Work>> remote;
  for (int r : {2, 3}) remote.push_back(cluster.Submit(r, AllReduce(Zeros(1))));
  cluster.node(0).Fail(Status::Aborted("operator abort"));
  cluster.node(0).Fail(Status::Internal("second"));  // the first reason wins: no new report
  EXPECT_EQ(WaitFor(pending).kind(), ErrorKind::kAborted);
  for (auto& work : remote) EXPECT_EQ(WaitFor(work).kind(), ErrorKind::kAborted);
  const auto deadline = SteadyClock::now() + std::chrono::seconds(5);
  while (reports->Counts()["aborted cpu abort:aborted"] < 2 && SteadyClock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  EXPECT_EQ(reports->Counts(), (std::map<std::string, int>{{"aborted cpu abort:aborted", 2}}));
}

TEST(GroupTest, APeerKilledDuringTheDataPhaseIsABackendError_TwoNodesOneRank) {
  auto reports = std::make_shared<BackendReports>();
  Cluster::Options options;
  options.observer = reports;
  options.publish_failures = false;
  Cluster cluster("data-phase", {"a", "b"}, options);
  // Node 1 is slow: its signature exchange ends after 1 s, then node 0 waits in the allreduce
  // itself for another second; node 1 dies half way through that wait.
  ASSERT_TRUE(cluster.fabric().DelayNode("data-phase", 1, milliseconds(1000)).ok());
  auto survivor = cluster.Submit(0, AllReduce(Zeros(1 << 16)));
  auto victim = cluster.Submit(1, AllReduce(Zeros(1 << 16)));
  std::this_thread::sleep_for(milliseconds(1500));
  ASSERT_TRUE(cluster.fabric().KillNode("data-phase", 1).ok());
  EXPECT_EQ(WaitFor(survivor).kind(), ErrorKind::kPeerLost) << survivor->status().ToString();
  EXPECT_FALSE(WaitFor(victim).ok());
  // Both nodes' backend calls failed (in process, the killed node's own calls fail too).
  EXPECT_EQ(reports->Counts(), (std::map<std::string, int>{{"data-phase cpu error:peer_lost", 2},
                                                           {"data-phase cpu abort:peer_lost", 2}}));
}

// --- what an operator sees ---

TEST(GroupTest, InFlightAndFlightRecordsShowPendingOps_OneNodeTwoRanks) {
  Cluster cluster("flight", {"a", "a"});
  auto first = cluster.Submit(0, AllReduce(Tensor<float>({1, 2, 3})));
  std::vector<InFlightOp> in_flight = cluster.node(0).InFlight();
  ASSERT_EQ(in_flight.size(), 1u);
  EXPECT_EQ(in_flight[0].sequence_number, 1u);
  EXPECT_EQ(in_flight[0].op, "allreduce");
  EXPECT_EQ(in_flight[0].arrived_local_ranks, std::vector<int>{0});
  EXPECT_EQ(in_flight[0].missing_local_ranks, std::vector<int>{1});
  std::vector<OpRecord> records = cluster.node(0).FlightRecords(0);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].state, OpRecord::State::kWaitingForPeers);
  EXPECT_EQ(records[0].sequence_number, 1u);
  EXPECT_EQ(records[0].kind, OpKind::kAllReduce);
  EXPECT_EQ(records[0].dtype, DType::kFloat32);
  EXPECT_EQ(records[0].count, 3u);
  EXPECT_EQ(records[0].missing_ranks, std::vector<int>{1});

  auto second = cluster.Submit(1, AllReduce(Tensor<float>({1, 2, 3})));
  ASSERT_TRUE(WaitFor(first).ok());
  ASSERT_TRUE(WaitFor(second).ok());
  EXPECT_TRUE(cluster.node(0).InFlight().empty());
  records = cluster.node(0).FlightRecords(0);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].state, OpRecord::State::kCompleted);
  EXPECT_TRUE(records[0].status.ok());
  EXPECT_EQ(records[0].last_rank, 1);
}

}  // namespace
}  // namespace collectived
