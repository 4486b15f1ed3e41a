// Group over the in-process fabric: send and recv between ranks of one sidecar and across
// sidecars, matched per pair and tag in order, from any source, bounded, sized and timed out.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "engine/group/core/group.h"
#include "tests/engine/group/group_test_helpers.h"

namespace collectived {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using namespace group_testing;  // NOLINT: the helpers of this suite

// --- send / recv ---

TEST(GroupTest, SendRecvBetweenLocalRanksMatchInOrderPerTag_OneNodeTwoRanks) {
  Cluster cluster("p2p-local", {"a", "a"});
  // Two messages on tag 7 arrive in order; a recv on tag 2 posted first is independent.
  TensorView first = Zeros(2), second = Zeros(2), other_tag = Zeros(1);
  auto recv_other = cluster.Submit(1, PointToPointOp(OpKind::kRecv, other_tag, 0, 2));
  auto recv_first = cluster.Submit(1, PointToPointOp(OpKind::kRecv, first, 0, 7));
  auto recv_second = cluster.Submit(1, PointToPointOp(OpKind::kRecv, second, 0, 7));
  auto send_first = cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({1, 2}), 1, 7));
  auto send_second =
      cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({3, 4}), 1, 7));
  EXPECT_FALSE(recv_other->IsCompleted());
  auto send_other = cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({9}), 1, 2));
  for (auto& work : {recv_first, recv_second, send_first, send_second, recv_other, send_other})
    EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  EXPECT_EQ(Values(first), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Values(second), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(Values(other_tag), std::vector<int64_t>{9});
  // Point-to-point ops take no sequence number.
  EXPECT_EQ(cluster.node(0).SequenceNumber(), 0u);
}

TEST(GroupTest, LocalSendRecvSizeMismatchNamesBothSizes_OneNodeTwoRanks) {
  Cluster cluster("p2p-mismatch", {"a", "a"});
  auto recv = cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, 0));
  auto send = cluster.Submit(0, PointToPointOp(OpKind::kSend, Zeros(2), 1, 0));
  for (auto& work : {recv, send}) {
    Status status = WaitFor(work);
    EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
    EXPECT_THAT(status.message(),
                HasSubstr("the send has 16 bytes but the matching recv expects 8"));
  }
  EXPECT_TRUE(cluster.node(0).failure().ok());
}

TEST(GroupTest, PendingSendsAndRecvsAreBoundedPerGroup_OneNodeTwoRanks) {
  Cluster cluster("p2p-bounded", {"a", "a"});
  std::vector<std::shared_ptr<Work>> pending;
  for (size_t i = 0; i < PointToPoint::kMaxPending; ++i) {
    pending.push_back(
        cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, static_cast<int64_t>(i))));
  }
  auto refused = cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, -1));
  ASSERT_TRUE(refused->IsCompleted());
  EXPECT_EQ(refused->status().kind(), ErrorKind::kResourceExhausted)
      << refused->status().ToString();
  EXPECT_THAT(refused->status().message(),
              HasSubstr("recv (rank 1 from rank 0, tag -1) on group 'p2p-bounded': 4096 sends and "
                        "receives of this group are already pending on this sidecar"));
  // A matching send still completes a pending recv, and frees a place.
  TensorView value = Tensor<int64_t>({42});
  EXPECT_TRUE(WaitFor(cluster.Submit(0, PointToPointOp(OpKind::kSend, value, 1, 7))).ok());
  EXPECT_TRUE(WaitFor(pending[7]).ok());
  auto admitted = cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, -2));
  EXPECT_FALSE(admitted->IsCompleted());
  EXPECT_TRUE(cluster.node(0).failure().ok());
}

TEST(GroupTest, UnmatchedLocalRecvTimesOut_OneNodeTwoRanks) {
  ManualClock clock;
  Cluster cluster("p2p-unmatched", {"a", "a"}, OnManualClock(clock));
  auto recv = cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, 3, kHalfHour));
  clock.Advance(kHalfHour - milliseconds(1));
  cluster.runtime(0).timers().Settle();
  EXPECT_FALSE(recv->IsCompleted()) << "a moment early";
  clock.Advance(milliseconds(1));
  Status status = WaitReally(recv);
  EXPECT_TRUE(status.IsTimeout()) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("recv (rank 1 from rank 0, tag 3) on group "
                                          "'p2p-unmatched'"));
  EXPECT_THAT(status.message(), HasSubstr(" Timed out after 1800000 ms"));
  // A local timeout does not fail the group.
  EXPECT_TRUE(cluster.node(0).failure().ok());
}

TEST(GroupTest, AnySourceRecvTakesTheFirstSendAndNamesItsSender_OneNodeThreeRanks) {
  Cluster cluster("any-local", {"a", "a", "a"});
  // A recv posted first takes whichever rank sends first.
  TensorView first = Zeros(1);
  auto recv_first = cluster.Submit(0, PointToPointOp(OpKind::kRecv, first, kAnySource, 5));
  auto send_two = cluster.Submit(2, PointToPointOp(OpKind::kSend, Tensor<int64_t>({22}), 0, 5));
  ASSERT_TRUE(WaitFor(recv_first).ok()) << recv_first->status().ToString();
  EXPECT_TRUE(WaitFor(send_two).ok());
  EXPECT_EQ(recv_first->source_rank(), 2);
  EXPECT_EQ(Values(first), std::vector<int64_t>{22});
  // Sends waiting before the recv: the one issued first wins, the other waits for the next.
  auto send_one = cluster.Submit(1, PointToPointOp(OpKind::kSend, Tensor<int64_t>({11}), 0, 5));
  auto send_two_again =
      cluster.Submit(2, PointToPointOp(OpKind::kSend, Tensor<int64_t>({23}), 0, 5));
  TensorView second = Zeros(1), third = Zeros(1);
  auto recv_second = cluster.Submit(0, PointToPointOp(OpKind::kRecv, second, kAnySource, 5));
  auto recv_third = cluster.Submit(0, PointToPointOp(OpKind::kRecv, third, kAnySource, 5));
  for (auto& work : {send_one, send_two_again, recv_second, recv_third})
    EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  EXPECT_EQ(recv_second->source_rank(), 1);
  EXPECT_EQ(Values(second), std::vector<int64_t>{11});
  EXPECT_EQ(recv_third->source_rank(), 2);
  EXPECT_EQ(Values(third), std::vector<int64_t>{23});
  // Another tag is another mailbox.
  auto other_tag =
      cluster.Submit(0, PointToPointOp(OpKind::kRecv, Zeros(1), kAnySource, 6, milliseconds(200)));
  auto unmatched =
      cluster.Submit(1, PointToPointOp(OpKind::kSend, Zeros(1), 0, 7, milliseconds(200)));
  Status timed_out = WaitFor(other_tag);
  EXPECT_TRUE(timed_out.IsTimeout()) << timed_out.ToString();
  EXPECT_THAT(timed_out.message(),
              AllOf(HasSubstr("recv (rank 0 from any rank, tag 6) on group 'any-local'"),
                    HasSubstr(" Timed out after 200 ms")));
  EXPECT_TRUE(WaitFor(unmatched).IsTimeout());
  EXPECT_EQ(other_tag->source_rank(), -1);
  EXPECT_TRUE(cluster.node(0).failure().ok());
}

TEST(GroupTest, AnySourceRecvAcrossSidecarsConsumesEachSendOnceInOrder_TwoNodesTwoRanks) {
  Cluster cluster("any-remote", {"a", "a", "b", "b"});
  // Rank 0 posts one recv named for rank 2, then five from any rank; ranks 1 (local), 2 and 3
  // (the other sidecar) send two messages each on one tag.
  TensorView named = Zeros(1);
  auto named_recv = cluster.Submit(0, PointToPointOp(OpKind::kRecv, named, 2, 9));
  std::vector<TensorView> received;
  std::vector<std::shared_ptr<Work>> recvs;
  for (int i = 0; i < 5; ++i) {
    received.push_back(Zeros(1));
    recvs.push_back(
        cluster.Submit(0, PointToPointOp(OpKind::kRecv, received.back(), kAnySource, 9)));
  }
  std::vector<std::shared_ptr<Work>> sends;
  for (int k = 0; k < 2; ++k) {
    for (int src : {3, 1, 2}) {
      sends.push_back(cluster.Submit(
          src, PointToPointOp(OpKind::kSend, Tensor<int64_t>({src * 10 + k}), 0, 9)));
    }
  }
  for (auto& work : sends) EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  ASSERT_TRUE(WaitFor(named_recv).ok()) << named_recv->status().ToString();
  EXPECT_EQ(named_recv->source_rank(), 2);
  EXPECT_EQ(Values(named), std::vector<int64_t>{20});
  std::map<int, std::vector<int64_t>> by_sender;
  for (size_t i = 0; i < recvs.size(); ++i) {
    ASSERT_TRUE(WaitFor(recvs[i]).ok()) << recvs[i]->status().ToString();
    const int src = recvs[i]->source_rank();
    EXPECT_EQ(Values(received[i])[0] / 10, src) << "recv " << i;
    by_sender[src].push_back(Values(received[i])[0]);
  }
  EXPECT_EQ(by_sender[1], (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(by_sender[2], (std::vector<int64_t>{21}));
  EXPECT_EQ(by_sender[3], (std::vector<int64_t>{30, 31}));
  // A send announced before any recv waits for it; a recv from any rank then takes it.
  auto early = cluster.Submit(3, PointToPointOp(OpKind::kSend, Tensor<int64_t>({77}), 1, 4));
  std::this_thread::sleep_for(milliseconds(50));
  TensorView late = Zeros(1);
  auto late_recv = cluster.Submit(1, PointToPointOp(OpKind::kRecv, late, kAnySource, 4));
  EXPECT_TRUE(WaitFor(early).ok()) << early->status().ToString();
  ASSERT_TRUE(WaitFor(late_recv).ok()) << late_recv->status().ToString();
  EXPECT_EQ(late_recv->source_rank(), 3);
  EXPECT_EQ(Values(late), std::vector<int64_t>{77});
  EXPECT_TRUE(cluster.node(0).failure().ok());
  EXPECT_TRUE(cluster.node(1).failure().ok());
}

TEST(GroupTest, SendRecvBetweenSidecarsMatchInOrderPerTag_TwoNodesTwoRanks) {
  Cluster cluster("p2p-remote", {"a", "a", "b", "b"});
  TensorView first = Zeros(2), second = Zeros(2), other_tag = Zeros(1), back = Zeros(3);
  auto send_first = cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({1, 2}), 3, 7));
  auto send_second =
      cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({3, 4}), 3, 7));
  auto recv_other = cluster.Submit(3, PointToPointOp(OpKind::kRecv, other_tag, 0, 8));
  auto recv_first = cluster.Submit(3, PointToPointOp(OpKind::kRecv, first, 0, 7));
  auto recv_second = cluster.Submit(3, PointToPointOp(OpKind::kRecv, second, 0, 7));
  auto send_other = cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({9}), 3, 8));
  auto recv_back = cluster.Submit(1, PointToPointOp(OpKind::kRecv, back, 2, 7));
  auto send_back =
      cluster.Submit(2, PointToPointOp(OpKind::kSend, Tensor<int64_t>({5, 6, 7}), 1, 7));
  for (auto& work : {send_first, send_second, recv_other, recv_first, recv_second, send_other,
                     recv_back, send_back})
    EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  EXPECT_EQ(Values(first), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(Values(second), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(Values(other_tag), std::vector<int64_t>{9});
  EXPECT_EQ(Values(back), (std::vector<int64_t>{5, 6, 7}));
  // Collectives still run after (and independently of) point-to-point traffic.
  ForEachRank(4, [&](int r) { EXPECT_TRUE(WaitFor(cluster.Submit(r, AllReduce(Zeros(1)))).ok()); });
  EXPECT_EQ(cluster.node(0).SequenceNumber(), 1u);
}

// Streams are matched by their exact (source, destination, tag): many tags between one pair and
// one tag between many pairs, sends and recvs interleaved in different orders, each recv gets its
// own message. Tags 1 and 2^32 once shared a slot (a 32-bit hash of the tag, h ^ h >> 32), as did
// t and t + 2^32.
TEST(GroupTest, SendRecvKeepEveryPairAndTagApart_TwoNodesTwoRanks) {
  Cluster cluster("p2p-keys", {"a", "a", "b", "b"});
  constexpr int64_t kHigh = int64_t{1} << 32;
  const std::vector<int64_t> tags = {0, 1,         kHigh,     kHigh + 1, -1,        -kHigh,
                                     7, 7 + kHigh, 7 - kHigh, INT64_MAX, INT64_MIN, 0x7fffffff};
  // Local (0 -> 1, 3 -> 2) and across the sidecars (0 -> 3, 2 -> 1, 1 -> 2, 3 -> 0).
  const std::vector<std::pair<int, int>> pairs = {{0, 1}, {3, 2}, {0, 3}, {2, 1}, {1, 2}, {3, 0}};
  auto value = [&](size_t pair, size_t tag) { return static_cast<int64_t>(1000 * pair + tag); };
  std::map<std::pair<size_t, size_t>, TensorView> received;
  std::map<std::pair<size_t, size_t>, std::shared_ptr<Work>> recvs;
  std::vector<std::shared_ptr<Work>> sends;
  auto post_recv = [&](size_t p, size_t t) {
    received[{p, t}] = Zeros(1);
    recvs[{p, t}] = cluster.Submit(
        pairs[p].second, PointToPointOp(OpKind::kRecv, received[{p, t}], pairs[p].first, tags[t]));
  };
  // Recvs of the even tags first, newest pair and tag first; then the sends, pair by pair within
  // each tag; then the recvs of the odd tags.
  for (size_t t = tags.size(); t-- > 0;) {
    for (size_t p = pairs.size(); p-- > 0;) {
      if (t % 2 == 0) post_recv(p, t);
    }
  }
  for (size_t t = 0; t < tags.size(); ++t) {
    for (size_t p = 0; p < pairs.size(); ++p) {
      sends.push_back(cluster.Submit(
          pairs[p].first,
          PointToPointOp(OpKind::kSend, Tensor<int64_t>({value(p, t)}), pairs[p].second, tags[t])));
    }
  }
  for (size_t t = 0; t < tags.size(); ++t) {
    for (size_t p = 0; p < pairs.size(); ++p) {
      if (t % 2 == 1) post_recv(p, t);
    }
  }
  for (auto& work : sends) EXPECT_TRUE(WaitFor(work).ok()) << work->status().ToString();
  for (auto& [key, work] : recvs) {
    const auto [p, t] = key;
    ASSERT_TRUE(WaitFor(work).ok()) << work->status().ToString();
    EXPECT_EQ(work->source_rank(), pairs[p].first);
    EXPECT_EQ(Values(received[key]), std::vector<int64_t>{value(p, t)})
        << "rank " << pairs[p].first << " to rank " << pairs[p].second << ", tag " << tags[t];
  }
  EXPECT_TRUE(cluster.node(0).failure().ok());
  EXPECT_TRUE(cluster.node(1).failure().ok());
}

TEST(GroupTest, RemoteSendRecvSizeMismatchNamesBothSizes_TwoNodesOneRank) {
  // The receiving sidecar knows the size from the envelope: the recv fails naming both sizes;
  // the bytes were taken (and dropped, into scratch memory), so the stream stays in step.
  Cluster cluster("p2p-remote-mismatch", {"a", "b"});
  ExpectARemoteSizeMismatchKeepsTheStreamInStep(cluster, Device{});
}

TEST(GroupTest, UnmatchedRemoteRecvTimesOutWithoutFailingTheGroup_TwoNodesOneRank) {
  ManualClock clock;
  Cluster cluster("p2p-remote-unmatched", {"a", "b"}, OnManualClock(clock));
  auto unmatched = cluster.Submit(1, PointToPointOp(OpKind::kRecv, Zeros(1), 0, 4, kHalfHour));
  clock.Advance(kHalfHour);
  Status status = WaitReally(unmatched);
  EXPECT_TRUE(status.IsTimeout()) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("recv (rank 1 from rank 0, tag 4) on group "
                                          "'p2p-remote-unmatched'"));
  EXPECT_THAT(status.message(), HasSubstr(" Timed out after 1800000 ms"));
  // No send was announced, so no transfer was started: the recv waited here and its timeout
  // leaves the group working.
  EXPECT_TRUE(cluster.node(1).failure().ok());
  TensorView value = Zeros(1);
  auto recv = cluster.Submit(1, PointToPointOp(OpKind::kRecv, value, 0, 4));
  EXPECT_TRUE(
      WaitReally(cluster.Submit(0, PointToPointOp(OpKind::kSend, Tensor<int64_t>({5}), 1, 4)))
          .ok());
  EXPECT_TRUE(WaitReally(recv).ok()) << recv->status().ToString();
  EXPECT_EQ(Values(value), std::vector<int64_t>{5});
}

}  // namespace
}  // namespace collectived
