// Losing a rank or a sidecar, on the three topologies. The victim rank (3) is a real process,
// sidecar_rank_worker, killed with SIGKILL; in TwoSidecarsTwoRanksInterleaved it is attached to
// sidecar B, so the survivors on sidecar A learn it from a peer sidecar and those on B from
// their own. The survivors must fail promptly (< 2 s) with PEER_LOST naming the lost rank.
// Test names: "SidecarPeerLoss/<Topology>.<Test>".
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "tests/sidecar/cluster_test.h"

namespace collectived::sidecar_test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

constexpr auto kPrompt = std::chrono::seconds(2);

template <typename T>
class SidecarPeerLoss : public ClusterTest<T> {
 protected:
  static constexpr int kVictim = 3;

  // Starts the victim (global rank 3) as a worker process in `mode` and creates group `name`
  // of all ranks with it; ranks 0-2 are this process's clients.
  std::unique_ptr<ChildProcess> StartVictim(const std::string& name, const std::string& mode,
                                            size_t count) {
    Cluster& cluster = this->cluster();
    dir_ = MakeTempDir("cstest-worker");
    auto worker = ChildProcess::Spawn(
        {BinDir() + "/sidecar_rank_worker", "--address", cluster.sidecar_of(kVictim).unix_address(),
         "--store", cluster.store_address(), "--group", name, "--rank", std::to_string(kVictim),
         "--world-size", std::to_string(cluster.world_size()), "--mode", mode, "--count",
         std::to_string(count), "--timeout-ms", "30000"},
        dir_ + "/worker.log", /*capture_stdout=*/true);
    EXPECT_TRUE(worker.ok()) << worker.status().ToString();
    if (!worker.ok()) return nullptr;
    // The survivors join while the worker does.
    std::vector<StatusOr<GroupInfo>> joined(kVictim, Status::Internal("not run"));
    std::vector<std::thread> threads;
    for (int rank = 0; rank < kVictim; ++rank) {
      threads.emplace_back([&, rank] {
        GroupOptions options;
        options.name = name;
        options.rank = rank;
        options.world_size = cluster.world_size();
        options.store_address = cluster.store_address();
        options.timeout = milliseconds(30000);
        joined[rank] = cluster.client(rank).CreateGroup(options);
      });
    }
    for (auto& thread : threads) thread.join();
    for (int rank = 0; rank < kVictim; ++rank) {
      EXPECT_TRUE(joined[rank].ok()) << "rank " << rank << ": " << joined[rank].status().ToString();
    }
    auto line = (*worker)->ReadLine(milliseconds(30000));
    EXPECT_TRUE(line.ok() && line->rfind("joined", 0) == 0)
        << (line.ok() ? *line : line.status().ToString()) << "\n"
        << (*worker)->Log();
    return std::move(*worker);
  }

  void TearDown() override {
    if (!dir_.empty()) {
      unlink((dir_ + "/worker.log").c_str());
      rmdir(dir_.c_str());
    }
    ClusterTest<T>::TearDown();
  }

  // The survivors' group of {0, 1, 2} works: the sidecars are fine after the loss.
  void ExpectSurvivorsCanGoOn() {
    for (int s = 0; s < this->topology().sidecars; ++s) {
      EXPECT_TRUE(this->cluster().sidecar(s).Healthy(milliseconds(2000)))
          << "sidecar " << this->cluster().sidecar(s).name();
    }
    TestGroup survivors = this->NewGroup("survivors", {0, 1, 2});
    CheckAllReduce(survivors, DType::kFloat32, ReduceOp::Sum(), TensorKind::kShm, 77);
    CheckSendRecv(survivors, DType::kInt64, TensorKind::kInline, 78);
    EXPECT_TRUE(this->cluster().DestroyGroup(survivors.name(), {0, 1, 2}).ok());
  }

  void ExpectLost(const Status& status, const std::string& group, const std::string& who) {
    EXPECT_EQ(status.kind(), ErrorKind::kPeerLost) << who << ": " << status.ToString();
    // "rank 3 (global rank 3) of group 'g' was lost: ...": not just "from rank 3" of a recv's
    // own description.
    EXPECT_THAT(status.message(), AllOf(HasSubstr("rank " + std::to_string(kVictim) +
                                                  " (global rank " + std::to_string(kVictim) + ")"),
                                        HasSubstr("lost"), HasSubstr("'" + group + "'")))
        << who;
  }

  std::string dir_;
};

TYPED_TEST_SUITE(SidecarPeerLoss, TopologyTypes, TopologyNames);

// Ranks 0-2 wait in an allreduce (and rank 0 in a recv from rank 3) that the victim never
// issues; it is killed.
TYPED_TEST(SidecarPeerLoss, RankKilledWhileOthersWaitInACollective) {
  Cluster& cluster = this->cluster();
  const std::string name = cluster.UniqueName("victim-idle");
  auto worker = this->StartVictim(name, "idle", 1);
  ASSERT_NE(worker, nullptr);
  std::vector<std::vector<float>> data(3, std::vector<float>(1024, 1.0f));
  std::vector<std::shared_ptr<ClientWork>> works;
  for (int rank = 0; rank < 3; ++rank) {
    works.push_back(cluster.client(rank).AllReduce(
        name, ClientTensor::Inline(data[rank].data(), DType::kFloat32, data[rank].size())));
  }
  std::this_thread::sleep_for(milliseconds(200));
  for (const auto& work : works) ASSERT_FALSE(work->IsCompleted()) << work->status().ToString();

  const auto killed = Clock::now();
  ASSERT_TRUE(worker->SignalAndWait(SIGKILL, milliseconds(5000)).ok());
  std::vector<Status> statuses = WaitAll(works, milliseconds(10000));
  const auto elapsed = Clock::now() - killed;
  for (int rank = 0; rank < 3; ++rank) {
    this->ExpectLost(statuses[rank], name, "rank " + std::to_string(rank));
  }
  EXPECT_LT(elapsed, kPrompt) << "the survivors learned of the loss after "
                              << std::chrono::duration_cast<milliseconds>(elapsed).count() << " ms";
  // Later ops fail at once, with the same reason.
  for (int rank = 0; rank < 3; ++rank) {
    Status later = cluster.client(rank).Barrier(name)->Wait(milliseconds(3000));
    this->ExpectLost(later, name, "later op of rank " + std::to_string(rank));
  }
  EXPECT_TRUE(cluster.DestroyGroup(name, {0, 1, 2}).ok());
  this->ExpectSurvivorsCanGoOn();
}

// The victim runs allreduce after allreduce (16 MiB of float32 in shared memory) with the
// others and is killed while they are running: the survivors' op in flight fails promptly.
TYPED_TEST(SidecarPeerLoss, RankKilledInTheMiddleOfACollective) {
  Cluster& cluster = this->cluster();
  const std::string name = cluster.UniqueName("victim-busy");
  constexpr size_t kCount = 4u << 20;
  auto worker = this->StartVictim(name, "loop", kCount);
  ASSERT_NE(worker, nullptr);

  struct Survivor {
    const RegisteredBuffer* buffer = nullptr;
    long completed = 0;
    Status failure;
    Clock::time_point failed_at;
    std::string wrong;
  };
  std::vector<Survivor> survivors(3);
  for (int rank = 0; rank < 3; ++rank) {
    auto buffer = cluster.client(rank).AllocateBuffer(kCount * sizeof(float));
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    survivors[rank].buffer = *buffer;
  }
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 3; ++rank) {
    threads.emplace_back([&, rank] {
      Survivor& me = survivors[rank];
      auto* data = reinterpret_cast<float*>(me.buffer->data());
      while (true) {
        for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<float>(rank + 1);
        Status status =
            cluster.client(rank)
                .AllReduce(name, ClientTensor::Shm(*me.buffer, 0, DType::kFloat32, kCount))
                ->Wait(milliseconds(20000));
        if (!status.ok()) {
          me.failure = status;
          me.failed_at = Clock::now();
          return;
        }
        ++me.completed;
        if (data[0] != 10.0f || data[kCount - 1] != 10.0f) me.wrong = "wrong sum";
      }
    });
  }
  // Let a few allreduces complete, then kill the victim while the next one runs.
  for (int i = 0; i < 3; ++i) {
    auto line = worker->ReadLine(milliseconds(20000));
    if (!line.ok()) {
      ADD_FAILURE() << "the victim stopped: " << line.status().ToString() << "\n" << worker->Log();
      break;
    }
  }
  std::this_thread::sleep_for(milliseconds(5));
  const auto killed = Clock::now();
  ASSERT_TRUE(worker->SignalAndWait(SIGKILL, milliseconds(5000)).ok());
  for (auto& thread : threads) thread.join();
  for (int rank = 0; rank < 3; ++rank) {
    const Survivor& me = survivors[rank];
    const std::string who = "rank " + std::to_string(rank);
    EXPECT_GE(me.completed, 3) << who;
    EXPECT_EQ(me.wrong, "") << who;
    this->ExpectLost(me.failure, name, who);
    EXPECT_LT(me.failed_at - killed, kPrompt)
        << who << " learned of the loss after "
        << std::chrono::duration_cast<milliseconds>(me.failed_at - killed).count() << " ms";
    EXPECT_TRUE(cluster.client(rank).FreeBuffer(me.buffer).ok());
  }
  EXPECT_TRUE(cluster.DestroyGroup(name, {0, 1, 2}).ok());
  this->ExpectSurvivorsCanGoOn();
}

// A point-to-point receive from the lost rank fails promptly too.
TYPED_TEST(SidecarPeerLoss, RankKilledWhileAPeerWaitsToReceiveFromIt) {
  Cluster& cluster = this->cluster();
  const std::string name = cluster.UniqueName("victim-p2p");
  auto worker = this->StartVictim(name, "idle", 1);
  ASSERT_NE(worker, nullptr);
  std::vector<float> data(3 * 16, 0.0f);
  std::vector<std::shared_ptr<ClientWork>> works;
  for (int rank = 0; rank < 3; ++rank) {
    works.push_back(cluster.client(rank).Recv(
        name, ClientTensor::Inline(&data[rank * 16], DType::kFloat32, 16), 3, 11));
  }
  std::this_thread::sleep_for(milliseconds(200));
  const auto killed = Clock::now();
  ASSERT_TRUE(worker->SignalAndWait(SIGKILL, milliseconds(5000)).ok());
  std::vector<Status> statuses = WaitAll(works, milliseconds(5000));
  const auto elapsed = Clock::now() - killed;
  for (int rank = 0; rank < 3; ++rank) {
    this->ExpectLost(statuses[rank], name, "recv of rank " + std::to_string(rank));
  }
  EXPECT_LT(elapsed, kPrompt);
  (void)cluster.DestroyGroup(name, {0, 1, 2});
}

// A sidecar killed with SIGKILL: ranks on the other sidecars fail promptly with PEER_LOST;
// the ranks attached to it lose their session (UNAVAILABLE). Each test runs on a cluster of its
// own, on the topologies with more than one sidecar: "<Topology>/SidecarLoss.<Test>".
class SidecarLoss : public ::testing::TestWithParam<Topology> {};

TEST_P(SidecarLoss, SidecarKilledWhileItsPeersWaitInACollective) {
  auto started = Cluster::Start(GetParam());
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  Cluster& cluster = **started;
  const std::string name = cluster.UniqueName("sidecar-dies");
  ASSERT_TRUE(cluster.CreateGroup(name).ok());
  const int doomed = GetParam().sidecars - 1;  // not A: A serves the store
  auto on_doomed = [&](int rank) { return GetParam().sidecar_of_rank[rank] == doomed; };
  auto ranks_of = [&](int sidecar) {
    std::string text;
    for (int rank = 0; rank < 4; ++rank) {
      if (GetParam().sidecar_of_rank[rank] != sidecar) continue;
      text += (text.empty() ? "" : ", ") + std::to_string(rank);
    }
    return "[" + text + "]";
  };
  const std::string doomed_ranks = ranks_of(doomed);
  std::vector<std::vector<float>> data(4, std::vector<float>(64, 1.0f));
  std::vector<std::shared_ptr<ClientWork>> works;
  for (int rank = 0; rank < 4; ++rank) {
    ClientTensor tensor = ClientTensor::Inline(data[rank].data(), DType::kFloat32, 64);
    // Ranks on the doomed sidecar wait in a receive (no sequence number: no desync with the
    // others' allreduce, which waits for them).
    works.push_back(on_doomed(rank) ? cluster.client(rank).Recv(name, tensor, 0, 99)
                                    : cluster.client(rank).AllReduce(name, tensor));
  }
  std::this_thread::sleep_for(milliseconds(200));
  for (const auto& work : works) ASSERT_FALSE(work->IsCompleted()) << work->status().ToString();
  const auto killed = Clock::now();
  ASSERT_TRUE(cluster.sidecar(doomed).process().SignalAndWait(SIGKILL, milliseconds(5000)).ok());
  std::vector<Status> statuses = WaitAll(works, milliseconds(10000));
  const auto elapsed = Clock::now() - killed;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string who = "rank " + std::to_string(rank);
    if (on_doomed(rank)) {
      EXPECT_EQ(statuses[rank].kind(), ErrorKind::kUnavailable)
          << who << ": " << statuses[rank].ToString();
      EXPECT_THAT(statuses[rank].message(), HasSubstr("lost")) << who;
      continue;
    }
    EXPECT_EQ(statuses[rank].kind(), ErrorKind::kPeerLost)
        << who << ": " << statuses[rank].ToString();
    EXPECT_THAT(statuses[rank].message(), HasSubstr("'" + name + "'")) << who;
    // The sidecar that died is named, with its ranks; the live ones are not.
    EXPECT_THAT(statuses[rank].message(), HasSubstr("(ranks " + doomed_ranks + ")")) << who;
    EXPECT_THAT(statuses[rank].message(), HasSubstr("did not answer")) << who;
    for (int other = 0; other < GetParam().sidecars; ++other) {
      if (other == doomed) continue;
      EXPECT_THAT(statuses[rank].message(), Not(HasSubstr("(ranks " + ranks_of(other) + ")")))
          << who;
    }
  }
  // The survivors give the dead sidecar a moment to answer a roll call before naming it.
  EXPECT_LT(elapsed, kPrompt + milliseconds(750));
  if (HasFailure()) std::cerr << cluster.Logs();
}

INSTANTIATE_TEST_SUITE_P(FourSidecarsOneRankEach, SidecarLoss,
                         ::testing::Values(FourSidecarsOneRankEach()),
                         [](const auto&) { return std::string("SigKill"); });
INSTANTIATE_TEST_SUITE_P(TwoSidecarsTwoRanksInterleaved, SidecarLoss,
                         ::testing::Values(TwoSidecarsTwoRanksInterleaved()),
                         [](const auto&) { return std::string("SigKill"); });

}  // namespace
}  // namespace collectived::sidecar_test
