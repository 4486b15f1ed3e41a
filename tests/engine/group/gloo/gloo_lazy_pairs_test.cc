// Tests of Gloo pairs connected on first use (GlooPairs, through GlooConnector and GlooBackend):
// several nodes in one process, each with its own connector (its own Gloo TCP device) on
// 127.0.0.1, meeting in one MemoryStore. Each node's calls run on a thread of their own, as the
// sidecars' would.
#include <gloo/transport/tcp/address.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/transport/gloo/gloo_algorithm_peers.h"
#include "engine/group/transport/gloo/gloo_backend.h"
#include "engine/group/transport/gloo/gloo_connector.h"
#include "engine/group/transport/gloo/gloo_pairs.h"
#include "engine/store/memory_store.h"
#include "engine/vocabulary/reduce_op.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr milliseconds kTimeout{20000};

// `nodes` nodes of one group: connector, context and backend per node.
class Nodes {
 public:
  explicit Nodes(int nodes, milliseconds pair_timeout = kTimeout)
      : store_(std::make_shared<MemoryStore>()) {
    for (int node = 0; node < nodes; ++node) {
      connectors_.push_back(std::make_unique<GlooConnector>("127.0.0.1"));
      StatusOr<std::shared_ptr<GlooPairs>> context =
          connectors_.back()->Connect("g", store_, node, nodes, pair_timeout);
      EXPECT_TRUE(context.ok()) << context.status().ToString();
      contexts_.push_back(*context);
      backends_.push_back(std::make_unique<GlooBackend>(*context, node, nodes, nullptr));
    }
  }

  int size() const { return static_cast<int>(backends_.size()); }
  GlooBackend& backend(int node) { return *backends_[node]; }
  GlooPairs& context(int node) { return *contexts_[node]; }
  MemoryStore& store() { return *store_; }

  // Runs fn(node) on one thread per node and waits for all of them.
  void OnEveryNode(const std::function<void(int)>& fn) {
    std::vector<std::thread> threads;
    for (int node = 0; node < size(); ++node) threads.emplace_back(fn, node);
    for (std::thread& thread : threads) thread.join();
  }

  std::vector<int> ConnectedPeers() {
    std::vector<int> counts;
    for (int node = 0; node < size(); ++node) counts.push_back(backend(node).connected_peers());
    return counts;
  }

 private:
  std::shared_ptr<MemoryStore> store_;
  std::vector<std::unique_ptr<GlooConnector>> connectors_;
  std::vector<std::shared_ptr<GlooPairs>> contexts_;
  std::vector<std::unique_ptr<GlooBackend>> backends_;
};

constexpr ReduceOp Sum() {
  return ReduceOp::Sum();
}

// The size of the union of the given peer sets.
int UnionSize(std::initializer_list<std::vector<int>> sets) {
  std::set<int> all;
  for (const std::vector<int>& set : sets) all.insert(set.begin(), set.end());
  return static_cast<int>(all.size());
}

// Every node allreduces `count` floats (node + i) and checks the sum.
void AllReduceAndCheck(Nodes& nodes, uint32_t tag, size_t count = 1000) {
  const int n = nodes.size();
  nodes.OnEveryNode([&](int node) {
    std::vector<float> data(count);
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(node + i);
    Status status =
        nodes.backend(node).AllReduce(data.data(), count, DType::kFloat32, Sum(), tag, kTimeout);
    ASSERT_TRUE(status.ok()) << status.ToString();
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(data[i], static_cast<float>(n * (n - 1) / 2 + n * i)) << "node " << node;
    }
  });
}

class GlooLazyPairsTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooLazyPairsTest, ConnectsWhatEachAlgorithmUses) {
  const int n = GetParam();
  Nodes nodes(n);
  EXPECT_EQ(nodes.ConnectedPeers(), std::vector<int>(n, 0)) << "forming connects nothing";

  // Allreduce only: the ring.
  AllReduceAndCheck(nodes, 1);
  AllReduceAndCheck(nodes, 2);
  EXPECT_EQ(nodes.ConnectedPeers(), std::vector<int>(n, n == 2 ? 1 : 2));

  // Broadcast from a root other than 0: the tree's pairs are added.
  const int root = n - 2 > 0 ? 3 % n : 1;
  ASSERT_NE(root, 0);
  nodes.OnEveryNode([&](int node) {
    std::vector<uint8_t> data(777, 0);
    if (node == root) {
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 1);
    }
    Status status = nodes.backend(node).Broadcast(data.data(), data.size(), root, 3, kTimeout);
    ASSERT_TRUE(status.ok()) << status.ToString();
    for (size_t i = 0; i < data.size(); ++i) {
      ASSERT_EQ(data[i], static_cast<uint8_t>(i * 7 + 1)) << "node " << node;
    }
  });
  for (int node = 0; node < n; ++node) {
    EXPECT_EQ(nodes.backend(node).connected_peers(),
              UnionSize({GlooRingPeers(node, n), GlooBroadcastPeers(node, n, root)}))
        << "node " << node;
  }
  if (n == 8) {
    // Root 3: virtual ranks 0..7 are nodes 3..7, 0..2; the root's tree peers are 4, 5 and 7.
    EXPECT_EQ(GlooBroadcastPeers(3, 8, 3), (std::vector<int>{4, 5, 7}));
    EXPECT_EQ(nodes.backend(3).connected_peers(), 4);  // 2, 4 (ring), 5, 7 (tree)
  }
  AllReduceAndCheck(nodes, 4);

  // Alltoall: every pair.
  nodes.OnEveryNode([&](int node) {
    // Node i sends (i + 1) * (j + 1) int32s of value 100 * i + j to node j.
    std::vector<int64_t> send_bytes(n), recv_bytes(n);
    std::vector<int32_t> in;
    for (int peer = 0; peer < n; ++peer) {
      send_bytes[peer] = 4 * (node + 1) * (peer + 1);
      recv_bytes[peer] = 4 * (peer + 1) * (node + 1);
      in.insert(in.end(), (node + 1) * (peer + 1), 100 * node + peer);
    }
    std::vector<int32_t> out(static_cast<size_t>((node + 1) * n * (n + 1) / 2), -1);
    Status status =
        nodes.backend(node).AllToAllV(in.data(), send_bytes, out.data(), recv_bytes, 5, kTimeout);
    ASSERT_TRUE(status.ok()) << status.ToString();
    size_t at = 0;
    for (int peer = 0; peer < n; ++peer) {
      for (int k = 0; k < (peer + 1) * (node + 1); ++k) {
        ASSERT_EQ(out[at++], 100 * peer + node) << "node " << node << " from " << peer;
      }
    }
  });
  EXPECT_EQ(nodes.ConnectedPeers(), std::vector<int>(n, n - 1));
  AllReduceAndCheck(nodes, 6);
}

// Each algorithm first on a fresh context: the pairs it alone connects are enough.
TEST_P(GlooLazyPairsTest, EachAlgorithmAloneHasItsPeers) {
  const int n = GetParam();
  const int root = n - 1;
  {
    Nodes nodes(n);
    nodes.OnEveryNode([&](int node) {
      std::vector<int32_t> data(301, node + 1);
      Status status = nodes.backend(node).Reduce(data.data(), data.size(), DType::kInt32, Sum(),
                                                 root, 1, kTimeout);
      ASSERT_TRUE(status.ok()) << status.ToString();
      if (node == root) {
        for (int32_t value : data) ASSERT_EQ(value, n * (n + 1) / 2);
      }
    });
    for (int node = 0; node < n; ++node) {
      EXPECT_EQ(nodes.backend(node).connected_peers(),
                static_cast<int>(GlooReducePeers(node, n, root).size()));
    }
  }
  {
    Nodes nodes(n);
    nodes.OnEveryNode([&](int node) {
      std::vector<size_t> bytes_per_node;
      size_t total = 0;
      for (int peer = 0; peer < n; ++peer) {
        bytes_per_node.push_back(static_cast<size_t>(3 * peer + 1));
        total += bytes_per_node.back();
      }
      std::vector<uint8_t> in(bytes_per_node[node], static_cast<uint8_t>(node + 10));
      std::vector<uint8_t> out(total, 0);
      Status status =
          nodes.backend(node).AllGatherV(in.data(), out.data(), bytes_per_node, 1, kTimeout);
      ASSERT_TRUE(status.ok()) << status.ToString();
      size_t at = 0;
      for (int peer = 0; peer < n; ++peer) {
        for (size_t k = 0; k < bytes_per_node[peer]; ++k) {
          ASSERT_EQ(out[at++], static_cast<uint8_t>(peer + 10));
        }
      }
    });
    EXPECT_EQ(nodes.ConnectedPeers(), std::vector<int>(n, n == 2 ? 1 : 2));
  }
  {
    Nodes nodes(n);
    nodes.OnEveryNode([&](int node) {
      Status status = nodes.backend(node).Barrier(1, kTimeout);
      ASSERT_TRUE(status.ok()) << status.ToString();
    });
    for (int node = 0; node < n; ++node) {
      EXPECT_EQ(nodes.backend(node).connected_peers(),
                static_cast<int>(GlooBarrierPeers(node, n).size()));
    }
  }
}

// Two threads per node allreduce at once with different tags, both connecting on first use.
TEST_P(GlooLazyPairsTest, ConcurrentFirstUseFromTwoThreads) {
  const int n = GetParam();
  Nodes nodes(n);
  nodes.OnEveryNode([&](int node) {
    auto run = [&](uint32_t tag) {
      std::vector<double> data(5000, node * 10.0 + tag);
      Status status = nodes.backend(node).AllReduce(data.data(), data.size(), DType::kFloat64,
                                                    Sum(), tag, kTimeout);
      ASSERT_TRUE(status.ok()) << status.ToString();
      for (double value : data) ASSERT_EQ(value, 10.0 * n * (n - 1) / 2 + n * tag);
    };
    std::thread other(run, 2);
    run(1);
    other.join();
  });
  EXPECT_EQ(nodes.ConnectedPeers(), std::vector<int>(n, n == 2 ? 1 : 2));
}

INSTANTIATE_TEST_SUITE_P(Nodes, GlooLazyPairsTest, ::testing::Values(2, 5, 8),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "Nodes";
                         });

// A peer that never makes the call: its address never appears. The connection fails after the
// call's timeout with Unavailable naming the peer.
TEST(GlooLazyPairs, PeerThatNeverComesTimesOut) {
  Nodes nodes(2);
  float value = 1;
  const Clock::time_point start = Clock::now();
  Status status =
      nodes.backend(0).AllReduce(&value, 1, DType::kFloat32, Sum(), 1, milliseconds(300));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(status.kind(), ErrorKind::kUnavailable) << status.ToString();
  EXPECT_NE(status.message().find("group 'g'"), std::string::npos) << status.ToString();
  EXPECT_NE(status.message().find("sidecar 1"), std::string::npos) << status.ToString();
  EXPECT_EQ(nodes.backend(0).connected_peers(), 0);
  // The failed pair stays failed.
  EXPECT_FALSE(
      nodes.backend(0).AllReduce(&value, 1, DType::kFloat32, Sum(), 2, milliseconds(300)).ok());
}

// Abort while the first-use connection waits for the peer's address: the call fails at once,
// long before its timeout.
TEST(GlooLazyPairs, AbortWakesAConnectionWaitingForTheAddress) {
  Nodes nodes(2);
  Status status;
  const Clock::time_point start = Clock::now();
  std::thread call([&] {
    float value = 1;
    status = nodes.backend(0).AllReduce(&value, 1, DType::kFloat32, Sum(), 1, kTimeout);
  });
  std::this_thread::sleep_for(milliseconds(300));
  nodes.backend(0).Abort();
  call.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.ToString();
  EXPECT_NE(status.message().find("aborted"), std::string::npos) << status.ToString();
  // Later calls fail at once too.
  float value = 1;
  EXPECT_EQ(nodes.backend(0).AllReduce(&value, 1, DType::kFloat32, Sum(), 2, kTimeout).kind(),
            ErrorKind::kPeerLost);
}

// Publishes node 1's address of its pair with node 0 as 127.0.0.2:9, where nobody listens or
// dials: above node 0's 127.0.0.1, so node 0 is the pair's listening side and waits.
bool PublishAPeerThatNeverConnects(Nodes& nodes) {
  sockaddr_storage storage{};
  auto* address = reinterpret_cast<sockaddr_in*>(&storage);
  address->sin_family = AF_INET;
  address->sin_addr.s_addr = htonl(0x7f000002);
  address->sin_port = htons(9);
  const std::vector<char> bytes = gloo::transport::tcp::Address(storage).bytes();
  return nodes.store().Set("pair/1/0", std::string(bytes.begin(), bytes.end())).ok();
}

// Abort while Gloo's connect blocks: the peer's address is there (127.0.0.2, above this node's
// 127.0.0.1, so this node is the pair's listening side) but nobody ever connects.
TEST(GlooLazyPairs, AbortWakesABlockedGlooConnect) {
  Nodes nodes(2, /*pair_timeout=*/kTimeout);
  ASSERT_TRUE(PublishAPeerThatNeverConnects(nodes));
  Status status;
  const Clock::time_point start = Clock::now();
  std::thread call([&] { status = nodes.context(0).Connect({1}, kTimeout); });
  std::this_thread::sleep_for(milliseconds(300));
  nodes.backend(0).Abort();
  call.join();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << status.ToString();
  EXPECT_EQ(nodes.context(0).connected_peers(), 0);
}

// The same blocked connect without an abort ends at the pair timeout.
TEST(GlooLazyPairs, BlockedGlooConnectEndsAtThePairTimeout) {
  Nodes nodes(2, /*pair_timeout=*/milliseconds(500));
  ASSERT_TRUE(PublishAPeerThatNeverConnects(nodes));
  const Clock::time_point start = Clock::now();
  Status status = nodes.context(0).Connect({1}, kTimeout);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(status.kind(), ErrorKind::kUnavailable) << status.ToString();
  EXPECT_NE(status.message().find("sidecar 1"), std::string::npos) << status.ToString();
}

}  // namespace
}  // namespace collectived
