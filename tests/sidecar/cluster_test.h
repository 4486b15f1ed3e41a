// A GoogleTest fixture for tests that run once per topology: TYPED_TEST_SUITE(Suite,
// TopologyTypes, TopologyNames) names them "<Suite>/<Topology>.<Test>", e.g.
// "SidecarGroups/TwoSidecarsTwoRanksInterleaved.TwoGroupsOverTheSameRanksInterleave". The
// cluster (sidecars and rank clients) is shared by the tests of a topology in one process.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>
#include <string>

#include "tests/sidecar/group_ops.h"
#include "tests/sidecar/sidecar_cluster.h"

namespace collectived::sidecar_test {

struct OneSidecarFourRanksTopology {
  static const Topology& Get() { return OneSidecarFourRanks(); }
};
struct FourSidecarsOneRankEachTopology {
  static const Topology& Get() { return FourSidecarsOneRankEach(); }
};
struct TwoSidecarsTwoRanksInterleavedTopology {
  static const Topology& Get() { return TwoSidecarsTwoRanksInterleaved(); }
};

using TopologyTypes = ::testing::Types<OneSidecarFourRanksTopology, FourSidecarsOneRankEachTopology,
                                       TwoSidecarsTwoRanksInterleavedTopology>;

struct TopologyNames {
  template <typename T>
  static std::string GetName(int) {
    return T::Get().name;
  }
};

template <typename T>
class ClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Status error;
    cluster_ = SharedCluster(T::Get(), &error);
    ASSERT_NE(cluster_, nullptr) << "cannot start " << T::Get().name << ": " << error.ToString();
  }

  void TearDown() override {
    if (HasFailure() && cluster_ != nullptr) std::cerr << cluster_->Logs();
  }

  const Topology& topology() const { return T::Get(); }
  Cluster& cluster() { return *cluster_; }

  // Creates a fresh group (a new name) of `members` (empty = all ranks) and returns it; fails
  // the test when creation fails.
  TestGroup NewGroup(const std::string& stem, std::vector<int> members = {}, int slot = 0,
                     milliseconds timeout = milliseconds(30000)) {
    const std::string name = cluster_->UniqueName(stem);
    auto infos = cluster_->CreateGroup(name, members, timeout);
    EXPECT_TRUE(infos.ok()) << infos.status().ToString();
    if (members.empty()) members = AllRanks(cluster_->world_size());
    std::sort(members.begin(), members.end());
    return TestGroup(cluster_, name, members, slot);
  }

  Cluster* cluster_ = nullptr;
};

}  // namespace collectived::sidecar_test
