// The sidecar's threads stay bounded whatever it serves (real collectived processes, clients over
// their Unix sockets): 1,024 world-1 groups over 8 sessions, and 1,000 sends and 1,000 receives
// between two sidecars that wait for their other side, add no thread but the executor's lent ones
// (at most --executor-blocking-threads); every op is still exact. Thread counts are read from
// /proc/<pid>/status, sampled throughout.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/sidecar/sidecar_cluster.h"

namespace collectived::sidecar_test {
namespace {

constexpr int kExecutorThreads = 2;
constexpr int kLentThreads = 4;
// gRPC's synchronous server polls with up to two threads of its own besides those serving calls
// (its defaults, min_pollers 1 and max_pollers 2); an idle sidecar may hold just one of them.
constexpr int kGrpcPollers = 2;

int ThreadsOf(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// The most threads any of `pids` had while it ran, sampled every millisecond.
class ThreadPeak {
 public:
  explicit ThreadPeak(std::vector<pid_t> pids) : pids_(std::move(pids)), peaks_(pids_.size(), 0) {
    sampler_ = std::thread([this] {
      while (!stop_.load()) {
        for (size_t i = 0; i < pids_.size(); ++i)
          peaks_[i] = std::max(peaks_[i], ThreadsOf(pids_[i]));
        std::this_thread::sleep_for(milliseconds(1));
      }
    });
  }
  ~ThreadPeak() { Stop(); }
  std::vector<int> Stop() {
    if (sampler_.joinable()) {
      stop_ = true;
      sampler_.join();
    }
    return peaks_;
  }

 private:
  std::vector<pid_t> pids_;
  std::vector<int> peaks_;
  std::atomic<bool> stop_{false};
  std::thread sampler_;
};

std::vector<std::string> BoundedExecutor() {
  return {"--executor-threads", std::to_string(kExecutorThreads), "--executor-blocking-threads",
          std::to_string(kLentThreads)};
}

TEST(ThreadBound, AThousandWorldOneGroupsOverEightSessionsAddNoThreads_OneSidecar) {
  const std::string dir = MakeTempDir("threads");
  // The eight sessions are this one process's: its share of groups must hold all of theirs.
  std::vector<std::string> flags = BoundedExecutor();
  flags.insert(flags.end(), {"--client-max-groups", "2048"});
  auto sidecar = SidecarProcess::Start(dir, "a", flags);
  ASSERT_TRUE(sidecar.ok()) << sidecar.status().ToString();
  constexpr int kSessions = 8;
  constexpr int kGroupsPerSession = 128;
  std::vector<std::unique_ptr<Client>> clients;
  for (int s = 0; s < kSessions; ++s) {
    auto client = Client::Connect((*sidecar)->unix_address(), "session-" + std::to_string(s));
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    clients.push_back(std::move(*client));
  }
  // Every session attached and served one op: what the sessions themselves cost.
  for (int s = 0; s < kSessions; ++s) {
    GroupOptions options;
    options.name = "warm-" + std::to_string(s);
    options.rank = 0;
    options.world_size = 1;
    ASSERT_TRUE(clients[s]->CreateGroup(options).ok());
    int64_t value = s;
    ASSERT_TRUE(clients[s]
                    ->AllReduce(options.name, ClientTensor::Inline(&value, DType::kInt64, 1),
                                ReduceOp::Sum())
                    ->Wait()
                    .ok());
  }
  const int baseline = ThreadsOf((*sidecar)->pid());
  ThreadPeak peak({(*sidecar)->pid()});
  std::vector<std::thread> sessions;
  std::atomic<int> exact{0};
  for (int s = 0; s < kSessions; ++s) {
    sessions.emplace_back([&, s] {
      for (int g = 0; g < kGroupsPerSession; ++g) {
        GroupOptions options;
        options.name = "g-" + std::to_string(s) + "-" + std::to_string(g);
        options.rank = 0;
        options.world_size = 1;
        StatusOr<GroupInfo> group = clients[s]->CreateGroup(options);
        EXPECT_TRUE(group.ok()) << group.status().ToString();
        if (!group.ok()) return;
        int64_t values[2] = {s, g};
        Status done = clients[s]
                          ->AllReduce(options.name, ClientTensor::Inline(values, DType::kInt64, 2),
                                      ReduceOp::Max())
                          ->Wait();
        EXPECT_TRUE(done.ok()) << done.ToString();
        if (done.ok() && values[0] == s && values[1] == g) ++exact;
      }
    });
  }
  for (auto& session : sessions) session.join();
  const int during = peak.Stop()[0];
  const int live = ThreadsOf((*sidecar)->pid());
  EXPECT_EQ(exact.load(), kSessions * kGroupsPerSession);
  std::cout << "sidecar threads: " << baseline << " with 8 idle sessions, at most " << during
            << " while 1024 groups were created and used, " << live << " with them all live\n";
  // Before, each group had a thread: 1,024 more. Now groups hold none; while the sessions create
  // them, gRPC serves each session's CreateGroup call on a thread of its own (8 calls at once)
  // while its pollers go on polling, and the executor may lend its threads.
  EXPECT_LE(during, baseline + kSessions + kGrpcPollers + kLentThreads) << (*sidecar)->Log();
  EXPECT_LE(live, baseline + kLentThreads);
}

TEST(ThreadBound,
     AThousandSendsAndReceivesWaitingForTheirPeerHoldNoThreads_TwoSidecarsOneRankEach) {
  const std::string dir = MakeTempDir("threads");
  std::vector<std::unique_ptr<SidecarProcess>> sidecars;
  for (const char* name : {"a", "b"}) {
    auto sidecar = SidecarProcess::Start(dir, name, BoundedExecutor());
    ASSERT_TRUE(sidecar.ok()) << sidecar.status().ToString();
    sidecars.push_back(std::move(*sidecar));
  }
  std::vector<std::unique_ptr<Client>> ranks;
  for (int r = 0; r < 2; ++r) {
    auto client = Client::Connect(sidecars[r]->unix_address(), "rank-" + std::to_string(r));
    ASSERT_TRUE(client.ok()) << client.status().ToString();
    ranks.push_back(std::move(*client));
  }
  std::vector<StatusOr<GroupInfo>> created(2, Status::Internal("not created"));
  std::vector<std::thread> joins;
  for (int r = 0; r < 2; ++r) {
    joins.emplace_back([&, r] {
      GroupOptions options;
      options.name = "p2p";
      options.rank = r;
      options.world_size = 2;
      options.store_address = sidecars[0]->tcp_address();
      created[r] = ranks[r]->CreateGroup(options);
    });
  }
  for (auto& join : joins) join.join();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(created[r].ok()) << created[r].status().ToString();
  // One message each way first: the group's connections and envelope streams exist.
  int64_t ping = 7, pong = 0;
  auto first_send = ranks[1]->Send("p2p", ClientTensor::Inline(&ping, DType::kInt64, 1), 0, -1);
  ASSERT_TRUE(
      ranks[0]->Recv("p2p", ClientTensor::Inline(&pong, DType::kInt64, 1), 1, -1)->Wait().ok());
  ASSERT_TRUE(first_send->Wait().ok());
  ASSERT_EQ(pong, 7);
  const std::vector<int> baseline = {ThreadsOf(sidecars[0]->pid()), ThreadsOf(sidecars[1]->pid())};
  ThreadPeak peak({sidecars[0]->pid(), sidecars[1]->pid()});

  constexpr int kMessages = 1000;
  // Rank 1 sends 1,000 messages nobody receives yet (each waits for its receive on sidecar a);
  // rank 0 posts 1,000 receives for messages nobody has sent yet (tags that come later).
  std::vector<int64_t> sent(kMessages), received(kMessages, -1), late(kMessages, -1);
  std::vector<std::shared_ptr<ClientWork>> sends, recvs, late_recvs;
  for (int i = 0; i < kMessages; ++i) {
    sent[i] = 1000 + i;
    sends.push_back(ranks[1]->Send("p2p", ClientTensor::Inline(&sent[i], DType::kInt64, 1), 0, i));
    late_recvs.push_back(
        ranks[0]->Recv("p2p", ClientTensor::Inline(&late[i], DType::kInt64, 1), 1, kMessages + i));
  }
  std::this_thread::sleep_for(milliseconds(300));
  for (const auto& work : sends) EXPECT_FALSE(work->IsCompleted());
  const std::vector<int> waiting = {ThreadsOf(sidecars[0]->pid()), ThreadsOf(sidecars[1]->pid())};
  for (int i = 0; i < kMessages; ++i) {
    recvs.push_back(
        ranks[0]->Recv("p2p", ClientTensor::Inline(&received[i], DType::kInt64, 1), 1, i));
  }
  std::vector<std::shared_ptr<ClientWork>> late_sends;
  for (int i = 0; i < kMessages; ++i) {
    late_sends.push_back(
        ranks[1]->Send("p2p", ClientTensor::Inline(&sent[i], DType::kInt64, 1), 0, kMessages + i));
  }
  for (const auto* works : {&sends, &recvs, &late_recvs, &late_sends}) {
    for (const Status& status : WaitAll(*works)) ASSERT_TRUE(status.ok()) << status.ToString();
  }
  const std::vector<int> peaks = peak.Stop();
  for (int i = 0; i < kMessages; ++i) {
    EXPECT_EQ(received[i], 1000 + i);
    EXPECT_EQ(late[i], 1000 + i);
  }
  for (int s = 0; s < 2; ++s) {
    std::cout << "sidecar " << s << " threads: " << baseline[s] << " before, " << waiting[s]
              << " with 1000 sends and 1000 receives waiting, at most " << peaks[s] << "\n";
    // Before, every send waiting for its receive held a thread: 1,000 more on sidecar b.
    EXPECT_LE(peaks[s], baseline[s] + kLentThreads) << sidecars[s]->Log();
  }
}

}  // namespace
}  // namespace collectived::sidecar_test
