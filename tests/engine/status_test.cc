#include "engine/vocabulary/status.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace collectived {
namespace {

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.kind(), ErrorKind::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_FALSE(s.IsTimeout());
  EXPECT_FALSE(s.IsInvalidArgument());
  EXPECT_FALSE(s.IsNotFound());
  EXPECT_TRUE(Status::Ok().ok());
}

TEST(StatusTest, OkKindWithMessageIsStillOk) {
  Status s(ErrorKind::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
}

struct FactoryCase {
  Status status;
  ErrorKind kind;
  const char* name;
};

TEST(StatusTest, FactoriesSetKindAndMessage) {
  const std::vector<FactoryCase> cases = {
      {Status::InvalidArgument("m"), ErrorKind::kInvalidArgument, "invalid_argument"},
      {Status::Timeout("m"), ErrorKind::kTimeout, "timeout"},
      {Status::PeerLost("m"), ErrorKind::kPeerLost, "peer_lost"},
      {Status::Aborted("m"), ErrorKind::kAborted, "aborted"},
      {Status::Desync("m"), ErrorKind::kDesync, "desync"},
      {Status::Unavailable("m"), ErrorKind::kUnavailable, "unavailable"},
      {Status::Internal("m"), ErrorKind::kInternal, "internal"},
      {Status::NotFound("m"), ErrorKind::kNotFound, "not_found"},
  };
  for (const FactoryCase& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_FALSE(c.status.ok());
    EXPECT_EQ(c.status.kind(), c.kind);
    EXPECT_EQ(c.status.message(), "m");
    EXPECT_EQ(ErrorKindName(c.status.kind()), c.name);
    EXPECT_EQ(c.status.ToString(), std::string(c.name) + ": m");
    EXPECT_EQ(c.status.IsTimeout(), c.kind == ErrorKind::kTimeout);
    EXPECT_EQ(c.status.IsInvalidArgument(), c.kind == ErrorKind::kInvalidArgument);
    EXPECT_EQ(c.status.IsNotFound(), c.kind == ErrorKind::kNotFound);
    // The general constructor gives the same result as the factory.
    Status general(c.kind, "m");
    EXPECT_EQ(general.kind(), c.kind);
    EXPECT_EQ(general.ToString(), c.status.ToString());
  }
}

TEST(StatusTest, ErrorKindNames) {
  EXPECT_EQ(ErrorKindName(ErrorKind::kOk), "ok");
  EXPECT_EQ(ErrorKindName(ErrorKind::kInvalidArgument), "invalid_argument");
  EXPECT_EQ(ErrorKindName(ErrorKind::kTimeout), "timeout");
  EXPECT_EQ(ErrorKindName(ErrorKind::kPeerLost), "peer_lost");
  EXPECT_EQ(ErrorKindName(ErrorKind::kAborted), "aborted");
  EXPECT_EQ(ErrorKindName(ErrorKind::kDesync), "desync");
  EXPECT_EQ(ErrorKindName(ErrorKind::kUnavailable), "unavailable");
  EXPECT_EQ(ErrorKindName(ErrorKind::kInternal), "internal");
  EXPECT_EQ(ErrorKindName(ErrorKind::kNotFound), "not_found");
  EXPECT_EQ(ErrorKindName(static_cast<ErrorKind>(99)), "unknown");
}

TEST(StatusTest, ErrorKindValuesMatchTheProto) {
  // proto/collectived/v1/common.proto and the Python mapping rely on these numbers.
  EXPECT_EQ(static_cast<int>(ErrorKind::kOk), 0);
  EXPECT_EQ(static_cast<int>(ErrorKind::kInvalidArgument), 1);
  EXPECT_EQ(static_cast<int>(ErrorKind::kTimeout), 2);
  EXPECT_EQ(static_cast<int>(ErrorKind::kPeerLost), 3);
  EXPECT_EQ(static_cast<int>(ErrorKind::kAborted), 4);
  EXPECT_EQ(static_cast<int>(ErrorKind::kDesync), 5);
  EXPECT_EQ(static_cast<int>(ErrorKind::kUnavailable), 6);
  EXPECT_EQ(static_cast<int>(ErrorKind::kInternal), 7);
  EXPECT_EQ(static_cast<int>(ErrorKind::kNotFound), 8);
}

TEST(StatusTest, EmptyMessageError) {
  Status s = Status::Internal("");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "internal: ");
}

TEST(StatusTest, WithContextPrefixesTheMessageAndKeepsTheKind) {
  Status s = Status::PeerLost("rank 3 is gone");
  Status wrapped = s.WithContext("allreduce (seq 12) on group 'g'");
  EXPECT_EQ(wrapped.kind(), ErrorKind::kPeerLost);
  EXPECT_EQ(wrapped.message(), "allreduce (seq 12) on group 'g': rank 3 is gone");
  EXPECT_EQ(wrapped.ToString(), "peer_lost: allreduce (seq 12) on group 'g': rank 3 is gone");
  // The original is unchanged.
  EXPECT_EQ(s.message(), "rank 3 is gone");

  Status twice = wrapped.WithContext("sidecar n1");
  EXPECT_EQ(twice.message(), "sidecar n1: allreduce (seq 12) on group 'g': rank 3 is gone");
}

TEST(StatusTest, WithContextOnOkStaysOk) {
  Status s = Status::Ok().WithContext("anything");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
}

TEST(StatusTest, CopiesAreIndependentValues) {
  Status original = Status::Timeout("store get 'k' timed out");
  Status copy = original;
  EXPECT_EQ(copy.kind(), ErrorKind::kTimeout);
  EXPECT_EQ(copy.message(), original.message());

  Status assigned;
  assigned = original;
  EXPECT_EQ(assigned.ToString(), original.ToString());

  // Reassigning the original does not affect the copies.
  original = Status::Ok();
  EXPECT_TRUE(original.ok());
  EXPECT_EQ(copy.kind(), ErrorKind::kTimeout);
  EXPECT_EQ(assigned.message(), "store get 'k' timed out");

  Status moved = std::move(copy);
  EXPECT_EQ(moved.kind(), ErrorKind::kTimeout);
  EXPECT_EQ(moved.message(), "store get 'k' timed out");
}

TEST(StatusTest, CopiesMayBeReadFromManyThreads) {
  const Status shared = Status::Aborted("group 'g' aborted by operator");
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([shared] {
      for (int j = 0; j < 1000; ++j) {
        Status local = shared;
        EXPECT_EQ(local.kind(), ErrorKind::kAborted);
        EXPECT_EQ(local.ToString(), "aborted: group 'g' aborted by operator");
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// ---------------------------------------------------------------------------------------------
// StatusOr

TEST(StatusOrTest, HoldsAValue) {
  StatusOr<std::string> v = std::string("payload");
  EXPECT_TRUE(v.ok());
  EXPECT_TRUE(v.status().ok());
  EXPECT_EQ(v.value(), "payload");
  EXPECT_EQ(*v, "payload");
  EXPECT_EQ(v->size(), 7u);
  v.value() += "!";
  EXPECT_EQ(v.value(), "payload!");
  const StatusOr<std::string>& cref = v;
  EXPECT_EQ(cref.value(), "payload!");
  EXPECT_EQ(cref->size(), 8u);
}

TEST(StatusOrTest, HoldsAnError) {
  StatusOr<int> v = Status::NotFound("key 'k' not found");
  EXPECT_FALSE(v.ok());
  EXPECT_EQ(v.status().kind(), ErrorKind::kNotFound);
  EXPECT_EQ(v.status().message(), "key 'k' not found");
}

TEST(StatusOrTest, MovesTheValueOut) {
  StatusOr<std::unique_ptr<int>> v = std::make_unique<int>(3);
  ASSERT_TRUE(v.ok());
  std::unique_ptr<int> taken = std::move(v).value();
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(*taken, 3);
}

TEST(StatusOrTest, Copies) {
  StatusOr<std::vector<int>> a = std::vector<int>{1, 2, 3};
  StatusOr<std::vector<int>> b = a;
  b.value().push_back(4);
  EXPECT_EQ(a.value().size(), 3u);
  EXPECT_EQ(b.value().size(), 4u);

  StatusOr<std::vector<int>> err = Status::InvalidArgument("bad");
  StatusOr<std::vector<int>> err_copy = err;
  EXPECT_TRUE(err_copy.status().IsInvalidArgument());
}

StatusOr<int> ParsePositive(int v) {
  if (v <= 0) return Status::InvalidArgument("must be positive, got " + std::to_string(v));
  return v;
}

TEST(StatusOrTest, ReturnedFromFunctions) {
  EXPECT_EQ(ParsePositive(5).value(), 5);
  StatusOr<int> bad = ParsePositive(-2);
  EXPECT_TRUE(bad.status().IsInvalidArgument());
  EXPECT_EQ(bad.status().message(), "must be positive, got -2");
}

// ---------------------------------------------------------------------------------------------
// COLLECTIVED_RETURN_IF_ERROR

Status Step(const Status& result, int* calls) {
  ++*calls;
  return result;
}

Status TwoSteps(const Status& first, const Status& second, int* calls, bool* reached_end) {
  COLLECTIVED_RETURN_IF_ERROR(Step(first, calls));
  COLLECTIVED_RETURN_IF_ERROR(Step(second, calls));
  *reached_end = true;
  return Status::Ok();
}

TEST(ReturnIfErrorTest, ContinuesOnOk) {
  int calls = 0;
  bool reached_end = false;
  EXPECT_TRUE(TwoSteps(Status::Ok(), Status::Ok(), &calls, &reached_end).ok());
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(reached_end);
}

TEST(ReturnIfErrorTest, ReturnsTheFirstErrorAndEvaluatesOnce) {
  int calls = 0;
  bool reached_end = false;
  Status s = TwoSteps(Status::Desync("first"), Status::Internal("second"), &calls, &reached_end);
  EXPECT_EQ(s.kind(), ErrorKind::kDesync);
  EXPECT_EQ(s.message(), "first");
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(reached_end);

  calls = 0;
  s = TwoSteps(Status::Ok(), Status::Internal("second"), &calls, &reached_end);
  EXPECT_EQ(s.kind(), ErrorKind::kInternal);
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(reached_end);
}

StatusOr<int> ValueAfterCheck(const Status& check) {
  COLLECTIVED_RETURN_IF_ERROR(check);
  return 7;
}

TEST(ReturnIfErrorTest, WorksInFunctionsReturningStatusOr) {
  EXPECT_EQ(ValueAfterCheck(Status::Ok()).value(), 7);
  EXPECT_EQ(ValueAfterCheck(Status::Aborted("x")).status().kind(), ErrorKind::kAborted);
}

TEST(ReturnIfErrorTest, UsableAsASingleStatementInIfElse) {
  auto f = [](bool check) -> Status {
    if (check)
      COLLECTIVED_RETURN_IF_ERROR(Status::Timeout("t"));
    else
      return Status::NotFound("n");
    return Status::Ok();
  };
  EXPECT_TRUE(f(true).IsTimeout());
  EXPECT_TRUE(f(false).IsNotFound());
}

}  // namespace
}  // namespace collectived
