// The Sidecar facade with one sidecar in process: sessions as the ranks of groups, a MemoryStore
// as the rendezvous store, heap tensors.
#include "engine/sidecar/sidecar.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/store/memory_store.h"
#include "tests/engine/sidecar/client_memory.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr milliseconds kJoinTimeout{std::chrono::seconds(30)};
constexpr milliseconds kOpTimeout{std::chrono::seconds(30)};

// A float32 tensor on the heap, as a front end builds one from inline bytes.
struct HeapTensor {
  std::shared_ptr<std::vector<float>> values;
  TensorView view;

  explicit HeapTensor(std::vector<float> v)
      : values(std::make_shared<std::vector<float>>(std::move(v))),
        view{DType::kFloat32, values->size(), reinterpret_cast<std::byte*>(values->data()),
             values,          Device{},       nullptr} {}
};

OpRequest AllReduce(const HeapTensor& tensor) {
  OpRequest request;
  request.kind = OpKind::kAllReduce;
  request.reduce_op = ReduceOp::Sum();
  request.inputs = {tensor.view};
  request.timeout = kOpTimeout;
  return request;
}

// Every session of these tests is attached and used through the same connection.
const std::string kConnection = "test-connection";
SessionRef Ref(const std::string& id) {
  return {id, kConnection};
}

OpSubmission Submission(const std::string& session, const std::string& group, OpRequest request,
                        uint64_t client_op_id = 0) {
  OpSubmission submission;
  submission.session = Ref(session);
  submission.group = group;
  submission.request = std::move(request);
  submission.client_op_id = client_op_id;
  return submission;
}

class SidecarTest : public ::testing::Test {
 protected:
  // `clock`: the sidecar's (null: the real one).
  explicit SidecarTest(Clock* clock = nullptr) {
    SidecarOptions options;
    options.groups.sidecar_id = "test-sidecar";
    options.groups.advertise_host = "127.0.0.1";
    if (clock != nullptr) {
      RuntimeOptions runtime;
      runtime.clock = clock;
      StatusOr<std::shared_ptr<Runtime>> started = Runtime::Create(runtime);
      EXPECT_TRUE(started.ok());
      options.groups.runtime = *started;
    }
    options.local_store = store_;
    options.resolve_store = [this](const std::string& address) -> StatusOr<std::shared_ptr<Store>> {
      ++resolved_;
      if (address == "elsewhere:1") return std::shared_ptr<Store>(remote_);
      return Status::Unavailable("no sidecar at " + address);
    };
    sidecar_ = std::make_unique<Sidecar>(std::move(options));
  }

  // Opens `n` sessions and joins them to `group` as ranks 0..n-1 (each on a thread of its own:
  // the rendezvous blocks until every rank has arrived).
  std::vector<std::string> JoinGroup(const std::string& group, int n) {
    std::vector<std::string> ids;
    for (int rank = 0; rank < n; ++rank) {
      ids.push_back(sidecar_->OpenSession("rank" + std::to_string(rank), 1000 + rank, kConnection)
                        .value()
                        ->id());
    }
    std::vector<Status> joined(n);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < n; ++rank) {
      threads.emplace_back([&, rank] {
        JoinRequest join;
        join.name = group;
        join.rank = rank;
        join.world_size = n;
        join.timeout = kJoinTimeout;
        StatusOr<Membership> membership = sidecar_->JoinGroup(Ref(ids[rank]), join, "");
        joined[rank] = membership.status();
        if (membership.ok()) {
          EXPECT_EQ(membership->group_rank, rank);
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int rank = 0; rank < n; ++rank) EXPECT_TRUE(joined[rank].ok()) << joined[rank].ToString();
    return ids;
  }

  std::shared_ptr<MemoryStore> store_ = std::make_shared<MemoryStore>();
  std::shared_ptr<MemoryStore> remote_ = std::make_shared<MemoryStore>();
  std::atomic<int> resolved_{0};
  std::unique_ptr<Sidecar> sidecar_;
};

TEST_F(SidecarTest, OpensFindsListsAndClosesSessions) {
  std::shared_ptr<Session> a = sidecar_->OpenSession("trainer", 42, kConnection).value();
  std::shared_ptr<Session> b = sidecar_->OpenSession("trainer", 43, kConnection).value();
  EXPECT_NE(a->id(), b->id());
  EXPECT_EQ(sidecar_->ListSessions().size(), 2u);
  StatusOr<std::shared_ptr<Session>> found = sidecar_->FindSession(Ref(a->id()));
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ((*found)->pid(), 42);
  sidecar_->CloseSession(a->id(), "test");
  sidecar_->CloseSession(a->id(), "twice is harmless");
  EXPECT_EQ(sidecar_->ListSessions().size(), 1u);
  StatusOr<std::shared_ptr<Session>> gone = sidecar_->FindSession(Ref(a->id()));
  EXPECT_TRUE(gone.status().IsNotFound());
  EXPECT_THAT(gone.status().message(),
              HasSubstr("unknown session: the session_id names no live session"));
  EXPECT_THAT(gone.status().message(), Not(HasSubstr(a->id())));
}

TEST_F(SidecarTest, SessionIdsAreRandomSecretsAndLabelsArePublic) {
  std::shared_ptr<Session> a = sidecar_->OpenSession("trainer", 42, kConnection).value();
  std::shared_ptr<Session> b = sidecar_->OpenSession("trainer", 43, kConnection).value();
  for (const auto& session : {a, b}) {
    EXPECT_EQ(session->id().size(), 32u);
    EXPECT_EQ(session->id().find_first_not_of("0123456789abcdef"), std::string::npos);
    EXPECT_THAT(session->label(), ::testing::MatchesRegex("s[0-9]+"));
    EXPECT_THAT(session->id(), Not(HasSubstr(session->label())));
    EXPECT_EQ(session->binding(), kConnection);
  }
  EXPECT_NE(a->label(), b->label());
  // Consecutive sessions share no structure: count equal hex digits at equal positions (1/16 of
  // 32 expected by chance; a counter or a shared salt would make most of them equal).
  int same = 0;
  for (size_t i = 0; i < 32; ++i) same += a->id()[i] == b->id()[i];
  EXPECT_LT(same, 16) << a->id() << " vs " << b->id();
}

TEST_F(SidecarTest, ASessionIsUsableOnlyFromTheConnectionThatAttachedIt) {
  std::vector<std::string> ids = JoinGroup("g", 1);
  const std::string victim = ids[0];
  const std::string label = (*sidecar_->FindSession(Ref(victim)))->label();
  HeapTensor t({2.0f});
  StatusOr<std::shared_ptr<const SubmittedOp>> op =
      sidecar_->Submit(Submission(victim, "g", AllReduce(t), 5), nullptr);
  ASSERT_TRUE(op.ok()) << op.status().ToString();

  const SessionRef thief{victim, "tcp ipv4:10.0.0.9:4444"};
  const std::string denied = "session " + label +
                             " was attached by another connection; a session is usable only "
                             "from the connection that attached it";
  auto expect_denied = [&](const Status& status, const char* call) {
    EXPECT_EQ(status.kind(), ErrorKind::kPermissionDenied) << call << ": " << status.ToString();
    EXPECT_EQ(status.message(), denied) << call;
  };
  expect_denied(sidecar_->FindSession(thief).status(), "FindSession");
  expect_denied(sidecar_->CheckSubmitter(thief, "g").status(), "CheckSubmitter");
  OpSubmission run = Submission(victim, "g", AllReduce(t));
  run.session = thief;
  expect_denied(sidecar_->Start(std::move(run)).status(), "Start");
  OpSubmission submit = Submission(victim, "g", AllReduce(t), 6);
  submit.session = thief;
  expect_denied(sidecar_->Submit(std::move(submit), nullptr).status(), "Submit");
  expect_denied(sidecar_->Wait(thief, 5, milliseconds(10)).status(), "Wait");
  JoinRequest join;
  join.name = "other";
  join.world_size = 1;
  expect_denied(sidecar_->JoinGroup(thief, join, "").status(), "JoinGroup");
  expect_denied(sidecar_->DestroyGroup(thief, "g"), "DestroyGroup");
  expect_denied(sidecar_->RegisterBuffer(thief, NewMemfd(16), 16).status(), "RegisterBuffer");
  expect_denied(sidecar_->UnregisterBuffer(thief, 1), "UnregisterBuffer");

  // The victim's session is untouched: its op is still there, its group still its own.
  StatusOr<OpWait> waited = sidecar_->Wait(Ref(victim), 5, kWaitForever);
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_TRUE(waited->status.ok()) << waited->status.ToString();
  EXPECT_EQ(*t.values, std::vector<float>({2.0f}));
  EXPECT_TRUE(sidecar_->DestroyGroup(Ref(victim), "g").ok());
}

TEST_F(SidecarTest, AllReduceOfTwoSessionsIsExact) {
  std::vector<std::string> ids = JoinGroup("g", 2);
  ASSERT_EQ(ids.size(), 2u);
  ASSERT_NE(sidecar_->FindGroup("g"), nullptr);
  HeapTensor t0({1.0f, 2.0f, 3.0f, 0.5f});
  HeapTensor t1({10.0f, 20.0f, 30.0f, 0.25f});
  StatusOr<std::shared_ptr<Work>> w0 = sidecar_->Start(Submission(ids[0], "g", AllReduce(t0)));
  StatusOr<std::shared_ptr<Work>> w1 = sidecar_->Start(Submission(ids[1], "g", AllReduce(t1)));
  ASSERT_TRUE(w0.ok()) << w0.status().ToString();
  ASSERT_TRUE(w1.ok()) << w1.status().ToString();
  ASSERT_TRUE((*w0)->Wait().ok()) << (*w0)->Wait().ToString();
  ASSERT_TRUE((*w1)->Wait().ok()) << (*w1)->Wait().ToString();
  const std::vector<float> expected = {11.0f, 22.0f, 33.0f, 0.75f};
  EXPECT_EQ(*t0.values, expected);
  EXPECT_EQ(*t1.values, expected);
  EXPECT_EQ((*w0)->info().sequence_number, 1u);
  EXPECT_EQ((*w0)->info().group, "g");
}

TEST_F(SidecarTest, SubmittedOpsAreAwaitedByClientOpIdAndReported) {
  std::vector<std::string> ids = JoinGroup("g", 2);
  HeapTensor t0({1.0f, -1.0f});
  HeapTensor t1({2.0f, -2.0f});
  std::atomic<int> reported{0};
  auto count = [&](const SubmittedOp& op) {
    EXPECT_TRUE(op.work->IsCompleted());
    ++reported;
  };
  auto state = std::make_shared<const std::string>("front end state");
  OpSubmission first = Submission(ids[0], "g", AllReduce(t0), 7);
  first.frontend_state = state;
  StatusOr<std::shared_ptr<const SubmittedOp>> op0 = sidecar_->Submit(std::move(first), count);
  ASSERT_TRUE(op0.ok()) << op0.status().ToString();
  EXPECT_EQ((*op0)->client_op_id, 7u);
  EXPECT_EQ((*op0)->frontend_state, state);
  EXPECT_EQ((*op0)->work->info().sequence_number, 1u);

  // Rank 0's op waits for rank 1: a short wait times out, and the op goes on.
  StatusOr<OpWait> early = sidecar_->Wait(Ref(ids[0]), 7, milliseconds(50));
  ASSERT_TRUE(early.ok()) << early.status().ToString();
  EXPECT_TRUE(early->status.IsTimeout()) << early->status.ToString();
  EXPECT_FALSE(early->op->work->IsCompleted());

  StatusOr<std::shared_ptr<const SubmittedOp>> op1 =
      sidecar_->Submit(Submission(ids[1], "g", AllReduce(t1), 7), count);
  ASSERT_TRUE(op1.ok()) << op1.status().ToString();
  for (const std::string& id : ids) {
    StatusOr<OpWait> waited = sidecar_->Wait(Ref(id), 7, kWaitForever);
    ASSERT_TRUE(waited.ok()) << waited.status().ToString();
    EXPECT_TRUE(waited->status.ok()) << waited->status.ToString();
    EXPECT_TRUE(waited->op->work->IsCompleted());
  }
  EXPECT_EQ(*t0.values, std::vector<float>({3.0f, -3.0f}));
  EXPECT_EQ(*t1.values, std::vector<float>({3.0f, -3.0f}));
  // Completion callbacks run right after the op's waiters are woken, on the completing thread:
  // a Wait that returned does not mean its callback has run yet.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (reported.load() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  EXPECT_EQ(reported.load(), 2);

  StatusOr<OpWait> unknown = sidecar_->Wait(Ref(ids[0]), 8, kWaitForever);
  EXPECT_TRUE(unknown.status().IsNotFound());
  EXPECT_THAT(unknown.status().message(),
              HasSubstr("session " + (*sidecar_->FindSession(Ref(ids[0])))->label() +
                        " has no op with client_op_id 8"));
}

TEST_F(SidecarTest, ClosingASessionFailsThePeersPendingOpNamingTheRank) {
  std::vector<std::string> ids = JoinGroup("g", 2);
  HeapTensor t0({1.0f});
  StatusOr<std::shared_ptr<const SubmittedOp>> op =
      sidecar_->Submit(Submission(ids[0], "g", AllReduce(t0), 1), nullptr);
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  sidecar_->CloseSession(ids[1], "the client disconnected");
  StatusOr<OpWait> waited = sidecar_->Wait(Ref(ids[0]), 1, milliseconds(10000));
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(waited->status.kind(), ErrorKind::kPeerLost) << waited->status.ToString();
  EXPECT_THAT(waited->status.message(),
              AllOf(HasSubstr("rank 1 (global rank 1) of group 'g' was lost"),
                    HasSubstr("its client session ended (the client disconnected)")));
  // Later ops of the surviving rank fail at once with the same reason.
  HeapTensor again({1.0f});
  StatusOr<std::shared_ptr<Work>> later =
      sidecar_->Start(Submission(ids[0], "g", AllReduce(again)));
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_EQ((*later)->Wait().kind(), ErrorKind::kPeerLost);
}

TEST_F(SidecarTest, DestroyingAGroupFailsThePeersOpNamingTheRank) {
  std::vector<std::string> ids = JoinGroup("g", 2);
  HeapTensor t0({1.0f});
  StatusOr<std::shared_ptr<const SubmittedOp>> op =
      sidecar_->Submit(Submission(ids[0], "g", AllReduce(t0), 1), nullptr);
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  ASSERT_TRUE(sidecar_->DestroyGroup(Ref(ids[1]), "g").ok());
  StatusOr<OpWait> waited = sidecar_->Wait(Ref(ids[0]), 1, milliseconds(10000));
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(waited->status.kind(), ErrorKind::kPeerLost) << waited->status.ToString();
  EXPECT_THAT(waited->status.message(),
              HasSubstr("rank 1 (global rank 1) left group 'g' (it destroyed the group)"));

  Status again = sidecar_->DestroyGroup(Ref(ids[1]), "g");
  EXPECT_TRUE(again.IsNotFound());
  EXPECT_THAT(again.message(), HasSubstr("this session is not part of group 'g'"));
  // The group lives on while rank 0 is still in it, and goes when the last rank leaves.
  EXPECT_NE(sidecar_->FindGroup("g"), nullptr);
  EXPECT_TRUE(sidecar_->DestroyGroup(Ref(ids[0]), "g").ok());
  EXPECT_EQ(sidecar_->FindGroup("g"), nullptr);
  EXPECT_TRUE(sidecar_->ListGroups().empty());
}

TEST_F(SidecarTest, UnknownSessionsAndGroupsAreNamed) {
  std::shared_ptr<Session> outsider = sidecar_->OpenSession("outsider", 1, kConnection).value();
  std::vector<std::string> ids = JoinGroup("g", 1);

  StatusOr<std::shared_ptr<Session>> no_session = sidecar_->CheckSubmitter(Ref("nobody"), "g");
  EXPECT_TRUE(no_session.status().IsNotFound());
  EXPECT_THAT(no_session.status().message(), HasSubstr("unknown session:"));
  EXPECT_THAT(no_session.status().message(), Not(HasSubstr("nobody")));

  HeapTensor t({1.0f});
  StatusOr<std::shared_ptr<Work>> no_group = sidecar_->Start(Submission(ids[0], "h", AllReduce(t)));
  EXPECT_TRUE(no_group.status().IsInvalidArgument());
  EXPECT_THAT(no_group.status().message(), HasSubstr("unknown group 'h' (create it first)"));

  StatusOr<std::shared_ptr<const SubmittedOp>> not_member =
      sidecar_->Submit(Submission(outsider->id(), "g", AllReduce(t), 1), nullptr);
  EXPECT_TRUE(not_member.status().IsInvalidArgument());
  EXPECT_THAT(not_member.status().message(),
              HasSubstr("session " + outsider->label() + " is not part of group 'g'"));

  JoinRequest join;
  join.name = "g";
  join.world_size = 1;
  StatusOr<Membership> twice = sidecar_->JoinGroup(Ref(ids[0]), join, "");
  EXPECT_TRUE(twice.status().IsInvalidArgument());
  EXPECT_THAT(twice.status().message(),
              HasSubstr("this session already belongs to group 'g'; destroy it first"));
  EXPECT_TRUE(sidecar_->JoinGroup(Ref("nobody"), join, "").status().IsNotFound());

  EXPECT_TRUE(sidecar_->DestroyGroup(Ref("nobody"), "g").IsNotFound());
  EXPECT_TRUE(sidecar_->AbortGroup("h", "").status().IsNotFound());
  EXPECT_TRUE(sidecar_->RegisterBuffer(Ref("nobody"), NewMemfd(16), 16).status().IsNotFound());
  EXPECT_TRUE(sidecar_->UnregisterBuffer(Ref(ids[0]), 99).IsNotFound());
}

TEST_F(SidecarTest, RemoteStoresAreResolvedOnceThroughTheResolver) {
  std::string a = sidecar_->OpenSession("a", 1, kConnection).value()->id();
  JoinRequest join;
  join.name = "r";
  join.world_size = 1;
  join.timeout = kJoinTimeout;
  StatusOr<Membership> unreachable = sidecar_->JoinGroup(Ref(a), join, "nowhere:1");
  EXPECT_EQ(unreachable.status().kind(), ErrorKind::kUnavailable);
  EXPECT_THAT(unreachable.status().message(),
              AllOf(HasSubstr("rendezvous store"), HasSubstr("no sidecar at nowhere:1")));
  StatusOr<Membership> joined = sidecar_->JoinGroup(Ref(a), join, "elsewhere:1");
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  EXPECT_GT(remote_->NumKeys().value(), 0);  // the rendezvous happened in the resolved store
  ASSERT_TRUE(sidecar_->DestroyGroup(Ref(a), "r").ok());
  join.name = "r2";
  ASSERT_TRUE(sidecar_->JoinGroup(Ref(a), join, "elsewhere:1").ok());
  EXPECT_EQ(resolved_.load(), 2);  // nowhere:1 once, elsewhere:1 once (then cached)
}

TEST_F(SidecarTest, AbortGroupFailsThePendingOps) {
  std::vector<std::string> ids = JoinGroup("g", 2);
  HeapTensor t0({1.0f});
  StatusOr<std::shared_ptr<const SubmittedOp>> op =
      sidecar_->Submit(Submission(ids[0], "g", AllReduce(t0), 1), nullptr);
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  StatusOr<size_t> aborted = sidecar_->AbortGroup("g", "drill");
  ASSERT_TRUE(aborted.ok()) << aborted.status().ToString();
  EXPECT_EQ(*aborted, 1u);
  Status status = (*op)->work->Wait(milliseconds(10000));
  EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("group 'g' was aborted by an operator: drill"));
}

TEST_F(SidecarTest, ShutdownFailsEveryGroupAndRefusesLaterOps) {
  std::vector<std::string> ids = JoinGroup("g", 2);
  HeapTensor t0({1.0f});
  StatusOr<std::shared_ptr<const SubmittedOp>> op =
      sidecar_->Submit(Submission(ids[0], "g", AllReduce(t0), 1), nullptr);
  ASSERT_TRUE(op.ok()) << op.status().ToString();
  sidecar_->Shutdown(Status::Aborted("the sidecar is shutting down"));
  Status status = (*op)->work->Wait(milliseconds(10000));
  EXPECT_EQ(status.kind(), ErrorKind::kAborted) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("the sidecar is shutting down"));
  // Every rank left its groups; the sessions stay until their front end closes them.
  EXPECT_TRUE(sidecar_->ListGroups().empty());
  EXPECT_EQ(sidecar_->ListSessions().size(), 2u);
  HeapTensor t1({1.0f});
  StatusOr<std::shared_ptr<Work>> later = sidecar_->Start(Submission(ids[1], "g", AllReduce(t1)));
  EXPECT_EQ(later.status().kind(), ErrorKind::kAborted);
  EXPECT_THAT(later.status().message(), HasSubstr("the sidecar is shutting down"));
  sidecar_->Shutdown(Status::Aborted("again"));  // idempotent
}

TEST_F(SidecarTest, DrainLetsTheCollectiveInFlightFinishAndRefusesNewWork) {
  std::vector<std::string> ids = JoinGroup("g", 2);
  HeapTensor t0({1.0f, 2.0f});
  StatusOr<std::shared_ptr<Work>> in_flight =
      sidecar_->Start(Submission(ids[0], "g", AllReduce(t0)));
  ASSERT_TRUE(in_flight.ok()) << in_flight.status().ToString();
  sidecar_->Drain(Status::Unavailable("the sidecar is shutting down (test)"));
  // No new op: rank 0 would begin sequence number 2, which no local rank issued.
  HeapTensor again({1.0f});
  Status refused = sidecar_->Start(Submission(ids[0], "g", AllReduce(again))).status();
  EXPECT_EQ(refused.kind(), ErrorKind::kUnavailable) << refused.ToString();
  EXPECT_THAT(refused.message(), HasSubstr("no new allreduce on group 'g'"));
  // No new group.
  std::string late = sidecar_->OpenSession("late", 7, kConnection).value()->id();
  JoinRequest join;
  join.name = "h";
  join.world_size = 1;
  EXPECT_EQ(sidecar_->JoinGroup(Ref(late), join, "").status().kind(), ErrorKind::kUnavailable);
  EXPECT_EQ(sidecar_->WaitDrained(std::chrono::steady_clock::now() + milliseconds(50)), 1u);
  // Rank 1 completes the collective already in flight.
  HeapTensor t1({10.0f, 20.0f});
  StatusOr<std::shared_ptr<Work>> completing =
      sidecar_->Start(Submission(ids[1], "g", AllReduce(t1)));
  ASSERT_TRUE(completing.ok()) << completing.status().ToString();
  EXPECT_TRUE((*completing)->Wait().ok());
  EXPECT_TRUE((*in_flight)->Wait().ok());
  EXPECT_EQ(*t0.values, (std::vector<float>{11.0f, 22.0f}));
  EXPECT_EQ(sidecar_->WaitDrained(std::chrono::steady_clock::now() + milliseconds(5000)), 0u);
}

// The same sidecar on a ManualClock: a drain's deadline and an op's timeout pass when the test
// says so, not when a loaded machine gets round to it.
class ManualClockSidecarTest : public SidecarTest {
 protected:
  ManualClockSidecarTest() : SidecarTest(&clock_) {}
  static ManualClock clock_;
};
ManualClock ManualClockSidecarTest::clock_;

TEST_F(ManualClockSidecarTest, DrainWaitsForTheLastCollectiveOnTheClock) {
  std::vector<std::string> ids = JoinGroup("g", 2);
  HeapTensor t0({1.0f, 2.0f});
  StatusOr<std::shared_ptr<Work>> in_flight =
      sidecar_->Start(Submission(ids[0], "g", AllReduce(t0)));
  ASSERT_TRUE(in_flight.ok()) << in_flight.status().ToString();
  sidecar_->Drain(Status::Unavailable("the sidecar is shutting down (test)"));
  // A drain with a 2-second budget (the op's timeout is longer), while the collective waits for
  // rank 1: it returns when the budget passes on the clock, with the op still in flight.
  std::atomic<int> left{-1};
  const Clock::TimePoint budget = clock_.Now() + std::chrono::seconds(2);
  std::thread drain([&] { left = static_cast<int>(sidecar_->WaitDrained(budget)); });
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(left.load(), -1) << "returned before its deadline";
  clock_.Advance(std::chrono::seconds(2));
  drain.join();
  EXPECT_EQ(left.load(), 1);
  // A second drain returns as soon as the collective completes, long before its budget.
  std::thread second([&] {
    left = static_cast<int>(sidecar_->WaitDrained(clock_.Now() + std::chrono::hours(1)));
  });
  HeapTensor t1({10.0f, 20.0f});
  StatusOr<std::shared_ptr<Work>> completing =
      sidecar_->Start(Submission(ids[1], "g", AllReduce(t1)));
  ASSERT_TRUE(completing.ok());
  second.join();
  EXPECT_EQ(left.load(), 0);
  EXPECT_TRUE((*in_flight)->future().Wait().ok());
  EXPECT_EQ(*t0.values, (std::vector<float>{11.0f, 22.0f}));
}

TEST_F(ManualClockSidecarTest, AnOpTimesOutWhenItsTimeoutPassesOnTheClock) {
  std::vector<std::string> ids = JoinGroup("g", 2);
  HeapTensor t0({1.0f});
  OpRequest request = AllReduce(t0);
  request.timeout = std::chrono::minutes(30);
  StatusOr<std::shared_ptr<Work>> work = sidecar_->Start(Submission(ids[0], "g", request));
  ASSERT_TRUE(work.ok());
  clock_.Advance(std::chrono::minutes(29));
  sidecar_->runtime().timers().Settle();
  EXPECT_FALSE((*work)->IsCompleted());
  clock_.Advance(std::chrono::minutes(1));
  Status status = (*work)->future().Wait();
  EXPECT_TRUE(status.IsTimeout()) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("Timed out after 1800000 ms: ranks [1] never issued it"));
}

TEST_F(SidecarTest, AJoinStopsAtOnceWhenItsSessionEndsOrItsFrontEndGivesUp) {
  const std::string a = sidecar_->OpenSession("a", 1, kConnection).value()->id();
  const std::string b = sidecar_->OpenSession("b", 2, kConnection).value()->id();
  auto caller = std::make_shared<CancelToken>();  // the front end's: its caller goes away
  std::vector<Status> joined(2);
  std::vector<std::chrono::steady_clock::time_point> ended(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      JoinRequest join;
      join.name = i == 0 ? "left-by-its-session" : "given-up";
      join.rank = 0;
      join.world_size = 2;  // rank 1 never comes
      join.timeout = std::chrono::hours(1);
      if (i == 1) join.abandoned = caller;
      joined[i] = sidecar_->JoinGroup(Ref(i == 0 ? a : b), join, "").status();
      ended[i] = std::chrono::steady_clock::now();
    });
  }
  std::this_thread::sleep_for(milliseconds(300));
  const auto start = std::chrono::steady_clock::now();
  sidecar_->CloseSession(a, "test");
  caller->Cancel(Status::Aborted("the caller went away"));
  for (auto& t : threads) t.join();
  EXPECT_EQ(joined[0].kind(), ErrorKind::kAborted) << joined[0].ToString();
  EXPECT_THAT(joined[0].message(), HasSubstr("its session ended"));
  EXPECT_THAT(joined[0].message(), HasSubstr("'left-by-its-session'"));
  EXPECT_EQ(joined[1].kind(), ErrorKind::kAborted) << joined[1].ToString();
  EXPECT_THAT(joined[1].message(), HasSubstr("the caller went away"));
  for (auto at : ended) EXPECT_LT(at - start, milliseconds(2000));
  // The abandoned rank's announcement and incarnation were withdrawn: the group forms normally
  // when both ranks come.
  std::vector<std::string> ids = JoinGroup("given-up", 2);
  EXPECT_EQ(ids.size(), 2u);
}

}  // namespace
}  // namespace collectived
