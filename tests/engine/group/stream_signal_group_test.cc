// Stream signals through a group (OpRequest::stream_signal): on a device group the stream sets
// each rank's word after the op's work and before the op completes (the trainer's stream is
// released with no response); a host group, and a device group whose device refuses signals,
// store it before the op's completion; a failed op's word is stored when it concludes too, so
// that no stream waits on it for ever whatever the client can do.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <vector>

#include "engine/group/transport/in_process/in_process_device_backend.h"
#include "engine/vocabulary/stream_signal.h"
#include "tests/engine/group/group_cluster.h"

namespace collectived {
namespace {

using namespace group_testing;  // NOLINT: the helpers of this suite
using ::testing::HasSubstr;

constexpr Device kGpu{DeviceKind::kCuda, 0};

// A rank's signal words: a sealed memfd mapped by the "sidecar" (a segment).
class Words {
 public:
  Words() {
    const int fd = memfd_create("signal-words", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, 4096), 0);
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    auto segment = ShmSegment::Adopt(fd, 0, "signal words");
    EXPECT_TRUE(segment.ok()) << segment.status().ToString();
    segment_ = *segment;
  }
  StreamSignal Signal(size_t index, uint32_t value) {
    StatusOr<StreamSignal> signal = MakeStreamSignal(segment_, index * 4, value);
    EXPECT_TRUE(signal.ok()) << signal.status().ToString();
    return *signal;
  }
  uint32_t operator[](size_t index) const {
    return std::atomic_ref<uint32_t>(reinterpret_cast<uint32_t*>(segment_->data())[index]).load();
  }

 private:
  std::shared_ptr<ShmSegment> segment_;
};

OpRequest Signalled(OpRequest request, StreamSignal signal) {
  request.stream_signal = std::move(signal);
  return request;
}

Cluster::Options OnDevice() {
  Cluster::Options options;
  options.device = DeviceKind::kCuda;
  return options;
}

TEST(StreamSignalGroupTest,
     TheStreamSetsEachRanksWordAfterTheOpsWorkBeforeItCompletes_OneNodeTwoRanks) {
  Cluster cluster("signals", {"a", "a"}, OnDevice());
  ASSERT_TRUE(cluster.fabric().HoldDevice("signals", 0).ok());  // completions wait
  auto producer = std::make_shared<SimulatedDeviceEvent>();     // holds the stream at op 1
  Words words[2];
  std::vector<std::shared_ptr<Work>> works;
  std::vector<TensorView> tensors;
  for (uint32_t op = 0; op < 3; ++op) {
    for (int r = 0; r < 2; ++r) {
      tensors.push_back(Tensor<int64_t>({r + 1, op}, kGpu));
      if (op == 0 && r == 0) tensors.back().ready = producer;
      works.push_back(
          cluster.Submit(r, Signalled(AllReduce(tensors.back()), words[r].Signal(op, 10 + op))));
    }
  }
  std::this_thread::sleep_for(milliseconds(30));
  for (uint32_t op = 0; op < 3; ++op) {
    EXPECT_EQ(words[0][op], 0u) << "set before the producer's event let op " << op << " run";
  }
  producer->Signal();
  ASSERT_TRUE(Eventually([&] { return words[0][0] == 10 && words[1][0] == 10; }));
  // The word is the trainer's only news so far: op 1's results are there, its completion is
  // not (the held device stops its stream there, before op 2's work).
  EXPECT_EQ(Values(tensors[0]), (std::vector<int64_t>{3, 0}));
  EXPECT_FALSE(works[0]->IsCompleted());
  EXPECT_EQ(words[0][1], 0u);
  ASSERT_TRUE(cluster.fabric().ReleaseDevice("signals", 0).ok());
  for (const auto& work : works) EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  for (int r = 0; r < 2; ++r) {
    for (uint32_t op = 0; op < 3; ++op) EXPECT_EQ(words[r][op], 10 + op) << r << "/" << op;
  }
}

TEST(StreamSignalGroupTest, OpsThatFailHaveTheirWordsSetBeforeTheyComplete_TwoNodesOneRank) {
  Cluster cluster("signals-abort", {"a", "b"}, OnDevice());
  auto never = std::make_shared<SimulatedDeviceEvent>();  // the producer never finishes
  Words words[2];
  std::vector<std::shared_ptr<Work>> works;
  std::atomic<int> set_at_completion{0};
  for (uint32_t op = 0; op < 3; ++op) {
    for (int r = 0; r < 2; ++r) {
      TensorView tensor = Tensor<int64_t>({r, op}, kGpu);
      if (op == 0 && r == 0) tensor.ready = never;
      works.push_back(cluster.Submit(r, Signalled(AllReduce(tensor), words[r].Signal(op, 1 + op))));
      // Watched from the start: the failure below completes them on its own thread.
      works.back()->AddCallback([&, r, op](const Status&) {
        if (words[r][op] == 1 + op) ++set_at_completion;
      });
    }
  }
  std::this_thread::sleep_for(milliseconds(30));
  for (int r = 0; r < 2; ++r) EXPECT_EQ(words[r][0], 0u) << "set while its op waited";
  const Status abort = Status::Aborted("operator abort");
  cluster.node(0).Fail(abort);
  cluster.node(1).Fail(abort, /*from_peer=*/true);
  for (const auto& work : works) EXPECT_EQ(WaitFor(work).kind(), ErrorKind::kAborted);
  std::shared_ptr<Work> later =
      cluster.Submit(1, Signalled(AllReduce(Tensor<int64_t>({1}, kGpu)), words[1].Signal(3, 4)));
  EXPECT_EQ(WaitFor(later).kind(), ErrorKind::kAborted);
  EXPECT_EQ(words[1][3], 4u) << "an op refused by the failed group left its word";
  EXPECT_TRUE(Eventually([&] { return set_at_completion.load() == 6; }))
      << "a failed op completed before its word was set";
  for (int r = 0; r < 2; ++r) {
    for (uint32_t op = 0; op < 3; ++op) EXPECT_EQ(words[r][op], 1 + op) << r << "/" << op;
  }
  never->Signal();
}

TEST(StreamSignalGroupTest, ARankWhoseSessionEndsHasTheWordsOfItsOpsSet_OneNodeTwoRanks) {
  Cluster cluster("signals-rank-gone", {"a", "a"}, OnDevice());
  Words words;
  // Rank 0's ops wait for rank 1, which never comes; then rank 0's session ends.
  std::vector<std::shared_ptr<Work>> works;
  std::atomic<int> set_at_completion{0};
  for (uint32_t op = 0; op < 3; ++op) {
    works.push_back(cluster.Submit(
        0, Signalled(AllReduce(Tensor<int64_t>({1}, kGpu)), words.Signal(op, 10 + op))));
    works.back()->AddCallback([&, op](const Status&) {
      if (words[op] == 10 + op) ++set_at_completion;
    });
  }
  std::this_thread::sleep_for(milliseconds(20));
  for (uint32_t op = 0; op < 3; ++op) EXPECT_EQ(words[op], 0u) << "set before the op ended";
  cluster.node(0).AbortRank(0, Status::Aborted("rank 0's session ended"));
  for (const auto& work : works) EXPECT_EQ(WaitFor(work).kind(), ErrorKind::kAborted);
  EXPECT_TRUE(Eventually([&] { return set_at_completion.load() == 3; }))
      << "an op of the rank completed before its word was set";
}

TEST(StreamSignalGroupTest, ADeviceThatRefusesSignalsLeavesThemToTheConclusion_OneNodeOneRank) {
  Cluster cluster("refused-signals", {"a"}, OnDevice());
  ASSERT_TRUE(cluster.fabric().RefuseStreamSignals("refused-signals", 0).ok());
  ASSERT_TRUE(cluster.fabric().HoldDevice("refused-signals", 0).ok());
  Words words;
  std::atomic<bool> set_at_completion{false};
  auto work =
      cluster.Submit(0, Signalled(AllReduce(Tensor<int64_t>({5}, kGpu)), words.Signal(0, 3)));
  work->AddCallback([&](const Status&) { set_at_completion = words[0] == 3; });
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_EQ(words[0], 0u) << "the device wrote a signal it refused";
  EXPECT_FALSE(work->IsCompleted());
  ASSERT_TRUE(cluster.fabric().ReleaseDevice("refused-signals", 0).ok());
  ASSERT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  EXPECT_TRUE(Eventually([&] { return set_at_completion.load(); }))
      << "the group did not store the word before completing the op";
}

TEST(StreamSignalGroupTest, AHostGroupStoresTheWordBeforeTheOpCompletes_TwoNodesOneRank) {
  Cluster cluster("host-signals", {"a", "b"}, Cluster::Options{});
  Words words[2];
  std::vector<std::shared_ptr<Work>> works;
  std::atomic<int> seen_set{0};
  for (int r = 0; r < 2; ++r) {
    works.push_back(cluster.Submit(
        r, Signalled(AllReduce(Tensor<float>({1.0f, 2.0f})), words[r].Signal(5, 41))));
    works.back()->AddCallback([&, r](const Status&) {
      if (words[r][5] == 41) ++seen_set;
    });
  }
  for (const auto& work : works) ASSERT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  EXPECT_TRUE(Eventually([&] { return seen_set.load() == 2; }))
      << "a completion came before its word";

  // A desync fails the op on both ranks: the words are set all the same.
  std::vector<std::shared_ptr<Work>> desynced;
  for (int r = 0; r < 2; ++r) {
    std::vector<float> values(static_cast<size_t>(r + 1), 1.0f);
    desynced.push_back(
        cluster.Submit(r, Signalled(AllReduce(Tensor<float>(values)), words[r].Signal(6, 42))));
  }
  for (const auto& work : desynced) {
    Status status = WaitFor(work);
    EXPECT_EQ(status.kind(), ErrorKind::kDesync) << status.ToString();
  }
  EXPECT_EQ(words[0][6], 42u);
  EXPECT_EQ(words[1][6], 42u);
}

}  // namespace
}  // namespace collectived
