// The C++ client's session machinery against a real sidecar (one collectived, one to three
// clients): opening a session, completions matched by client_op_id, inline write-back, shared
// memory worked on in place, client-side refusals, error kinds from the sidecar, bounded
// waits, session loss (sidecar killed or stopped) and groups. Each test starts its own sidecar.
// Test names: "OneSidecarClientSession.<Test>".
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <atomic>
#include <thread>

#include "collectived/v1/admin.grpc.pb.h"
#include "tests/sidecar/sidecar_cluster.h"

namespace collectived::sidecar_test {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

class OneSidecarClientSession : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("cstest-client");
    auto sidecar = SidecarProcess::Start(dir_, "A");
    ASSERT_TRUE(sidecar.ok()) << sidecar.status().ToString();
    sidecar_ = std::move(*sidecar);
  }

  void TearDown() override {
    if (HasFailure() && sidecar_) std::cerr << sidecar_->Log();
    clients_.clear();
    sidecar_.reset();
    unlink((dir_ + "/A.log").c_str());
    unlink((dir_ + "/A.sock").c_str());
    rmdir(dir_.c_str());
  }

  std::unique_ptr<Client> Connect(const std::string& name = "client test") {
    auto client = Client::Connect(sidecar_->unix_address(), name);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(*client) : nullptr;
  }

  // `n` clients, global ranks 0..n-1 of a group `name` of world size n; they stay owned here.
  std::vector<Client*> Group(const std::string& name, int n) {
    std::vector<Client*> clients;
    for (int r = 0; r < n; ++r) {
      clients_.push_back(Connect("rank " + std::to_string(r)));
      clients.push_back(clients_.back().get());
    }
    std::vector<Status> created(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        GroupOptions options;
        options.name = name;
        options.rank = r;
        options.world_size = n;
        created[r] = clients[r]->CreateGroup(options).status();
      });
    }
    for (auto& thread : threads) thread.join();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(created[r].ok()) << created[r].ToString();
    return clients;
  }

  int LiveSessions() {
    auto admin = v1::Admin::NewStub(sidecar_->channel());
    grpc::ClientContext context;
    v1::SidecarInfo info;
    EXPECT_TRUE(admin->GetInfo(&context, v1::GetInfoRequest(), &info).ok());
    return info.live_sessions();
  }

  std::string dir_;
  std::unique_ptr<SidecarProcess> sidecar_;
  std::vector<std::unique_ptr<Client>> clients_;
};

TEST_F(OneSidecarClientSession, ConnectOpensASession) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_FALSE(client->session_id().empty());
  EXPECT_FALSE(client->sidecar_id().empty());
  EXPECT_FALSE(client->sidecar_version().empty());
  EXPECT_EQ(client->address(), sidecar_->unix_address());
  EXPECT_TRUE(client->session_status().ok());
  EXPECT_TRUE(client->Ping(milliseconds(5000)).ok());
  auto other = Connect("another");
  ASSERT_NE(other, nullptr);
  EXPECT_NE(other->session_id(), client->session_id());
  EXPECT_EQ(other->sidecar_id(), client->sidecar_id());
  EXPECT_EQ(LiveSessions(), 2);
  other.reset();
  for (int i = 0; i < 200 && LiveSessions() != 1; ++i) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_EQ(LiveSessions(), 1);
}

// A stopped (SIGSTOP) sidecar accepts the connection but never answers.
TEST_F(OneSidecarClientSession, ConnectGivesUpWhenTheSidecarNeverAnswers) {
  ASSERT_TRUE(sidecar_->process().Pause().ok());
  ClientOptions options;
  options.address = sidecar_->unix_address();
  options.connect_timeout = milliseconds(300);
  const auto start = Clock::now();
  auto client = Client::Connect(options);
  const auto elapsed = Clock::now() - start;
  sidecar_->process().Resume();
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().kind(), ErrorKind::kUnavailable) << client.status().ToString();
  EXPECT_THAT(client.status().message(),
              AllOf(HasSubstr(sidecar_->unix_address()), HasSubstr("300 ms")));
  EXPECT_LT(elapsed, milliseconds(300) + std::chrono::seconds(2));
  // Once it runs again, connecting works.
  EXPECT_NE(Connect(), nullptr);
}

// ClientOptions.wait_for_sidecar: a client that starts before its sidecar connects soon after
// the sidecar is up (within gRPC's first reconnect backoffs, not at the connect timeout).
TEST_F(OneSidecarClientSession, ConnectWaitsForASidecarThatStartsLater) {
  const std::string dir = MakeTempDir("cstest-late");
  ClientOptions options;
  options.address = "unix://" + dir + "/late.sock";
  options.connect_timeout = milliseconds(30000);
  options.wait_for_sidecar = true;
  StatusOr<std::unique_ptr<Client>> client = Status::Internal("not run");
  Clock::time_point connected;
  std::thread connecting([&] {
    client = Client::Connect(options);
    connected = Clock::now();
  });
  std::this_thread::sleep_for(milliseconds(300));
  auto late = SidecarProcess::Start(dir, "late");
  const auto healthy = Clock::now();
  connecting.join();
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_LT(connected - healthy, std::chrono::seconds(5))
      << "connected " << std::chrono::duration_cast<milliseconds>(connected - healthy).count()
      << " ms after the sidecar was healthy";
  if (client.ok()) {
    EXPECT_TRUE((*client)->Ping(milliseconds(5000)).ok());
  }
  client = Status::Internal("closed");
  late->reset();
  unlink((dir + "/late.log").c_str());
  rmdir(dir.c_str());
}

TEST_F(OneSidecarClientSession, InlineResultsAreWrittenBackBeforeCompletion) {
  std::vector<Client*> ranks = Group("g", 2);
  float values[2][3] = {{1, 2, 3}, {10, 20, 30}};
  std::vector<std::shared_ptr<ClientWork>> works;
  for (int r = 0; r < 2; ++r) {
    works.push_back(ranks[r]->AllReduce("g", ClientTensor::Inline(values[r], DType::kFloat32, 3)));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(works[r]->Wait(milliseconds(10000)).ok()) << works[r]->status().ToString();
    EXPECT_THAT(values[r], ElementsAre(11, 22, 33));
    EXPECT_EQ(works[r]->sequence_number(), 1u);
    EXPECT_GT(works[r]->duration().count(), 0);
    EXPECT_EQ(works[r]->op(), "allreduce");
    EXPECT_EQ(works[r]->group(), "g");
    EXPECT_TRUE(works[r]->IsCompleted());
  }

  int32_t in[2] = {7, 8}, out[2][2] = {};
  works.clear();
  for (int r = 0; r < 2; ++r) {
    works.push_back(ranks[r]->AllGather("g", ClientTensor::Inline(&in[r], DType::kInt32, 1),
                                        {ClientTensor::Inline(&out[r][0], DType::kInt32, 1),
                                         ClientTensor::Inline(&out[r][1], DType::kInt32, 1)}));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(works[r]->Wait(milliseconds(10000)).ok()) << works[r]->status().ToString();
    EXPECT_THAT(out[r], ElementsAre(7, 8));
    EXPECT_EQ(works[r]->sequence_number(), 2u);
  }

  uint8_t sent[5] = {1, 2, 3, 4, 0x5a}, received[5] = {};
  auto recv = ranks[1]->Recv("g", ClientTensor::Inline(received, DType::kUInt8, 5), 0, 9);
  auto send = ranks[0]->Send("g", ClientTensor::Inline(sent, DType::kUInt8, 5), 1, 9);
  ASSERT_TRUE(recv->Wait(milliseconds(10000)).ok()) << recv->status().ToString();
  ASSERT_TRUE(send->Wait(milliseconds(10000)).ok()) << send->status().ToString();
  EXPECT_EQ(recv->source_rank(), 0);
  EXPECT_THAT(received, ElementsAre(1, 2, 3, 4, 0x5a));

  auto b0 = ranks[0]->Barrier("g");
  auto b1 = ranks[1]->Barrier("g");
  EXPECT_TRUE(b0->Wait(milliseconds(10000)).ok());
  EXPECT_TRUE(b1->Wait(milliseconds(10000)).ok());
}

TEST_F(OneSidecarClientSession, SharedMemoryBuffersAreWorkedOnInPlace) {
  std::vector<Client*> ranks = Group("g", 2);
  std::vector<const RegisteredBuffer*> buffers;
  for (int r = 0; r < 2; ++r) {
    auto buffer = ranks[r]->AllocateBuffer(1024);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    // The sidecar has its own descriptor: the client's is closed, and nothing has a name.
    EXPECT_EQ((*buffer)->shm->fd(), -1);
    EXPECT_EQ((*buffer)->size(), 1024u);
    buffers.push_back(*buffer);
    auto* floats = reinterpret_cast<float*>((*buffer)->data());
    floats[4] = 1.5f * static_cast<float>(r + 1);
    floats[5] = -2.0f;
    floats[6] = 99.0f;  // outside the tensor
  }
  std::vector<std::shared_ptr<ClientWork>> works;
  for (int r = 0; r < 2; ++r) {
    works.push_back(
        ranks[r]->AllReduce("g", ClientTensor::Shm(*buffers[r], 16, DType::kFloat32, 2)));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(works[r]->Wait(milliseconds(10000)).ok()) << works[r]->status().ToString();
    auto* floats = reinterpret_cast<float*>(buffers[r]->data());
    EXPECT_EQ(floats[4], 4.5f);
    EXPECT_EQ(floats[5], -4.0f);
    EXPECT_EQ(floats[6], 99.0f);
  }
  EXPECT_TRUE(ranks[0]->FreeBuffer(buffers[0]).ok());
  Status twice = ranks[0]->FreeBuffer(buffers[0]);
  EXPECT_TRUE(twice.IsInvalidArgument()) << twice.ToString();
}

TEST_F(OneSidecarClientSession, MemoryTheCallerAlreadySharesIsRegisteredFromItsDescriptor) {
  std::vector<Client*> ranks = Group("g", 2);
  // Each rank's memory is a memfd it maps itself (as a torch storage moved into shared memory);
  // the client maps it too and the sidecar works on it in place.
  std::vector<int> fds;
  std::vector<float*> own;
  std::vector<const RegisteredBuffer*> buffers;
  for (int r = 0; r < 2; ++r) {
    const int fd = memfd_create("caller-memory", MFD_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, 8192), 0);
    void* mapped = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ASSERT_NE(mapped, MAP_FAILED);
    fds.push_back(fd);
    own.push_back(static_cast<float*>(mapped));
    auto buffer = ranks[r]->RegisterFd(fd, 8192);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    buffers.push_back(*buffer);
    for (int i = 0; i < 4; ++i) own[r][1024 + i] = static_cast<float>(r + 1);
  }
  std::vector<std::shared_ptr<ClientWork>> works;
  for (int r = 0; r < 2; ++r) {
    works.push_back(
        ranks[r]->AllReduce("g", ClientTensor::Shm(*buffers[r], 4096, DType::kFloat32, 4)));
  }
  for (auto& work : works) ASSERT_TRUE(work->Wait(milliseconds(10000)).ok());
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 4; ++i) EXPECT_EQ(own[r][1024 + i], 3.0f) << r << " " << i;
    EXPECT_TRUE(ranks[r]->FreeBuffer(buffers[r]).ok());
  }
  // A file smaller than the size claimed is refused before anything reaches the sidecar, and
  // the caller's descriptor stays open.
  auto short_file = ranks[0]->RegisterFd(fds[0], 1 << 20);
  EXPECT_TRUE(short_file.status().IsInvalidArgument()) << short_file.status().ToString();
  EXPECT_THAT(short_file.status().message(), HasSubstr("is not a shared-memory file of at least"));
  EXPECT_TRUE(ranks[0]->RegisterFd(-1, 64).status().IsInvalidArgument());
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(fcntl(fds[r], F_GETFD), FD_CLOEXEC);
    munmap(own[r], 8192);
    close(fds[r]);
  }
}

TEST_F(OneSidecarClientSession, TensorsOnForeignOrFreedBuffersAreRefused) {
  std::vector<Client*> ranks = Group("g", 2);
  auto buffer = ranks[0]->AllocateBuffer(64);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  ClientTensor stale = ClientTensor::Shm(**buffer, 0, DType::kFloat32, 4);
  ASSERT_TRUE(ranks[0]->FreeBuffer(*buffer).ok());
  // `stale` points at freed memory: the client must not even read it.
  Status freed = ranks[0]->AllReduce("g", stale)->Wait(milliseconds(3000));
  EXPECT_TRUE(freed.IsInvalidArgument()) << freed.ToString();
  EXPECT_THAT(freed.message(), HasSubstr("tensor 0 refers to a shared-memory buffer that this "
                                         "client did not allocate or has freed"));

  auto foreign = ranks[1]->AllocateBuffer(64);
  ASSERT_TRUE(foreign.ok()) << foreign.status().ToString();
  float x[4] = {};
  Status other = ranks[0]
                     ->AllGatherIntoTensor("g", ClientTensor::Inline(x, DType::kFloat32, 1),
                                           ClientTensor::Shm(**foreign, 0, DType::kFloat32, 2))
                     ->Wait(milliseconds(3000));
  EXPECT_TRUE(other.IsInvalidArgument()) << other.ToString();
  EXPECT_THAT(other.message(), HasSubstr("output tensor 0 refers to a shared-memory buffer"));
}

TEST_F(OneSidecarClientSession, ClientSideValidationFailsTheWorkAtOnce) {
  std::vector<Client*> ranks = Group("g", 2);
  auto work = ranks[0]->AllReduce("g", ClientTensor::Inline(nullptr, DType::kFloat32, 4));
  EXPECT_TRUE(work->IsCompleted());
  EXPECT_TRUE(work->status().IsInvalidArgument());
  EXPECT_THAT(work->Wait().message(), HasSubstr("allreduce on group 'g': tensor 0 has no memory"));
  // The session and the group are unaffected: the op took no sequence number.
  float x[2] = {1, 2};
  auto a = ranks[0]->AllReduce("g", ClientTensor::Inline(&x[0], DType::kFloat32, 1));
  auto b = ranks[1]->AllReduce("g", ClientTensor::Inline(&x[1], DType::kFloat32, 1));
  ASSERT_TRUE(a->Wait(milliseconds(10000)).ok()) << a->status().ToString();
  ASSERT_TRUE(b->Wait(milliseconds(10000)).ok()) << b->status().ToString();
  EXPECT_EQ(x[0], 3);
  EXPECT_EQ(a->sequence_number(), 1u);
}

TEST_F(OneSidecarClientSession, SidecarErrorsKeepTheirKind) {
  std::vector<Client*> ranks = Group("g", 2);
  float x = 5;
  auto barrier = ranks[0]->Barrier("g");
  auto allreduce = ranks[1]->AllReduce("g", ClientTensor::Inline(&x, DType::kFloat32, 1));
  for (const auto& work : {barrier, allreduce}) {
    Status status = work->Wait(milliseconds(10000));
    EXPECT_EQ(status.kind(), ErrorKind::kDesync) << status.ToString();
    EXPECT_THAT(status.message(), AllOf(HasSubstr("ranks [0] issued barrier"),
                                        HasSubstr("ranks [1] issued allreduce(float32")));
  }
  EXPECT_EQ(x, 5);
  Status unknown = ranks[0]->Barrier("nope")->Wait(milliseconds(3000));
  EXPECT_THAT(unknown.message(), HasSubstr("unknown group 'nope'"));
}

TEST_F(OneSidecarClientSession, WaitWithATimeoutLeavesTheOpRunning) {
  std::vector<Client*> ranks = Group("g", 2);
  auto work = ranks[0]->Barrier("g");
  const auto start = Clock::now();
  Status status = work->Wait(milliseconds(100));
  EXPECT_GE(Clock::now() - start, milliseconds(90));
  EXPECT_TRUE(status.IsTimeout());
  EXPECT_THAT(status.message(),
              AllOf(StartsWith("Timeout: barrier (client op "),
                    HasSubstr("on group 'g' Timed out: it did not complete within 100 ms")));
  EXPECT_FALSE(work->IsCompleted());
  EXPECT_TRUE(work->status().ok());
  // The op was left running: once the other rank arrives, it completes.
  auto other = ranks[1]->Barrier("g");
  EXPECT_TRUE(work->Wait(milliseconds(10000)).ok()) << work->status().ToString();
  EXPECT_TRUE(other->Wait(milliseconds(10000)).ok()) << other->status().ToString();
  EXPECT_EQ(work->sequence_number(), 1u);
}

// Small collectives take the submission ring, big inline ones the stream; issued in a row
// without waiting, the group's order holds across the two paths.
TEST_F(OneSidecarClientSession, CollectivesTakeTheRingAndKeepTheirOrderAcrossPaths) {
  std::vector<Client*> ranks = Group("g", 2);
  constexpr size_t kBig = (200u << 10) / sizeof(float);  // over kRingInlineLimit
  std::vector<std::vector<float>> tensors[2];
  std::vector<std::shared_ptr<ClientWork>> works[2];
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 9; ++i) {
      tensors[r].emplace_back(i % 3 == 2 ? kBig : 4, static_cast<float>(10 * i + r));
    }
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      for (auto& tensor : tensors[r]) {
        works[r].push_back(ranks[r]->AllReduce(
            "g", ClientTensor::Inline(tensor.data(), DType::kFloat32, tensor.size())));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int r = 0; r < 2; ++r) {
    for (size_t i = 0; i < works[r].size(); ++i) {
      ASSERT_TRUE(works[r][i]->Wait(milliseconds(20000)).ok()) << works[r][i]->status().ToString();
      EXPECT_EQ(works[r][i]->via_ring(), i % 3 != 2) << i;
      EXPECT_EQ(works[r][i]->sequence_number(), i + 1);
      EXPECT_EQ(tensors[r][i].front(), 20.0f * i + 1) << i;
      EXPECT_EQ(tensors[r][i].back(), 20.0f * i + 1) << i;
    }
  }
  // Without the ring everything takes the stream.
  ClientOptions options;
  options.address = sidecar_->unix_address();
  options.use_ring = false;
  auto plain = Client::Connect(options);
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  GroupOptions solo;
  solo.name = "solo";
  solo.rank = 0;
  solo.world_size = 1;
  ASSERT_TRUE((*plain)->CreateGroup(solo).ok());
  float one = 1;
  auto work = (*plain)->AllReduce("solo", ClientTensor::Inline(&one, DType::kFloat32, 1));
  ASSERT_TRUE(work->Wait(milliseconds(10000)).ok()) << work->status().ToString();
  EXPECT_FALSE(work->via_ring());
}

// Only inline results count against the ring's limit: a big tensor in shared memory (or on a
// GPU) has no bytes in the response, so its op takes the ring.
TEST_F(OneSidecarClientSession, BigTensorsInSharedMemoryTakeTheRing) {
  std::vector<Client*> ranks = Group("g", 2);
  constexpr size_t kCount = (kRingInlineLimit * 4) / sizeof(float);
  std::vector<std::shared_ptr<ClientWork>> works;
  std::vector<const RegisteredBuffer*> buffers;
  for (int r = 0; r < 2; ++r) {
    auto buffer = ranks[r]->AllocateBuffer(kCount * sizeof(float));
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    buffers.push_back(*buffer);
    std::fill_n(reinterpret_cast<float*>((*buffer)->data()), kCount, static_cast<float>(r + 1));
  }
  for (int r = 0; r < 2; ++r) {
    works.push_back(
        ranks[r]->AllReduce("g", ClientTensor::Shm(*buffers[r], 0, DType::kFloat32, kCount)));
  }
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(works[r]->Wait(milliseconds(20000)).ok()) << works[r]->status().ToString();
    EXPECT_TRUE(works[r]->via_ring()) << "rank " << r;
    const float* sum = reinterpret_cast<const float*>(buffers[r]->data());
    EXPECT_EQ(sum[0], 3.0f);
    EXPECT_EQ(sum[kCount - 1], 3.0f);
  }
}

TEST_F(OneSidecarClientSession, ALostSessionFailsPendingAndLaterOps) {
  std::vector<Client*> ranks = Group("g", 2);
  Client& client = *ranks[0];
  auto pending = client.Barrier("g");
  std::atomic<bool> called{false};
  pending->AddCallback([&](const Status& status) { called = !status.ok(); });
  std::this_thread::sleep_for(milliseconds(100));
  ASSERT_TRUE(sidecar_->process().SignalAndWait(SIGKILL, milliseconds(5000)).ok());
  Status lost = pending->Wait(milliseconds(5000));
  EXPECT_EQ(lost.kind(), ErrorKind::kUnavailable) << lost.ToString();
  EXPECT_THAT(lost.message(), HasSubstr("session to " + sidecar_->unix_address() + " lost"));
  // Callbacks run just after waiters are woken, on the reader thread.
  for (int i = 0; i < 1000 && !called; ++i) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_TRUE(called);
  EXPECT_EQ(client.session_status().kind(), ErrorKind::kUnavailable);

  // Later ops, pings and registrations fail at once with the same reason.
  auto later = client.Barrier("g");
  EXPECT_TRUE(later->IsCompleted());
  EXPECT_THAT(later->status().message(), HasSubstr("lost"));
  EXPECT_EQ(client.Ping(milliseconds(1000)).kind(), ErrorKind::kUnavailable);
  EXPECT_EQ(client.AllocateBuffer(64).status().kind(), ErrorKind::kUnavailable);
}

// SIGTERM: in-flight ops fail with ABORTED saying the sidecar is shutting down.
// SIGTERM drains: the in-flight barrier may still finish for --drain-timeout-ms; its second rank
// never arrives, so it then fails saying why.
TEST_F(OneSidecarClientSession, SigtermFailsInFlightOpsSayingTheSidecarIsShuttingDown) {
  sidecar_.reset();
  auto restarted = SidecarProcess::Start(dir_, "A", {"--drain-timeout-ms", "300"});
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  sidecar_ = std::move(*restarted);
  std::vector<Client*> ranks = Group("g", 2);
  auto pending = ranks[0]->Barrier("g");
  std::this_thread::sleep_for(milliseconds(100));
  ASSERT_FALSE(pending->IsCompleted());
  const auto start = Clock::now();
  sidecar_->BeginStop();
  Status status = pending->Wait(milliseconds(5000));
  EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("the sidecar is shutting down"));
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
  auto exited = sidecar_->process().Wait(milliseconds(10000));
  ASSERT_TRUE(exited.ok());
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0) << *exited;
}

// SIGTERM with a connected, idle client: the sidecar ends the session with its `closing` event
// (session.proto: "The sidecar is shutting down ...; the stream closes next"), so the client
// learns why at once, and the daemon does not wait out its shutdown grace period (2 s) for the
// open Attach stream.
TEST_F(OneSidecarClientSession, SigtermClosesIdleSessionsWithTheReasonAndStopsPromptly) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  const auto start = Clock::now();
  sidecar_->BeginStop();
  Status session;
  while (Clock::now() - start < std::chrono::seconds(5)) {
    session = client->session_status();
    if (!session.ok()) break;
    std::this_thread::sleep_for(milliseconds(5));
  }
  const auto ended = Clock::now() - start;
  EXPECT_EQ(session.kind(), ErrorKind::kAborted) << session.ToString();
  EXPECT_THAT(session.message(), HasSubstr("the sidecar is shutting down"));
  EXPECT_LT(ended, milliseconds(1000))
      << "the session ended " << std::chrono::duration_cast<milliseconds>(ended).count()
      << " ms after SIGTERM";
  ASSERT_TRUE(sidecar_->process().Wait(milliseconds(10000)).ok());
  EXPECT_LT(Clock::now() - start, milliseconds(1500))
      << "the sidecar took "
      << std::chrono::duration_cast<milliseconds>(Clock::now() - start).count() << " ms to stop";
}

TEST_F(OneSidecarClientSession, DestroyingTheClientAbortsPendingWorksAndLosesItsRank) {
  std::vector<Client*> ranks = Group("g", 2);
  auto pending = ranks[0]->Barrier("g");
  const auto start = Clock::now();
  clients_[0].reset();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4));
  ASSERT_TRUE(pending->IsCompleted());
  EXPECT_EQ(pending->status().kind(), ErrorKind::kAborted);
  EXPECT_THAT(pending->status().message(), HasSubstr("client closed its session"));
  // The other rank's next op fails with the lost rank named.
  Status lost = ranks[1]->Barrier("g")->Wait(milliseconds(3000));
  EXPECT_EQ(lost.kind(), ErrorKind::kPeerLost) << lost.ToString();
  EXPECT_THAT(lost.message(), HasSubstr("rank 0 (global rank 0) of group 'g' was lost"));
}

TEST_F(OneSidecarClientSession, OpsFromManyThreadsAllComplete) {
  constexpr int kThreads = 4;
  constexpr int kOps = 50;
  // Two ranks; each thread drives a group of its own through both clients.
  std::vector<Client*> ranks = Group("g0", 2);
  for (int t = 1; t < kThreads; ++t) {
    std::vector<Status> created(2);
    std::vector<std::thread> joiners;
    for (int r = 0; r < 2; ++r) {
      joiners.emplace_back([&, r] {
        GroupOptions options;
        options.name = "g" + std::to_string(t);
        options.rank = r;
        options.world_size = 2;
        created[r] = ranks[r]->CreateGroup(options).status();
      });
    }
    for (auto& j : joiners) j.join();
    ASSERT_TRUE(created[0].ok() && created[1].ok()) << created[0].ToString();
  }
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string group = "g" + std::to_string(t);
      for (int i = 0; i < kOps; ++i) {
        float x[2] = {static_cast<float>(t * 1000 + i), 1.0f};
        auto a = ranks[0]->AllReduce(group, ClientTensor::Inline(&x[0], DType::kFloat32, 1));
        auto b = ranks[1]->AllReduce(group, ClientTensor::Inline(&x[1], DType::kFloat32, 1));
        if (a->Wait(milliseconds(10000)).ok() && b->Wait(milliseconds(10000)).ok() &&
            x[0] == static_cast<float>(t * 1000 + i + 1) && x[1] == x[0] &&
            a->sequence_number() == static_cast<uint64_t>(i + 1)) {
          ++good;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(good, kThreads * kOps);
}

TEST_F(OneSidecarClientSession, GroupsAreCreatedAndDestroyed) {
  // Global ranks 1, 5 and 7 of a world of 8 form a subgroup, listed out of order.
  std::vector<int> globals = {1, 5, 7};
  std::vector<std::unique_ptr<Client>> clients;
  for (size_t i = 0; i < globals.size(); ++i) clients.push_back(Connect());
  std::vector<StatusOr<GroupInfo>> infos(globals.size(), Status::Internal("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < globals.size(); ++i) {
    threads.emplace_back([&, i] {
      GroupOptions options;
      options.name = "sub";
      options.rank = globals[i];
      options.world_size = 8;
      options.members = {7, 5, 1};
      infos[i] = clients[i]->CreateGroup(options);
    });
  }
  for (auto& thread : threads) thread.join();
  for (size_t i = 0; i < globals.size(); ++i) {
    ASSERT_TRUE(infos[i].ok()) << infos[i].status().ToString();
    EXPECT_EQ(infos[i]->name, "sub");
    EXPECT_EQ(infos[i]->group_rank, static_cast<int>(i));
    EXPECT_EQ(infos[i]->group_size, 3);
    EXPECT_THAT(infos[i]->members, ElementsAre(1, 5, 7));
    EXPECT_THAT(infos[i]->local_group_ranks, ElementsAre(0, 1, 2));
    EXPECT_EQ(infos[i]->num_sidecars, 1);
    EXPECT_EQ(infos[i]->sequence_number, 0u);
  }

  // A member that never comes: Timeout naming it.
  GroupOptions late;
  late.name = "late";
  late.rank = 0;
  late.world_size = 2;
  late.timeout = milliseconds(300);
  auto missing = clients[0]->CreateGroup(late);
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(missing.status().IsTimeout()) << missing.status().ToString();
  EXPECT_THAT(missing.status().message(), AllOf(HasSubstr("Timeout"), HasSubstr("'late'"),
                                                HasSubstr("[1]"), HasSubstr("never joined")));

  GroupOptions unnamed = late;
  unnamed.name = "";
  EXPECT_TRUE(clients[0]->CreateGroup(unnamed).status().IsInvalidArgument());

  for (auto& client : clients) EXPECT_TRUE(client->DestroyGroup("sub").ok());
  Status gone = clients[0]->DestroyGroup("sub");
  EXPECT_TRUE(gone.IsNotFound()) << gone.ToString();
}

}  // namespace
}  // namespace collectived::sidecar_test
