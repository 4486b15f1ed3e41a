// A group on an asynchronous device backend — the in-process fabric's simulated device, which
// behaves as NcclBackend does (work enqueued on a stream that runs on a thread of its own,
// completions through WhenComplete) — without a GPU: ops are started, not waited for; up to
// max_ops_in_flight are enqueued at once, later ones wait (back-pressure) and holding nothing;
// completions come in issue order; groups do not wait for each other; an abort or a timeout
// with 16 ops in flight fails them and every later one, and the group forms again.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <vector>

#include "engine/group/rendezvous/group_registry.h"
#include "engine/group/transport/in_process/in_process_device_backend.h"
#include "engine/store/memory_store.h"
#include "tests/engine/group/group_cluster.h"

namespace collectived {
namespace {

using namespace group_testing;  // NOLINT: the helpers of this suite
using ::testing::HasSubstr;

constexpr Device kGpu{DeviceKind::kCuda, 0};

TensorView GpuZeros(size_t count) {
  return Tensor<int64_t>(std::vector<int64_t>(count, 0), kGpu);
}

Cluster::Options OnDevice(size_t in_flight = 16) {
  Cluster::Options options;
  options.device = DeviceKind::kCuda;
  options.max_ops_in_flight = in_flight;
  return options;
}

// The states of a node's ops as its flight recorder shows them, counted.
std::map<OpRecord::State, int> States(Group& group) {
  std::map<OpRecord::State, int> states;
  for (const OpRecord& record : group.FlightRecords(0)) ++states[record.state];
  return states;
}

// Completion order of works, as their callbacks saw it.
class CompletionOrder {
 public:
  void Watch(const std::shared_ptr<Work>& work) {
    work->AddCallback([this, seq = work->info().sequence_number](const Status&) {
      std::lock_guard<std::mutex> lock(mutex_);
      order_.push_back(seq);
    });
  }
  std::vector<uint64_t> order() {
    std::lock_guard<std::mutex> lock(mutex_);
    return order_;
  }

 private:
  std::mutex mutex_;
  std::vector<uint64_t> order_;
};

TEST(AsyncDeviceTest, SixteenOpsAreInFlightAtOnceAndTheRestWaitHoldingNothing_OneNodeTwoRanks) {
  Cluster cluster("depth", {"a", "a"}, OnDevice(16));
  ASSERT_TRUE(cluster.fabric().HoldDevice("depth", 0).ok());
  constexpr int kOps = 20;
  std::vector<std::vector<TensorView>> tensors(2);
  std::vector<std::vector<std::shared_ptr<Work>>> works(2);
  CompletionOrder order;
  for (int op = 0; op < kOps; ++op) {
    for (int r = 0; r < 2; ++r) {
      tensors[r].push_back(Tensor<int64_t>({r + 1, op}, kGpu));
      works[r].push_back(cluster.Submit(r, AllReduce(tensors[r].back())));
      if (r == 0) order.Watch(works[r].back());
    }
  }
  // The device holds every completion: 16 ops enqueued, the other 4 wait (no thread for them).
  ASSERT_TRUE(Eventually([&] { return States(cluster.node(0))[OpRecord::State::kRunning] == 16; }));
  EXPECT_EQ(States(cluster.node(0))[OpRecord::State::kWaitingForPeers], 4);
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(States(cluster.node(0))[OpRecord::State::kRunning], 16) << "more than the depth";
  for (const auto& work : works[0]) EXPECT_FALSE(work->IsCompleted());

  // Back-pressure: each completion lets exactly one waiting op start.
  ASSERT_TRUE(cluster.fabric().AllowDeviceCompletions("depth", 0, 1).ok());
  ASSERT_TRUE(WaitFor(works[0][0]).ok());
  ASSERT_TRUE(
      Eventually([&] { return States(cluster.node(0))[OpRecord::State::kWaitingForPeers] == 3; }));
  EXPECT_EQ(States(cluster.node(0))[OpRecord::State::kRunning], 16);
  EXPECT_FALSE(works[0][1]->IsCompleted());

  ASSERT_TRUE(cluster.fabric().ReleaseDevice("depth", 0).ok());
  for (int r = 0; r < 2; ++r) {
    for (int op = 0; op < kOps; ++op) {
      ASSERT_TRUE(WaitFor(works[r][op]).ok()) << works[r][op]->status().ToString();
      EXPECT_EQ(Values(tensors[r][op]), (std::vector<int64_t>{3, 2 * op})) << "op " << op;
    }
  }
  std::vector<uint64_t> expected;
  for (int op = 1; op <= kOps; ++op) expected.push_back(op);
  EXPECT_TRUE(Eventually([&] { return order.order().size() == kOps; }));
  EXPECT_EQ(order.order(), expected) << "completions out of issue order";
}

TEST(AsyncDeviceTest, OpsAcrossSidecarsPipelineAndCompleteInOrder_TwoNodesTwoRanks) {
  Cluster cluster("pipelined", {"a", "b", "a", "b"}, OnDevice(4));
  ASSERT_TRUE(cluster.fabric().SetDeviceDelay("pipelined", 0, milliseconds(2)).ok());
  constexpr int kOps = 40;
  std::vector<std::vector<TensorView>> tensors(4);
  std::vector<std::vector<std::shared_ptr<Work>>> works(4);
  CompletionOrder order;
  ForEachRank(4, [&](int r) {
    for (int op = 0; op < kOps; ++op) {
      tensors[r].push_back(Tensor<float>({static_cast<float>(r), static_cast<float>(op)}, kGpu));
    }
  });
  for (int op = 0; op < kOps; ++op) {
    for (int r = 0; r < 4; ++r) {
      works[r].push_back(cluster.Submit(r, AllReduce(tensors[r][op], ReduceOp::Avg())));
      if (r == 0) order.Watch(works[r].back());
    }
  }
  for (int r = 0; r < 4; ++r) {
    for (int op = 0; op < kOps; ++op) {
      ASSERT_TRUE(WaitFor(works[r][op]).ok()) << works[r][op]->status().ToString();
      EXPECT_EQ(Values<float>(tensors[r][op]), (std::vector<float>{1.5f, static_cast<float>(op)}));
    }
  }
  EXPECT_TRUE(Eventually([&] { return order.order().size() == kOps; }));
  for (int op = 0; op < kOps; ++op) EXPECT_EQ(order.order()[op], static_cast<uint64_t>(op + 1));
}

TEST(AsyncDeviceTest, AGroupWhoseDeviceIsSlowDoesNotHoldUpAnother_OneNodeOneRank) {
  Cluster slow("slow", {"a"}, OnDevice());
  Cluster fast("fast", {"a"}, OnDevice());
  ASSERT_TRUE(slow.fabric().HoldDevice("slow", 0).ok());
  auto held = slow.Submit(0, AllReduce(Tensor<int64_t>({1}, kGpu)));
  std::vector<std::shared_ptr<Work>> quick;
  for (int op = 0; op < 10; ++op)
    quick.push_back(fast.Submit(0, AllReduce(Tensor<int64_t>({op}, kGpu))));
  for (const auto& work : quick) EXPECT_TRUE(WaitFor(work).ok());
  EXPECT_FALSE(held->IsCompleted()) << "the other group's ops completed first, as they should";
  ASSERT_TRUE(slow.fabric().ReleaseDevice("slow", 0).ok());
  EXPECT_TRUE(WaitFor(held).ok());
}

TEST(AsyncDeviceTest, AnAbortWithSixteenOpsInFlightFailsThemAndEveryLaterOne_TwoNodesOneRank) {
  Cluster cluster("abort-in-flight", {"a", "b"}, OnDevice(16));
  for (int node = 0; node < 2; ++node) {
    ASSERT_TRUE(cluster.fabric().HoldDevice("abort-in-flight", node).ok());
  }
  std::vector<std::shared_ptr<Work>> works;
  for (int op = 0; op < 20; ++op) {
    for (int r = 0; r < 2; ++r) works.push_back(cluster.Submit(r, AllReduce(GpuZeros(4))));
  }
  ASSERT_TRUE(Eventually([&] { return States(cluster.node(0))[OpRecord::State::kRunning] == 16; }));
  const Status abort = Status::Aborted("operator abort");
  cluster.node(0).Fail(abort);
  // Node 1 learns it as the registry tells it (the store's failure record): as a peer's failure.
  cluster.node(1).Fail(abort, /*from_peer=*/true);
  for (const auto& work : works) {
    Status status = WaitFor(work);
    EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("operator abort"));
  }
  Status later = WaitFor(cluster.Submit(0, AllReduce(GpuZeros(4))));
  EXPECT_EQ(later.kind(), ErrorKind::kAborted);
}

TEST(AsyncDeviceTest, ATimeoutWithSixteenOpsInFlightRunsOnTheClockAndFailsThemAll_OneNodeOneRank) {
  ManualClock clock;
  Cluster::Options options = OnDevice(16);
  options.clock = &clock;
  options.timeout = std::chrono::minutes(30);
  Cluster cluster("stuck-device", {"a"}, options);
  ASSERT_TRUE(cluster.fabric().HoldDevice("stuck-device", 0).ok());
  std::vector<std::shared_ptr<Work>> works;
  for (int op = 0; op < 20; ++op) works.push_back(cluster.Submit(0, AllReduce(GpuZeros(4))));
  ASSERT_TRUE(Eventually([&] { return States(cluster.node(0))[OpRecord::State::kRunning] == 16; }));
  clock.Advance(std::chrono::minutes(29));
  cluster.runtime(0).timers().Settle();
  for (const auto& work : works) EXPECT_FALSE(work->IsCompleted()) << "before its deadline";
  clock.Advance(std::chrono::minutes(2));  // 31 minutes: past the first op's deadline
  for (size_t op = 0; op < works.size(); ++op) {
    ASSERT_TRUE(works[op]
                    ->future()
                    .WaitUntil(std::chrono::steady_clock::now() + std::chrono::seconds(20))
                    .ok() ||
                works[op]->IsCompleted())
        << "op " << op << " never completed";
    const Status status = works[op]->status();
    EXPECT_TRUE(status.IsTimeout()) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("allreduce (seq 1) on group 'stuck-device'"));
    EXPECT_THAT(status.message(), HasSubstr("its device work did not complete"));
  }
}

TEST(AsyncDeviceTest, StreamOrderedOpsGetTheirEventBeforeTheyComplete_OneNodeTwoRanks) {
  Cluster cluster("events", {"a", "a"}, OnDevice());
  ASSERT_TRUE(cluster.fabric().HoldDevice("events", 0).ok());
  std::mutex mutex;  // the events come on the executor
  std::vector<std::string> handed(2);
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < 2; ++r) {
    OpRequest request = AllReduce(Tensor<int64_t>({r}, kGpu));
    request.on_enqueued = [&mutex, &handed, r](const std::string& event) {
      std::lock_guard<std::mutex> lock(mutex);
      handed[r] = event;
    };
    works.push_back(cluster.Submit(r, std::move(request)));
  }
  // Enqueued, not complete: the trainers already hold the event recorded after the op's work.
  ASSERT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(mutex);
    return !handed[0].empty() && !handed[1].empty();
  }));
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_EQ(handed[0], "simulated-event:1");
  EXPECT_EQ(handed[1], handed[0]);
  EXPECT_FALSE(works[0]->IsCompleted());
  ASSERT_TRUE(cluster.fabric().ReleaseDevice("events", 0).ok());
  for (const auto& work : works) EXPECT_TRUE(WaitFor(work).ok());
}

// Submits `ops` allreduces of every rank, each asking for its completion event (as the
// stream-ordered wait does), with the device held until all are submitted; checks the results.
void RunStreamOrderedOps(Cluster& cluster, const std::string& group, int ranks, int ops) {
  ASSERT_TRUE(cluster.fabric().HoldDevice(group, 0).ok());
  std::vector<TensorView> tensors;
  std::vector<std::shared_ptr<Work>> works;
  for (int op = 0; op < ops; ++op) {
    for (int r = 0; r < ranks; ++r) {
      tensors.push_back(Tensor<int64_t>({r + 1, op}, kGpu));
      OpRequest request = AllReduce(tensors.back());
      request.on_enqueued = [](const std::string&) {};
      works.push_back(cluster.Submit(r, std::move(request)));
    }
  }
  ASSERT_TRUE(cluster.fabric().ReleaseDevice(group, 0).ok());
  const int64_t total = ranks * (ranks + 1) / 2;
  for (size_t i = 0; i < works.size(); ++i) {
    ASSERT_TRUE(WaitFor(works[i]).ok()) << works[i]->status().ToString();
    const int64_t op = static_cast<int64_t>(i) / ranks;
    EXPECT_EQ(Values(tensors[i]), (std::vector<int64_t>{total, ranks * op})) << "op " << op;
  }
}

TEST(AsyncDeviceTest, AnOpIsWatchedAtItsOwnCompletionEventWhenTheRingOutlastsTheDepth_OneNode) {
  // A ring exactly as long as the depth: with 16 ops in flight, an event is recorded again only
  // once the op that recorded it before concluded.
  Cluster cluster("watched-at-event", {"a", "a"}, OnDevice(16));
  ASSERT_TRUE(cluster.fabric().SetCompletionEventRing("watched-at-event", 0, 16).ok());
  RunStreamOrderedOps(cluster, "watched-at-event", 2, 50);
  StatusOr<InProcessFabric::DeviceWatches> watches =
      cluster.fabric().DeviceWatchesOf("watched-at-event", 0);
  ASSERT_TRUE(watches.ok()) << watches.status().ToString();
  EXPECT_EQ(watches->at_completion_events, 50) << "each op watched at the event it recorded";
  EXPECT_EQ(watches->own, 0);
  EXPECT_EQ(watches->recorded_while_watched, 0) << "an event recorded again while watched";

  // An op that asked for no event gets a watch of its own.
  auto plain = cluster.Submit(0, AllReduce(Tensor<int64_t>({1}, kGpu)));
  auto other = cluster.Submit(1, AllReduce(Tensor<int64_t>({2}, kGpu)));
  ASSERT_TRUE(WaitFor(plain).ok());
  ASSERT_TRUE(WaitFor(other).ok());
  EXPECT_EQ(cluster.fabric().DeviceWatchesOf("watched-at-event", 0)->own, 1);
}

TEST(AsyncDeviceTest, AGroupDeeperThanTheRingWatchesWithMarksOfItsOwn_OneNodeOneRank) {
  // Depth 16, a ring of 8: the 9th op records the first op's event again while it may still be
  // in flight, so no op is watched at its event.
  Cluster cluster("ring-too-short", {"a"}, OnDevice(16));
  ASSERT_TRUE(cluster.fabric().SetCompletionEventRing("ring-too-short", 0, 8).ok());
  RunStreamOrderedOps(cluster, "ring-too-short", 1, 40);
  StatusOr<InProcessFabric::DeviceWatches> watches =
      cluster.fabric().DeviceWatchesOf("ring-too-short", 0);
  ASSERT_TRUE(watches.ok()) << watches.status().ToString();
  EXPECT_EQ(watches->at_completion_events, 0);
  EXPECT_EQ(watches->own, 40);
}

TEST(AsyncDeviceTest, ARemoteSendOfAnotherSizeIsDroppedAndTheStreamStaysInStep_TwoNodesOneRank) {
  // The receiving device backend is asked to take the bytes into nothing (no host scratch
  // memory passed off as device memory); as on host memory otherwise.
  Cluster cluster("device-p2p-mismatch", {"a", "b"}, OnDevice());
  ExpectARemoteSizeMismatchKeepsTheStreamInStep(cluster, kGpu);
}

TEST(AsyncDeviceTest, AnnouncedReceivesStartOffTheTransportThreadInOrder_TwoNodesOneRank) {
  // A recv posted before its send is matched when the send's announcement arrives, on the
  // transport's thread; starting its transfer there (NcclBackend records an event, and waits
  // for the trainer's) could stall every transfer of the mesh. Such receives start on the
  // executor, in their announcements' order, so each recv still gets its own send's bytes.
  Cluster cluster("announced-receives", {"a", "b"}, OnDevice());
  constexpr int kMessages = 40;
  std::vector<TensorView> received;
  std::vector<std::shared_ptr<Work>> recvs, sends;
  for (int i = 0; i < kMessages; ++i) {
    if (i == kMessages / 2) {  // half the recvs wait for their sends, half come after them
      for (int64_t k = 0; k < kMessages; ++k) {
        sends.push_back(
            cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({k}, kGpu), 1, 7)));
      }
      // The later recvs find their announcements waiting (matched on the submitting thread).
      std::this_thread::sleep_for(milliseconds(50));
    }
    received.push_back(Tensor<int64_t>({-1}, kGpu));
    recvs.push_back(cluster.Submit(1, PointToPointOp(OpKind::kRecv, received.back(), 0, 7)));
  }
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE(WaitFor(sends[i]).ok()) << sends[i]->status().ToString();
    ASSERT_TRUE(WaitFor(recvs[i]).ok()) << recvs[i]->status().ToString();
    EXPECT_EQ(Values(received[i]), std::vector<int64_t>{i}) << "recv " << i;
  }
  for (int node : {0, 1}) {
    StatusOr<int> calls = cluster.fabric().DeviceCallsOnTransportThread("announced-receives", node);
    ASSERT_TRUE(calls.ok()) << calls.status().ToString();
    EXPECT_EQ(*calls, 0) << "device calls on the transport's thread, node " << node;
  }
}

TEST(AsyncDeviceTest, TheStreamWaitsForTheTrainersReadyEvent_OneNodeOneRank) {
  Cluster cluster("ready", {"a"}, OnDevice());
  auto ready = std::make_shared<SimulatedDeviceEvent>();
  TensorView tensor = Tensor<int64_t>({5}, kGpu);
  tensor.ready = ready;
  auto work = cluster.Submit(0, AllReduce(tensor));
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_FALSE(work->IsCompleted()) << "ran before the trainer's event";
  ready->Signal();
  EXPECT_TRUE(WaitFor(work).ok());
}

TEST(AsyncDeviceTest, AnOpWhoseLaunchFailsConcludesOnlyOnceTheStreamRanItsWork_OneNodeTwoRanks) {
  Cluster cluster("failed-launch", {"a", "a"}, OnDevice());
  // The op's first launch goes on the stream, its second fails at once (as a kernel launch or
  // an NCCL call may); the stream is still held by the trainers' ready events meanwhile.
  ASSERT_TRUE(cluster.fabric()
                  .FailDeviceCall("failed-launch", 0, 1,
                                  Status::InvalidArgument("injected: a launch was refused"))
                  .ok());
  std::vector<std::shared_ptr<SimulatedDeviceEvent>> ready;
  std::vector<std::shared_ptr<Work>> works;
  for (int r = 0; r < 2; ++r) {
    ready.push_back(std::make_shared<SimulatedDeviceEvent>());
    TensorView tensor = Tensor<int64_t>({r + 1, 7}, kGpu);
    tensor.ready = ready.back();
    works.push_back(cluster.Submit(r, AllReduce(tensor)));
  }
  std::this_thread::sleep_for(milliseconds(50));
  for (const auto& work : works) {
    EXPECT_FALSE(work->IsCompleted()) << "concluded while its work was still on the stream";
  }
  for (const auto& event : ready) event->Signal();
  for (const auto& work : works) {
    const Status status = WaitFor(work);
    EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("injected: a launch was refused"));
  }
  // A refused launch fails the op, not the group: the next op runs.
  std::vector<TensorView> next = {Tensor<int64_t>({1}, kGpu), Tensor<int64_t>({2}, kGpu)};
  std::vector<std::shared_ptr<Work>> again;
  for (int r = 0; r < 2; ++r) again.push_back(cluster.Submit(r, AllReduce(next[r])));
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(WaitFor(again[r]).ok()) << again[r]->status().ToString();
    EXPECT_EQ(Values(next[r]), (std::vector<int64_t>{3}));
  }
}

TEST(AsyncDeviceTest, EveryCollectiveIsExactOnTheSimulatedDevice_TwoNodesTwoRanks) {
  Cluster cluster("device-collectives", {"a", "b", "b", "a"}, OnDevice());
  const int n = 4;
  std::vector<TensorView> gathered(n), scattered(n), broadcast(n);
  std::vector<std::vector<std::shared_ptr<Work>>> works(n);
  for (int r = 0; r < n; ++r) {
    OpRequest all_gather;
    all_gather.kind = OpKind::kAllGatherIntoTensor;
    all_gather.inputs = {Tensor<int64_t>({r * 10, r * 10 + 1}, kGpu)};
    gathered[r] = Tensor<int64_t>(std::vector<int64_t>(2 * n, -1), kGpu);
    all_gather.outputs = {gathered[r]};
    works[r].push_back(cluster.Submit(r, std::move(all_gather)));

    OpRequest reduce_scatter;
    reduce_scatter.kind = OpKind::kReduceScatterTensor;
    std::vector<int64_t> in;
    for (int i = 0; i < n; ++i) in.push_back(r + i * 100);
    reduce_scatter.inputs = {Tensor<int64_t>(in, kGpu)};
    scattered[r] = Tensor<int64_t>({0}, kGpu);
    reduce_scatter.outputs = {scattered[r]};
    works[r].push_back(cluster.Submit(r, std::move(reduce_scatter)));

    OpRequest bcast;
    bcast.kind = OpKind::kBroadcast;
    bcast.root = 2;
    broadcast[r] = Tensor<int64_t>({r == 2 ? 42 : 0}, kGpu);
    bcast.inputs = {broadcast[r]};
    works[r].push_back(cluster.Submit(r, std::move(bcast)));

    OpRequest barrier;
    barrier.kind = OpKind::kBarrier;
    works[r].push_back(cluster.Submit(r, std::move(barrier)));
  }
  for (int r = 0; r < n; ++r) {
    for (const auto& work : works[r]) ASSERT_TRUE(WaitFor(work).ok()) << work->status().ToString();
    EXPECT_EQ(Values(gathered[r]), (std::vector<int64_t>{0, 1, 10, 11, 20, 21, 30, 31}));
    EXPECT_EQ(Values(scattered[r]), (std::vector<int64_t>{0 + 1 + 2 + 3 + 4 * 100 * r}));
    EXPECT_EQ(Values(broadcast[r]), (std::vector<int64_t>{42}));
  }
}

TEST(AsyncDeviceTest, AnAbortedDeviceGroupFormsAgainThroughTheRegistry_TwoNodesOneRank) {
  auto fabric = InProcessFabric::Create();
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::unique_ptr<GroupRegistry>> registries;
  for (const char* id : {"a", "b"}) {
    GroupRegistryOptions options;
    options.sidecar_id = id;
    options.transports = fabric;
    registries.push_back(std::make_unique<GroupRegistry>(options));
  }
  auto join = [&](int rank) {
    JoinRequest request;
    request.name = "again";
    request.rank = rank;
    request.world_size = 2;
    request.store = store;
    request.device = DeviceKind::kCuda;
    request.timeout = milliseconds(10000);
    return registries[rank]->Join(request);
  };
  for (int round = 0; round < 2; ++round) {
    std::vector<StatusOr<Membership>> members(2, Status::Internal("not joined"));
    ForEachRank(2, [&](int r) { members[r] = join(r); });
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(members[r].ok()) << members[r].status().ToString();
    if (round == 0) {
      // Both devices hold: a rank whose own device completed an op would rightly succeed.
      for (int node = 0; node < 2; ++node) ASSERT_TRUE(fabric->HoldDevice("again", node).ok());
      std::vector<std::shared_ptr<Work>> works;
      for (int op = 0; op < 16; ++op) {
        for (int r = 0; r < 2; ++r) {
          works.push_back(members[r]->group->Submit(r, AllReduce(Tensor<int64_t>({1}, kGpu))));
        }
      }
      ASSERT_TRUE(registries[0]->FailGroup("again", Status::Aborted("operator abort")).ok());
      for (size_t i = 0; i < works.size(); ++i)
        EXPECT_FALSE(WaitFor(works[i]).ok()) << "work " << i;
    } else {
      TensorView a = Tensor<int64_t>({1}, kGpu), b = Tensor<int64_t>({2}, kGpu);
      auto wa = members[0]->group->Submit(0, AllReduce(a));
      auto wb = members[1]->group->Submit(1, AllReduce(b));
      EXPECT_TRUE(WaitFor(wa).ok()) << wa->status().ToString();
      EXPECT_TRUE(WaitFor(wb).ok());
      EXPECT_EQ(Values(a), std::vector<int64_t>{3});
    }
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(registries[r]->Leave("again", r).ok());
  }
  registries.clear();
}

}  // namespace
}  // namespace collectived
