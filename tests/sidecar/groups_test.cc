// Groups on the three topologies (see tests/sidecar/sidecar_cluster.h): subgroups and their
// non-members, several groups used at once by the same ranks, 64 MiB tensors, sequence
// numbers, re-creating a destroyed group, aborting a group (collectivectl and the Admin API),
// and op timeouts. Test names: "SidecarGroups/<Topology>.<Test>".
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <thread>

#include "collectived/v1/admin.grpc.pb.h"
#include "rpc/grpc_status.h"
#include "tests/sidecar/cluster_test.h"

namespace collectived::sidecar_test {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

template <typename T>
class SidecarGroups : public ClusterTest<T> {
 protected:
  // What CreateGroup must report for `members` seen from global rank `rank`.
  void ExpectInfo(const GroupInfo& info, const std::string& name, std::vector<int> members,
                  int rank) {
    std::sort(members.begin(), members.end());
    const Topology& topology = this->topology();
    SCOPED_TRACE("group '" + name + "' seen from rank " + std::to_string(rank));
    EXPECT_EQ(info.name, name);
    EXPECT_THAT(info.members, ElementsAreArray(members));
    EXPECT_EQ(info.group_size, static_cast<int>(members.size()));
    const int group_rank =
        static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    EXPECT_EQ(info.group_rank, group_rank);
    std::vector<int> local;
    std::set<int> sidecars;
    for (size_t g = 0; g < members.size(); ++g) {
      const int sidecar = topology.sidecar_of_rank[members[g]];
      sidecars.insert(sidecar);
      if (sidecar == topology.sidecar_of_rank[rank]) local.push_back(static_cast<int>(g));
    }
    EXPECT_THAT(info.local_group_ranks, ElementsAreArray(local));
    EXPECT_EQ(info.num_sidecars, static_cast<int>(sidecars.size()));
    EXPECT_EQ(info.sequence_number, 0u);
  }

  // A rank outside `group` calls a collective on it: a clear error at once, never a hang.
  void ExpectNonMemberRefused(const TestGroup& group, int rank) {
    float x[2] = {1, 2};
    auto work = this->cluster().client(rank).AllReduce(group.name(),
                                                       ClientTensor::Inline(x, DType::kFloat32, 2));
    Status status = work->Wait(milliseconds(5000));
    SCOPED_TRACE("non-member rank " + std::to_string(rank) + " on group '" + group.name() + "'");
    ASSERT_FALSE(status.ok());
    ASSERT_FALSE(status.IsTimeout()) << "the non-member's op hangs";
    // A sidecar hosting members knows the group but not this session in it; another sidecar
    // does not know the group at all.
    bool hosts_group = false;
    for (int member : group.members()) {
      hosts_group = hosts_group || this->topology().sidecar_of_rank[member] ==
                                       this->topology().sidecar_of_rank[rank];
    }
    if (hosts_group) {
      EXPECT_EQ(status.kind(), ErrorKind::kInvalidArgument) << status.ToString();
      EXPECT_THAT(status.message(),
                  AllOf(HasSubstr("session " + this->cluster().client(rank).session_label() +
                                  " is not part of group '" + group.name() + "'"),
                        Not(HasSubstr(this->cluster().client(rank).session_id()))));
    } else {
      EXPECT_THAT(status.kind(), AnyOf(ErrorKind::kInvalidArgument, ErrorKind::kNotFound))
          << status.ToString();
      EXPECT_THAT(status.message(), HasSubstr("unknown group '" + group.name() + "'"));
    }
    EXPECT_EQ(x[0], 1);  // untouched
  }

  void CheckSubgroup(std::vector<int> members_as_given) {
    const std::string name = this->cluster().UniqueName("sub");
    auto infos = this->cluster().CreateGroup(name, members_as_given);
    ASSERT_TRUE(infos.ok()) << infos.status().ToString();
    std::vector<int> members = members_as_given;
    std::sort(members.begin(), members.end());
    for (size_t g = 0; g < members.size(); ++g) {
      ExpectInfo((*infos)[g], name, members, members[g]);
    }
    TestGroup group(&this->cluster(), name, members, /*slot=*/1);
    CheckEveryCollective(group, DType::kFloat32, TensorKind::kShm, 100);
    CheckEveryCollective(group, DType::kInt64, TensorKind::kMixed, 200);
    CheckAllReduce(group, DType::kBFloat16, ReduceOp::Max(), TensorKind::kInline, 300);

    // Non-members: joining fails at creation, and collectives on the group are refused.
    for (int rank = 0; rank < this->cluster().world_size(); ++rank) {
      if (std::find(members.begin(), members.end(), rank) != members.end()) continue;
      GroupOptions options;
      options.name = this->cluster().UniqueName("not-a-member");
      options.rank = rank;
      options.world_size = this->cluster().world_size();
      options.members = members_as_given;
      options.store_address = this->cluster().store_address();
      auto joined = this->cluster().client(rank).CreateGroup(options);
      ASSERT_FALSE(joined.ok());
      EXPECT_TRUE(joined.status().IsInvalidArgument()) << joined.status().ToString();
      std::string list;
      for (int m : members) list += (list.empty() ? "" : ", ") + std::to_string(m);
      EXPECT_THAT(joined.status().message(),
                  AllOf(HasSubstr("rank " + std::to_string(rank) + " is not part of group '" +
                                  options.name + "'"),
                        HasSubstr("[" + list + "]")));
      ExpectNonMemberRefused(group, rank);
    }
    // The members' group is unaffected by the refusals.
    CheckAllReduce(group, DType::kFloat32, ReduceOp::Sum(), TensorKind::kShm, 400);
    EXPECT_TRUE(this->cluster().DestroyGroup(name, members).ok());
  }
};

TYPED_TEST_SUITE(SidecarGroups, TopologyTypes, TopologyNames);

TYPED_TEST(SidecarGroups, SubgroupOfRanks1And3) {
  this->CheckSubgroup({3, 1});
}

TYPED_TEST(SidecarGroups, SubgroupOfRanks0And2And3) {
  this->CheckSubgroup({2, 0, 3});
}

TYPED_TEST(SidecarGroups, TwoGroupsOverTheSameRanksInterleave) {
  Cluster& cluster = this->cluster();
  TestGroup a = this->NewGroup("twin-a", {}, /*slot=*/1);
  TestGroup b = this->NewGroup("twin-b", {}, /*slot=*/2);
  const int n = a.size();
  // Interleaved by hand: even ranks issue on a then b, odd ranks on b then a; every op is
  // issued before any is waited for.
  constexpr int kRounds = 6;
  constexpr size_t kCount = 5;
  std::vector<std::vector<std::shared_ptr<ClientWork>>> works_a(kRounds), works_b(kRounds);
  std::vector<std::vector<ClientTensor>> tensors_a(kRounds), tensors_b(kRounds);
  std::vector<std::vector<std::vector<Value>>> inputs_a(kRounds), inputs_b(kRounds);
  std::vector<Arena> arenas_a = a.Arenas(), arenas_b = b.Arenas();
  for (int round = 0; round < kRounds; ++round) {
    for (int g = 0; g < n; ++g) {
      inputs_a[round].push_back(GenerateTensor(DType::kInt64, 1000 + round, g, kCount));
      inputs_b[round].push_back(GenerateTensor(DType::kInt64, 2000 + round, g, kCount));
      tensors_a[round].push_back(arenas_a[g].Make(DType::kInt64, inputs_a[round][g], true));
      tensors_b[round].push_back(arenas_b[g].Make(DType::kInt64, inputs_b[round][g], g % 2 == 0));
    }
  }
  for (int round = 0; round < kRounds; ++round) {
    for (int g = 0; g < n; ++g) {
      auto on_a = [&] {
        works_a[round].push_back(
            a.client(g).AllReduce(a.name(), tensors_a[round][g], ReduceOp::Sum()));
      };
      auto on_b = [&] {
        works_b[round].push_back(
            b.client(g).AllReduce(b.name(), tensors_b[round][g], ReduceOp::Bxor()));
      };
      if (g % 2 == 0) {
        on_a();
        on_b();
      } else {
        on_b();
        on_a();
      }
    }
  }
  for (int round = 0; round < kRounds; ++round) {
    const std::string where = "round " + std::to_string(round);
    if (ExpectAllOk(works_a[round], "group a, " + where)) {
      auto expected = ReduceReference(DType::kInt64, ReduceOp::Sum(), inputs_a[round]);
      for (int g = 0; g < n; ++g) ExpectValues(tensors_a[round][g], expected, "a, " + where);
      // Each group numbers its own ops.
      EXPECT_EQ(works_a[round][0]->sequence_number(), static_cast<uint64_t>(round + 1));
    }
    if (ExpectAllOk(works_b[round], "group b, " + where)) {
      auto expected = ReduceReference(DType::kInt64, ReduceOp::Bxor(), inputs_b[round]);
      for (int g = 0; g < n; ++g) ExpectValues(tensors_b[round][g], expected, "b, " + where);
      EXPECT_EQ(works_b[round][0]->sequence_number(), static_cast<uint64_t>(round + 1));
    }
  }

  // Then both groups at full speed from two threads, every collective on each.
  std::thread on_b([&] { CheckEveryCollective(b, DType::kFloat16, TensorKind::kMixed, 700); });
  CheckEveryCollective(a, DType::kFloat32, TensorKind::kShm, 600);
  on_b.join();
  // A third group over a subset, alongside.
  TestGroup sub = this->NewGroup("twin-sub", {0, 3}, /*slot=*/3);
  std::thread on_sub([&] { CheckEveryCollective(sub, DType::kInt64, TensorKind::kShm, 800); });
  CheckEveryCollective(a, DType::kComplex64, TensorKind::kInline, 900);
  on_sub.join();
  EXPECT_TRUE(cluster.DestroyGroup(a.name()).ok());
  EXPECT_TRUE(cluster.DestroyGroup(b.name()).ok());
  EXPECT_TRUE(cluster.DestroyGroup(sub.name(), {0, 3}).ok());
}

// 64 MiB float32 tensors in shared memory: allreduce (SUM and MAX), broadcast,
// allgather_into_tensor (16 MiB in, 64 MiB out) and reduce_scatter_tensor (64 MiB in).
TYPED_TEST(SidecarGroups, SixtyFourMiBTensorsInSharedMemory) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("big");
  const int n = group.size();
  constexpr size_t kBytes = 64u << 20;
  constexpr size_t kCount = kBytes / sizeof(float);
  std::vector<const RegisteredBuffer*> buffers;
  for (int g = 0; g < n; ++g) {
    auto buffer = group.client(g).AllocateBuffer(2 * kBytes);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    buffers.push_back(*buffer);
  }
  auto floats = [&](int g) { return reinterpret_cast<float*>(buffers[g]->data()); };
  // Exact in float32: every partial sum is an integer below 2^24.
  auto value = [](int g, size_t i) { return static_cast<float>((g + 1) * (i % 4093)); };
  auto expect_all = [&](int g, size_t first, size_t count, auto expected, const char* what) {
    const float* data = floats(g) + first;
    size_t wrong = 0, first_wrong = 0;
    for (size_t i = 0; i < count; ++i) {
      if (data[i] != expected(i)) {
        if (wrong++ == 0) first_wrong = i;
      }
    }
    EXPECT_EQ(wrong, 0u) << what << " on group rank " << g << ": first wrong element "
                         << first_wrong << " = " << data[first_wrong] << ", expected "
                         << expected(first_wrong);
  };
  auto run = [&](const std::string& what, auto submit) {
    const auto start = Clock::now();
    bool ok = ExpectAllOk(group.Issue(submit), what);
    std::cerr << "[          ] " << what << " of 64 MiB on " << this->topology().name << ": "
              << std::chrono::duration_cast<milliseconds>(Clock::now() - start).count() << " ms\n";
    return ok;
  };

  for (ReduceOp op : {ReduceOp::Sum(), ReduceOp::Max()}) {
    for (int g = 0; g < n; ++g) {
      for (size_t i = 0; i < kCount; ++i) floats(g)[i] = value(g, i);
    }
    if (!run("allreduce " + OpName(op), [&](int g) {
          return group.client(g).AllReduce(
              group.name(), ClientTensor::Shm(*buffers[g], 0, DType::kFloat32, kCount), op);
        })) {
      return;
    }
    for (int g = 0; g < n; ++g) {
      expect_all(
          g, 0, kCount,
          [&](size_t i) {
            return op.kind == ReduceOpKind::kSum ? static_cast<float>(10 * (i % 4093))
                                                 : value(n - 1, i);
          },
          "allreduce");
    }
  }

  const int root = n - 1;
  for (int g = 0; g < n; ++g) {
    for (size_t i = 0; i < kCount; ++i) floats(g)[i] = value(g, i);
  }
  if (!run("broadcast", [&](int g) {
        return group.client(g).Broadcast(
            group.name(), ClientTensor::Shm(*buffers[g], 0, DType::kFloat32, kCount), root);
      })) {
    return;
  }
  for (int g = 0; g < n; ++g) {
    expect_all(
        g, 0, kCount, [&](size_t i) { return value(root, i); }, "broadcast");
  }

  // allgather_into_tensor: 16 MiB in (after the 64 MiB output), 64 MiB out.
  const size_t quarter = kCount / n;
  for (int g = 0; g < n; ++g) {
    for (size_t i = 0; i < quarter; ++i) floats(g)[kCount + i] = value(g, i);
  }
  if (!run("allgather_into_tensor", [&](int g) {
        return group.client(g).AllGatherIntoTensor(
            group.name(), ClientTensor::Shm(*buffers[g], kBytes, DType::kFloat32, quarter),
            ClientTensor::Shm(*buffers[g], 0, DType::kFloat32, kCount));
      })) {
    return;
  }
  for (int g = 0; g < n; ++g) {
    expect_all(
        g, 0, kCount, [&](size_t i) { return value(static_cast<int>(i / quarter), i % quarter); },
        "allgather_into_tensor");
  }

  // reduce_scatter_tensor: 64 MiB in, 16 MiB out (after the input).
  for (int g = 0; g < n; ++g) {
    for (size_t i = 0; i < kCount; ++i) floats(g)[i] = value(g, i);
  }
  if (!run("reduce_scatter_tensor", [&](int g) {
        return group.client(g).ReduceScatterTensor(
            group.name(), ClientTensor::Shm(*buffers[g], 0, DType::kFloat32, kCount),
            ClientTensor::Shm(*buffers[g], kBytes, DType::kFloat32, quarter), ReduceOp::Sum());
      })) {
    return;
  }
  for (int g = 0; g < n; ++g) {
    expect_all(
        g, kCount, quarter,
        [&](size_t i) { return static_cast<float>(10 * ((g * quarter + i) % 4093)); },
        "reduce_scatter_tensor");
  }
  for (int g = 0; g < n; ++g) EXPECT_TRUE(group.client(g).FreeBuffer(buffers[g]).ok());
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

TYPED_TEST(SidecarGroups, SequenceNumbersAgreeAcrossRanks) {
  Cluster& cluster = this->cluster();
  const std::string name = cluster.UniqueName("seq");
  auto infos = cluster.CreateGroup(name);
  ASSERT_TRUE(infos.ok()) << infos.status().ToString();
  for (const GroupInfo& info : *infos) EXPECT_EQ(info.sequence_number, 0u);
  TestGroup group(&cluster, name, AllRanks(cluster.world_size()));
  const int n = group.size();
  std::vector<Arena> arenas = group.Arenas();
  std::vector<ClientTensor> tensors;
  for (int g = 0; g < n; ++g) {
    tensors.push_back(
        arenas[g].Make(DType::kFloat32, GenerateTensor(DType::kFloat32, 1, g, 8), true));
  }
  uint64_t expected = 0;
  auto expect_next = [&](const std::vector<std::shared_ptr<ClientWork>>& works,
                         const std::string& what) {
    ++expected;
    if (!ExpectAllOk(works, what)) return;
    for (int g = 0; g < n; ++g) {
      EXPECT_EQ(works[g]->sequence_number(), expected) << what << " on group rank " << g;
    }
  };
  for (int i = 0; i < 3; ++i) {
    expect_next(group.Issue([&](int g) { return group.client(g).AllReduce(name, tensors[g]); }),
                "allreduce");
    expect_next(group.Issue([&](int g) { return group.client(g).Broadcast(name, tensors[g], i); }),
                "broadcast");
    expect_next(group.Issue([&](int g) { return group.client(g).Barrier(name); }), "barrier");
    expect_next(group.Issue([&](int g) {
      return group.client(g).Reduce(name, tensors[g], n - 1, ReduceOp::Max());
    }),
                "reduce");
  }
  // Ops refused by validation take no sequence number.
  auto refused = WaitAll(
      group.Issue([&](int g) { return group.client(g).Broadcast(name, tensors[g], n + 3); }));
  for (const Status& status : refused) EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
  // Point to point ops have none (0), and do not advance the group's.
  float out = 0, one = 7;
  auto recv = group.client(1).Recv(name, ClientTensor::Inline(&out, DType::kFloat32, 1), 0, 3);
  auto send = group.client(0).Send(name, ClientTensor::Inline(&one, DType::kFloat32, 1), 1, 3);
  EXPECT_TRUE(send->Wait(milliseconds(10000)).ok()) << send->status().ToString();
  EXPECT_TRUE(recv->Wait(milliseconds(10000)).ok()) << recv->status().ToString();
  EXPECT_EQ(out, 7);
  EXPECT_EQ(send->sequence_number(), 0u);
  EXPECT_EQ(recv->sequence_number(), 0u);
  expect_next(group.Issue([&](int g) { return group.client(g).AllReduce(name, tensors[g]); }),
              "allreduce after the refused ops");
  // The sidecars report the same number (Admin.ListGroups).
  for (int s = 0; s < this->topology().sidecars; ++s) {
    auto admin = v1::Admin::NewStub(cluster.sidecar(s).channel());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListGroupsResponse response;
    ASSERT_TRUE(admin->ListGroups(&context, v1::ListGroupsRequest(), &response).ok());
    bool found = false;
    for (const v1::GroupSummary& summary : response.groups()) {
      if (summary.name() != name) continue;
      found = true;
      EXPECT_EQ(summary.sequence_number(), expected) << "sidecar " << cluster.sidecar(s).name();
    }
    EXPECT_TRUE(found) << "sidecar " << cluster.sidecar(s).name() << " does not list " << name;
  }
  EXPECT_TRUE(cluster.DestroyGroup(name).ok());
}

TYPED_TEST(SidecarGroups, DestroyedGroupCanBeCreatedAgainUnderTheSameName) {
  Cluster& cluster = this->cluster();
  const std::string name = cluster.UniqueName("again");
  TestGroup group(&cluster, name, AllRanks(cluster.world_size()));
  for (int incarnation = 0; incarnation < 3; ++incarnation) {
    SCOPED_TRACE("incarnation " + std::to_string(incarnation));
    auto infos = cluster.CreateGroup(name);
    ASSERT_TRUE(infos.ok()) << infos.status().ToString();
    for (const GroupInfo& info : *infos) EXPECT_EQ(info.sequence_number, 0u);
    CheckAllReduce(group, DType::kFloat32, ReduceOp::Sum(), TensorKind::kShm, 10 + incarnation);
    CheckBroadcast(group, DType::kInt64, TensorKind::kInline, 20 + incarnation);
    // Destroy on every rank; a second destroy names the group.
    ASSERT_TRUE(cluster.DestroyGroup(name).ok());
    Status again = cluster.client(0).DestroyGroup(name);
    EXPECT_TRUE(again.IsNotFound()) << again.ToString();
    EXPECT_THAT(again.message(), HasSubstr("'" + name + "'"));
  }
}

// DestroyGroup on one rank fails that rank's pending ops with ABORTED (groups.proto,
// DestroyGroup; client.h, Client::DestroyGroup).
TYPED_TEST(SidecarGroups, DestroyFailsTheRanksPendingOpsWithAborted) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("leave");
  auto pending = group.client(0).Barrier(group.name());
  std::this_thread::sleep_for(milliseconds(100));
  ASSERT_FALSE(pending->IsCompleted()) << pending->status().ToString();
  ASSERT_TRUE(group.client(0).DestroyGroup(group.name()).ok());
  Status status = pending->Wait(milliseconds(3000));
  EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("'" + group.name() + "'"));
  for (int rank = 1; rank < cluster.world_size(); ++rank) {
    (void)cluster.client(rank).DestroyGroup(group.name());
  }
}

// Aborting through collectivectl (on the sidecar of rank 3, which has nothing in flight) fails
// the in-flight ops of ranks 0-2 on every sidecar and rank 3's next op; the group can then be
// destroyed and created again.
TYPED_TEST(SidecarGroups, AbortThroughCollectivectlFailsInFlightOpsOnEveryRank) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("abort-ctl");
  const int n = group.size();
  std::vector<float> data(n * 4, 1.0f);
  std::vector<std::shared_ptr<ClientWork>> works;
  for (int g = 0; g + 1 < n; ++g) {
    works.push_back(group.client(g).AllReduce(
        group.name(), ClientTensor::Inline(&data[g * 4], DType::kFloat32, 4)));
  }
  std::this_thread::sleep_for(milliseconds(200));
  for (const auto& work : works) ASSERT_FALSE(work->IsCompleted()) << work->status().ToString();

  std::string output;
  const auto start = Clock::now();
  auto exit_code = RunCollectivectl(
      {"--address", cluster.sidecar_of(n - 1).unix_address(), "abort", "--admin-token-file",
       cluster.sidecar_of(n - 1).admin_token_file(), group.name(), "maintenance window"},
      &output);
  ASSERT_TRUE(exit_code.ok()) << exit_code.status().ToString();
  EXPECT_EQ(*exit_code, 0) << output;
  EXPECT_THAT(output, HasSubstr("aborted group " + group.name()));
  std::vector<Status> statuses = WaitAll(works, milliseconds(3000));
  for (int g = 0; g + 1 < n; ++g) {
    const Status& status = statuses[g];
    EXPECT_EQ(status.kind(), ErrorKind::kAborted)
        << "group rank " << g << ": " << status.ToString();
    EXPECT_THAT(status.message(), AllOf(HasSubstr("aborted by an operator: maintenance window"),
                                        HasSubstr("'" + group.name() + "'")))
        << "group rank " << g;
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  // Later ops fail too, on every rank (rank 3's sidecar learned it from the store or aborted
  // it itself).
  float x = 1;
  Status later = group.client(n - 1)
                     .AllReduce(group.name(), ClientTensor::Inline(&x, DType::kFloat32, 1))
                     ->Wait(milliseconds(5000));
  EXPECT_EQ(later.kind(), ErrorKind::kAborted) << later.ToString();
  EXPECT_THAT(later.message(), HasSubstr("aborted by an operator"));

  ASSERT_TRUE(cluster.DestroyGroup(group.name()).ok());
  ASSERT_TRUE(cluster.CreateGroup(group.name()).ok());
  CheckAllReduce(group, DType::kFloat32, ReduceOp::Sum(), TensorKind::kShm, 5);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

// Aborting through the Admin API while every rank has an op in flight (a receive nobody sends
// to, and on ranks 0-2 an allreduce rank 3 never issues).
TYPED_TEST(SidecarGroups, AbortThroughTheAdminApiFailsEveryRanksInFlightOps) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("abort-api");
  const int n = group.size();
  std::vector<float> data(n * 8, 1.0f);
  std::vector<std::shared_ptr<ClientWork>> works;
  std::vector<std::string> what;
  for (int g = 0; g < n; ++g) {
    works.push_back(group.client(g).Recv(
        group.name(), ClientTensor::Inline(&data[g * 8], DType::kFloat32, 4), (g + 1) % n, 42));
    what.push_back("recv on group rank " + std::to_string(g));
    if (g + 1 < n) {
      works.push_back(group.client(g).AllReduce(
          group.name(), ClientTensor::Inline(&data[g * 8 + 4], DType::kFloat32, 4)));
      what.push_back("allreduce on group rank " + std::to_string(g));
    }
  }
  std::this_thread::sleep_for(milliseconds(200));
  for (size_t i = 0; i < works.size(); ++i) {
    ASSERT_FALSE(works[i]->IsCompleted()) << what[i] << ": " << works[i]->status().ToString();
  }
  auto admin = v1::Admin::NewStub(cluster.sidecar(this->topology().sidecars - 1).channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::AbortGroupRequest request;
  request.set_group(group.name());
  request.set_reason("test abort");
  v1::AbortGroupResponse response;
  context.AddMetadata("authorization", std::string("Bearer ") + kTestAdminToken);
  const auto start = Clock::now();
  grpc::Status rpc = admin->AbortGroup(&context, request, &response);
  ASSERT_TRUE(rpc.ok()) << rpc.error_message();
  std::vector<Status> statuses = WaitAll(works, milliseconds(3000));
  for (size_t i = 0; i < works.size(); ++i) {
    const Status& status = statuses[i];
    EXPECT_EQ(status.kind(), ErrorKind::kAborted) << what[i] << ": " << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("aborted by an operator: test abort")) << what[i];
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  // An unknown group is NOT_FOUND (to an admin).
  grpc::ClientContext unknown_context;
  unknown_context.AddMetadata("authorization", std::string("Bearer ") + kTestAdminToken);
  request.set_group("no-such-group");
  grpc::Status unknown = admin->AbortGroup(&unknown_context, request, &response);
  EXPECT_EQ(FromGrpcStatus(unknown, &unknown_context).kind(), ErrorKind::kNotFound);
  // Without a credential the call is refused before the group is even looked up.
  grpc::ClientContext anonymous_context;
  grpc::Status anonymous = admin->AbortGroup(&anonymous_context, request, &response);
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(anonymous.error_message(),
              HasSubstr("AbortGroup needs an admin credential: the admin token as "
                        "'authorization: Bearer ...', an admin client certificate "
                        "(--admin-names), or the group's job token"));
  ASSERT_TRUE(cluster.DestroyGroup(group.name()).ok());
  ASSERT_TRUE(cluster.CreateGroup(group.name()).ok());
  CheckSendRecv(group, DType::kFloat32, TensorKind::kInline, 6);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

// The group's timeout: ranks 0-2 issue a broadcast that rank 3 never issues.
TYPED_TEST(SidecarGroups, OpWhosePeerNeverIssuesItTimesOutNamingGroupOpAndSequence) {
  Cluster& cluster = this->cluster();
  const milliseconds timeout(1500);
  TestGroup group = this->NewGroup("timeout", {}, 0, timeout);
  const int n = group.size();
  CheckAllReduce(group, DType::kFloat32, ReduceOp::Sum(), TensorKind::kShm, 1);  // seq 1
  std::vector<float> data(n * 4, 2.0f);
  std::vector<std::shared_ptr<ClientWork>> works;
  const auto start = Clock::now();
  for (int g = 0; g + 1 < n; ++g) {
    works.push_back(group.client(g).Broadcast(
        group.name(), ClientTensor::Inline(&data[g * 4], DType::kFloat32, 4), 0));
  }
  for (int g = 0; g + 1 < n; ++g) {
    Status status = works[g]->Wait(timeout + milliseconds(5000));
    const auto elapsed = Clock::now() - start;
    EXPECT_TRUE(status.IsTimeout()) << "group rank " << g << ": " << status.ToString();
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("Timeout"), HasSubstr("group '" + group.name() + "'"),
                      HasSubstr("broadcast"), HasSubstr("seq 2")))
        << "group rank " << g;
    EXPECT_GE(elapsed, timeout - milliseconds(100)) << "group rank " << g;
    EXPECT_LT(elapsed, timeout + milliseconds(3000)) << "group rank " << g;
  }
  (void)cluster.DestroyGroup(group.name());
}

// A per-op timeout overrides the group's (here 60 s); an unmatched recv times out too.
TYPED_TEST(SidecarGroups, PerOpTimeoutOverridesTheGroupTimeout) {
  Cluster& cluster = this->cluster();
  const milliseconds op_timeout(500);
  {
    TestGroup group = this->NewGroup("op-timeout", {}, 0, milliseconds(60000));
    const int n = group.size();
    std::vector<float> data(n * 4, 2.0f);
    std::vector<std::shared_ptr<ClientWork>> works;
    const auto start = Clock::now();
    for (int g = 0; g + 1 < n; ++g) {
      works.push_back(group.client(g).AllReduce(
          group.name(), ClientTensor::Inline(&data[g * 4], DType::kFloat32, 4), ReduceOp::Sum(),
          op_timeout));
    }
    for (int g = 0; g + 1 < n; ++g) {
      Status status = works[g]->Wait(milliseconds(10000));
      EXPECT_TRUE(status.IsTimeout()) << "group rank " << g << ": " << status.ToString();
      EXPECT_THAT(status.message(),
                  AllOf(HasSubstr("Timeout"), HasSubstr("group '" + group.name() + "'"),
                        HasSubstr("allreduce"), HasSubstr("seq 1")));
      EXPECT_LT(Clock::now() - start, op_timeout + milliseconds(3000)) << "group rank " << g;
    }
    (void)cluster.DestroyGroup(group.name());
  }
  {
    TestGroup group = this->NewGroup("recv-timeout", {}, 0, milliseconds(60000));
    float x = 0;
    const auto start = Clock::now();
    auto recv = group.client(0).Recv(group.name(), ClientTensor::Inline(&x, DType::kFloat32, 1),
                                     group.size() - 1, 5, op_timeout);
    Status status = recv->Wait(milliseconds(10000));
    EXPECT_TRUE(status.IsTimeout()) << status.ToString();
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("Timeout"), HasSubstr("recv"), HasSubstr(group.name())));
    EXPECT_GE(Clock::now() - start, op_timeout - milliseconds(100));
    EXPECT_LT(Clock::now() - start, op_timeout + milliseconds(3000));
    (void)cluster.DestroyGroup(group.name());
  }
}

}  // namespace
}  // namespace collectived::sidecar_test
