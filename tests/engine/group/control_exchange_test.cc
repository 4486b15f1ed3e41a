// ControlExchange on its own: N nodes' state machines wired together by a test carrier that
// holds every posted message and delivers them in an order the test picks (per pair of nodes in
// posting order, as a connection does; across pairs in any order). The socket mesh and the
// in-process fabric carry exactly these machines, so what holds here holds for both.
#include "engine/group/transport/control_exchange.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/group/core/op_tags.h"
#include "engine/group/transport/dissemination.h"

namespace collectived {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint32_t kTag = OpTags::kControlBit | 7;

// The nodes' exchanges and the messages between them.
class Carrier {
 public:
  explicit Carrier(int nodes) {
    for (int node = 0; node < nodes; ++node)
      exchanges_.push_back(std::make_unique<ControlExchange>("g", node, nodes));
    results_.resize(nodes);
  }

  int nodes() const { return static_cast<int>(exchanges_.size()); }
  ControlExchange& at(int node) { return *exchanges_[node]; }
  // Each node's outcome, once its `done` ran.
  const std::optional<Status>& result(int node) const { return results_[node]; }

  ControlExchange::Done DoneOf(int node) {
    return [this, node](const Status& status) {
      EXPECT_FALSE(results_[node].has_value()) << "done ran twice on node " << node;
      results_[node] = status;
    };
  }
  void Take(int node, ControlExchange::Effects& effects) {
    for (auto& [to, message] : effects.posts) {
      EXPECT_NE(to, node);
      in_flight_[{node, to}].push_back(std::move(message));
      ++posted_;
    }
    effects.posts.clear();
    effects.RunCallbacks();
  }
  // Delivers every message in flight, choosing the next pair at random (`seed`), until none is
  // left.
  void DeliverAll(unsigned seed) {
    std::mt19937 random(seed);
    while (!in_flight_.empty()) {
      auto pair = in_flight_.begin();
      std::advance(pair, random() % in_flight_.size());
      const auto [from, to] = pair->first;
      ControlMessage message = std::move(pair->second.front());
      pair->second.pop_front();
      if (pair->second.empty()) in_flight_.erase(pair);
      ControlExchange::Effects effects;
      at(to).Deliver(from, std::move(message), effects);
      Take(to, effects);
    }
  }
  int posted() const { return posted_; }
  // Drops what is in flight from `from` (a connection that broke).
  void DropFrom(int from) {
    std::erase_if(in_flight_, [from](const auto& each) { return each.first.first == from; });
  }
  void ClearResults() { results_.assign(results_.size(), std::nullopt); }

 private:
  std::vector<std::unique_ptr<ControlExchange>> exchanges_;
  std::map<std::pair<int, int>, std::deque<ControlMessage>> in_flight_;
  std::vector<std::optional<Status>> results_;
  int posted_ = 0;
};

void ExpectSame(const std::optional<Status>& got, const Status& expected) {
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->kind(), expected.kind());
  EXPECT_EQ(got->message(), expected.message());
}

// Node i's part of a gather: (i + 1) * 3 bytes valued i, so every part has its own size.
std::vector<std::byte> PartOf(int node) {
  return std::vector<std::byte>(static_cast<size_t>(node + 1) * 3, std::byte(node));
}

std::vector<size_t> Sizes(int nodes) {
  std::vector<size_t> sizes;
  for (int node = 0; node < nodes; ++node) sizes.push_back(PartOf(node).size());
  return sizes;
}

std::vector<std::byte> Concatenated(int nodes) {
  std::vector<std::byte> all;
  for (int node = 0; node < nodes; ++node) {
    std::vector<std::byte> part = PartOf(node);
    all.insert(all.end(), part.begin(), part.end());
  }
  return all;
}

TEST(ControlExchangeTest, AllGathersEveryPartInNodeOrderWhateverTheDeliveryOrder) {
  for (int nodes : {1, 2, 3, 5, 8, 13}) {
    for (unsigned seed = 0; seed < 6; ++seed) {
      Carrier carrier(nodes);
      std::vector<std::vector<std::byte>> outs(nodes,
                                               std::vector<std::byte>(Concatenated(nodes).size()));
      for (int node = 0; node < nodes; ++node) {
        ControlExchange::Effects effects;
        carrier.at(node).StartAllGather(PartOf(node).data(), outs[node].data(), Sizes(nodes), kTag,
                                        carrier.DoneOf(node), effects);
        carrier.Take(node, effects);
      }
      carrier.DeliverAll(seed);
      for (int node = 0; node < nodes; ++node) {
        ASSERT_TRUE(carrier.result(node).has_value()) << nodes << " nodes, node " << node;
        EXPECT_TRUE(carrier.result(node)->ok()) << carrier.result(node)->ToString();
        EXPECT_EQ(outs[node], Concatenated(nodes)) << nodes << " nodes, node " << node;
        EXPECT_FALSE(carrier.at(node).busy());
      }
      // S·⌈log₂ S⌉ messages: one per node and round.
      EXPECT_EQ(carrier.posted(), nodes * DisseminationRounds(nodes));
    }
  }
}

TEST(ControlExchangeTest, MessagesThatArriveBeforeTheirExchangeStartsWaitForIt) {
  constexpr int kNodes = 4;
  Carrier carrier(kNodes);
  std::vector<std::vector<std::byte>> outs(kNodes,
                                           std::vector<std::byte>(Concatenated(kNodes).size()));
  // Node 3 starts last: every message for it is already there.
  for (int node = 0; node < 3; ++node) {
    ControlExchange::Effects effects;
    carrier.at(node).StartAllGather(PartOf(node).data(), outs[node].data(), Sizes(kNodes), kTag,
                                    carrier.DoneOf(node), effects);
    carrier.Take(node, effects);
  }
  carrier.DeliverAll(1);
  EXPECT_FALSE(carrier.result(3).has_value());
  EXPECT_FALSE(carrier.result(2).has_value());  // it waits for node 3's round-0 message
  ControlExchange::Effects effects;
  carrier.at(3).StartAllGather(PartOf(3).data(), outs[3].data(), Sizes(kNodes), kTag,
                               carrier.DoneOf(3), effects);
  carrier.Take(3, effects);
  carrier.DeliverAll(2);
  for (int node = 0; node < kNodes; ++node) {
    ASSERT_TRUE(carrier.result(node).has_value());
    EXPECT_TRUE(carrier.result(node)->ok());
    EXPECT_EQ(outs[node], Concatenated(kNodes));
  }
}

// Combines by concatenating node ids in order into the summary's bytes: a non-commutative
// combination shows whether the tree keeps node order.
struct Ordered {
  int count = 0;
  int ids[16] = {};
};

ControlExchange::Combine ConcatenateIds() {
  return [](std::byte* acc, const std::byte* later) {
    Ordered a, b;
    std::memcpy(&a, acc, sizeof(a));
    std::memcpy(&b, later, sizeof(b));
    for (int i = 0; i < b.count; ++i) a.ids[a.count++] = b.ids[i];
    std::memcpy(acc, &a, sizeof(a));
  };
}

TEST(ControlExchangeTest, AllReducesSummariesInNodeOrderUpAndDownTheTree) {
  for (int nodes : {1, 2, 3, 6, 9, 16}) {
    for (unsigned seed = 0; seed < 6; ++seed) {
      Carrier carrier(nodes);
      std::vector<Ordered> outs(nodes);
      for (int node = 0; node < nodes; ++node) {
        Ordered mine;
        mine.count = 1;
        mine.ids[0] = node;
        ControlExchange::Effects effects;
        carrier.at(node).StartAllReduce(&mine, &outs[node], sizeof(Ordered), ConcatenateIds(), kTag,
                                        carrier.DoneOf(node), effects);
        carrier.Take(node, effects);
      }
      carrier.DeliverAll(seed);
      for (int node = 0; node < nodes; ++node) {
        ASSERT_TRUE(carrier.result(node).has_value());
        EXPECT_TRUE(carrier.result(node)->ok());
        ASSERT_EQ(outs[node].count, nodes);
        for (int i = 0; i < nodes; ++i) EXPECT_EQ(outs[node].ids[i], i);
      }
      EXPECT_EQ(carrier.posted(), 2 * (nodes - 1));  // up and down each tree edge
    }
  }
}

TEST(ControlExchangeTest, AMismatchedMessageFailsWithItsTagRoundAndSize) {
  Carrier carrier(2);
  std::vector<std::byte> out0(Concatenated(2).size()), out1(out0.size() + 4);
  ControlExchange::Effects effects;
  carrier.at(0).StartAllGather(PartOf(0).data(), out0.data(), Sizes(2), kTag, carrier.DoneOf(0),
                               effects);
  carrier.Take(0, effects);
  // Node 1 issued another op: another tag and a larger part.
  std::vector<std::byte> larger(PartOf(1).size() + 4);
  carrier.at(1).StartAllGather(larger.data(), out1.data(), {PartOf(0).size(), larger.size()},
                               kTag + 1, carrier.DoneOf(1), effects);
  carrier.Take(1, effects);
  carrier.DeliverAll(0);
  for (int node : {0, 1}) {
    ASSERT_TRUE(carrier.result(node).has_value());
    EXPECT_EQ(carrier.result(node)->kind(), ErrorKind::kInternal);
    EXPECT_THAT(carrier.result(node)->message(),
                HasSubstr("control message mismatch in group 'g'"));
  }
  EXPECT_THAT(
      carrier.result(0)->message(),
      HasSubstr("expected tag " + std::to_string(kTag) + " round 0 (6 bytes) from " +
                "sidecar node 1, got tag " + std::to_string(kTag + 1) + " round 0 (10 bytes)"));
}

TEST(ControlExchangeTest, AwaitedNodesNameWhoseMessagesHaveNotArrived) {
  constexpr int kNodes = 4;
  Carrier carrier(kNodes);
  std::vector<std::byte> out(Concatenated(kNodes).size());
  ControlExchange::Effects effects;
  EXPECT_THAT(carrier.at(0).AwaitedNodes(), IsEmpty());
  carrier.at(0).StartAllGather(PartOf(0).data(), out.data(), Sizes(kNodes), kTag, carrier.DoneOf(0),
                               effects);
  carrier.Take(0, effects);
  EXPECT_THAT(carrier.at(0).AwaitedNodes(), ElementsAre(1, 2, 3));
  // Node 1 starts: round 0 brings node 1's part to node 0; nodes 2 and 3 are still awaited.
  std::vector<std::byte> out1(out.size());
  carrier.at(1).StartAllGather(PartOf(1).data(), out1.data(), Sizes(kNodes), kTag,
                               carrier.DoneOf(1), effects);
  carrier.Take(1, effects);
  carrier.DeliverAll(0);
  EXPECT_THAT(carrier.at(0).AwaitedNodes(), ElementsAre(2, 3));
  EXPECT_FALSE(carrier.result(0).has_value());
}

TEST(ControlExchangeTest, AReductionAwaitsTheSubtreesNotHeardFromThenTheRoot) {
  constexpr int kNodes = 8;
  Carrier carrier(kNodes);
  std::vector<Ordered> outs(kNodes);
  auto start = [&](int node) {
    Ordered mine;
    mine.count = 1;
    mine.ids[0] = node;
    ControlExchange::Effects effects;
    carrier.at(node).StartAllReduce(&mine, &outs[node], sizeof(Ordered), ConcatenateIds(), kTag,
                                    carrier.DoneOf(node), effects);
    carrier.Take(node, effects);
  };
  start(4);  // children 5 and 6 (heading [6, 8)); parent 0
  EXPECT_THAT(carrier.at(4).AwaitedNodes(), ElementsAre(5, 6, 7));
  start(5);
  carrier.DeliverAll(0);
  EXPECT_THAT(carrier.at(4).AwaitedNodes(), ElementsAre(6, 7));
  start(6);
  start(7);
  carrier.DeliverAll(0);
  // Its subtree's part went up: it waits for the root's total, from outside its subtree.
  EXPECT_THAT(carrier.at(4).AwaitedNodes(), ElementsAre(0, 1, 2, 3));
}

TEST(ControlExchangeTest, ABrokenPeerFailsTheExchangeThatNeedsItAndEveryLaterOne) {
  constexpr int kNodes = 4;
  Carrier carrier(kNodes);
  std::vector<std::byte> out(Concatenated(kNodes).size());
  ControlExchange::Effects effects;
  carrier.at(0).StartAllGather(PartOf(0).data(), out.data(), Sizes(kNodes), kTag, carrier.DoneOf(0),
                               effects);
  carrier.Take(0, effects);
  // Node 0 waits for node 1's round-0 message.
  const Status lost = Status::PeerLost("the connection to sidecar node 1 broke");
  carrier.at(0).Break(1, lost, effects);
  carrier.Take(0, effects);
  ASSERT_TRUE(carrier.result(0).has_value());
  ExpectSame(carrier.result(0), lost);
  carrier.ClearResults();
  carrier.at(0).StartAllGather(PartOf(0).data(), out.data(), Sizes(kNodes), kTag, carrier.DoneOf(0),
                               effects);
  carrier.Take(0, effects);
  ASSERT_TRUE(carrier.result(0).has_value());
  ExpectSame(carrier.result(0), lost);
}

TEST(ControlExchangeTest, ABreakOfANodeNoLongerNeededLeavesTheExchangeWaiting) {
  constexpr int kNodes = 4;
  Carrier carrier(kNodes);
  std::vector<std::byte> out(Concatenated(kNodes).size());
  ControlExchange::Effects effects;
  carrier.at(0).StartAllGather(PartOf(0).data(), out.data(), Sizes(kNodes), kTag, carrier.DoneOf(0),
                               effects);
  carrier.Take(0, effects);
  // Round 0 sends to node 3 (posted already) and hears from node 1; round 1 talks to node 2.
  // Node 3 is not needed any more.
  carrier.at(0).Break(3, Status::PeerLost("node 3 went"), effects);
  carrier.Take(0, effects);
  EXPECT_FALSE(carrier.result(0).has_value());
  EXPECT_TRUE(carrier.at(0).busy());
}

TEST(ControlExchangeTest, CloseFailsTheExchangeInProgressAndRefusesLaterOnes) {
  Carrier carrier(3);
  std::vector<std::byte> out(Concatenated(3).size());
  ControlExchange::Effects effects;
  carrier.at(1).StartAllGather(PartOf(1).data(), out.data(), Sizes(3), kTag, carrier.DoneOf(1),
                               effects);
  carrier.Take(1, effects);
  const Status closed = Status::PeerLost("the connections of group 'g' were closed");
  carrier.at(1).Close(closed, effects);
  carrier.Take(1, effects);
  ASSERT_TRUE(carrier.result(1).has_value());
  ExpectSame(carrier.result(1), closed);
  EXPECT_TRUE(carrier.at(1).closed());
  EXPECT_THAT(carrier.at(1).AwaitedNodes(), IsEmpty());
  carrier.ClearResults();
  Ordered summary;
  carrier.at(1).StartAllReduce(&summary, &summary, sizeof(summary), ConcatenateIds(), kTag,
                               carrier.DoneOf(1), effects);
  carrier.Take(1, effects);
  ASSERT_TRUE(carrier.result(1).has_value());
  ExpectSame(carrier.result(1), closed);
}

TEST(ControlExchangeTest, RefusesADataTagASecondExchangeAndWrongSizes) {
  Carrier carrier(2);
  std::vector<std::byte> out(Concatenated(2).size());
  ControlExchange::Effects effects;
  carrier.at(0).StartAllGather(PartOf(0).data(), out.data(), Sizes(2), 7, carrier.DoneOf(0),
                               effects);
  carrier.Take(0, effects);
  ASSERT_TRUE(carrier.result(0).has_value());
  EXPECT_EQ(carrier.result(0)->kind(), ErrorKind::kInternal);
  EXPECT_THAT(carrier.result(0)->message(), HasSubstr("data tag 7"));

  carrier.ClearResults();
  carrier.at(0).StartAllGather(PartOf(0).data(), out.data(), {6}, kTag, carrier.DoneOf(0), effects);
  carrier.Take(0, effects);
  ASSERT_TRUE(carrier.result(0).has_value());
  EXPECT_THAT(carrier.result(0)->message(), HasSubstr("1 sizes for 2 nodes"));

  carrier.ClearResults();
  carrier.at(0).StartAllGather(PartOf(0).data(), out.data(), Sizes(2), kTag, carrier.DoneOf(0),
                               effects);
  carrier.Take(0, effects);
  EXPECT_FALSE(carrier.result(0).has_value());
  bool second_done = false;
  Status second;
  carrier.at(0).StartAllGather(
      PartOf(0).data(), out.data(), Sizes(2), kTag,
      [&](const Status& status) {
        second_done = true;
        second = status;
      },
      effects);
  carrier.Take(0, effects);
  ASSERT_TRUE(second_done);
  EXPECT_THAT(second.message(), HasSubstr("while one is in progress"));
  EXPECT_FALSE(carrier.result(0).has_value());  // the first one still waits
}

}  // namespace
}  // namespace collectived
