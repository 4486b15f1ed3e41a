// Tests of the peer sets of Gloo's algorithms (gloo_algorithm_peers.h): the values read from
// Gloo's sources, and the symmetry GlooPairs relies on (a pair connects only when both of its
// sides ask for it).
#include "engine/group/transport/gloo/gloo_algorithm_peers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace collectived {
namespace {

using Peers = std::vector<int>;

TEST(GlooAlgorithmPeers, Values) {
  EXPECT_EQ(GlooRingPeers(0, 1), Peers{});
  EXPECT_EQ(GlooRingPeers(0, 2), Peers{1});
  EXPECT_EQ(GlooRingPeers(0, 5), (Peers{1, 4}));
  EXPECT_EQ(GlooRingPeers(3, 5), (Peers{2, 4}));
  // Broadcast from 0 over 8: step i sends from every v < 2^i to v + 2^i, so the tree is 0-1;
  // 0-2, 1-3; 0-4, 1-5, 2-6, 3-7.
  EXPECT_EQ(GlooBroadcastPeers(0, 8, 0), (Peers{1, 2, 4}));
  EXPECT_EQ(GlooBroadcastPeers(1, 8, 0), (Peers{0, 3, 5}));
  EXPECT_EQ(GlooBroadcastPeers(6, 8, 0), Peers{2});
  EXPECT_EQ(GlooBroadcastPeers(7, 8, 0), Peers{3});
  // Relative to the root: from 3 over 5, virtual ranks 0..4 are nodes 3, 4, 0, 1, 2.
  EXPECT_EQ(GlooBroadcastPeers(3, 5, 3), (Peers{0, 2, 4}));  // virtual 1, 2, 4
  EXPECT_EQ(GlooBroadcastPeers(1, 5, 3), Peers{4});          // virtual 3: from 1
  EXPECT_EQ(GlooBroadcastPeers(2, 5, 3), Peers{3});          // virtual 4: from 0
  EXPECT_EQ(GlooReducePeers(2, 5, 2), (Peers{0, 1, 3, 4}));
  EXPECT_EQ(GlooReducePeers(0, 5, 2), (Peers{1, 2, 4}));
  EXPECT_EQ(GlooBarrierPeers(0, 8), (Peers{1, 2, 4, 6, 7}));
  EXPECT_EQ(GlooBarrierPeers(0, 2), Peers{1});
  EXPECT_EQ(GlooAllPeers(1, 4), (Peers{0, 2, 3}));
}

// q is among p's peers exactly when p is among q's; sorted, without p, within [0, size).
TEST(GlooAlgorithmPeers, SymmetricAndWellFormed) {
  for (int size = 1; size <= 70; ++size) {
    for (int root = 0; root < size; ++root) {
      const std::vector<std::pair<std::string, std::function<Peers(int)>>> sets = {
          {"ring", [&](int r) { return GlooRingPeers(r, size); }},
          {"broadcast", [&](int r) { return GlooBroadcastPeers(r, size, root); }},
          {"reduce", [&](int r) { return GlooReducePeers(r, size, root); }},
          {"barrier", [&](int r) { return GlooBarrierPeers(r, size); }},
          {"all", [&](int r) { return GlooAllPeers(r, size); }},
      };
      for (const auto& [name, peers_of] : sets) {
        for (int p = 0; p < size; ++p) {
          const Peers peers = peers_of(p);
          ASSERT_TRUE(std::is_sorted(peers.begin(), peers.end())) << name;
          ASSERT_EQ(std::adjacent_find(peers.begin(), peers.end()), peers.end()) << name;
          for (int q : peers) {
            ASSERT_TRUE(q >= 0 && q < size && q != p) << name << " " << p << " " << q;
            const Peers back = peers_of(q);
            ASSERT_TRUE(std::binary_search(back.begin(), back.end(), p))
                << name << ": " << p << " -> " << q << " but not back, size " << size << " root "
                << root;
          }
        }
      }
    }
  }
}

// The broadcast tree reaches every node from the root (a spanning tree: size - 1 edges).
TEST(GlooAlgorithmPeers, BroadcastTreeSpansTheGroup) {
  for (int size = 1; size <= 70; ++size) {
    for (int root = 0; root < size; ++root) {
      size_t degrees = 0;
      for (int r = 0; r < size; ++r) degrees += GlooBroadcastPeers(r, size, root).size();
      EXPECT_EQ(degrees, 2 * static_cast<size_t>(size - 1)) << size << " " << root;
    }
  }
}

}  // namespace
}  // namespace collectived
