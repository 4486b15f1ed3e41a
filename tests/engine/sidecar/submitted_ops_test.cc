// SubmittedOps: a session's asynchronous ops, its quotas on pending ops and on the bytes they
// hold, and the bounded memory of completed ops.
#include "engine/sidecar/submitted_ops.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

namespace collectived {
namespace {

std::shared_ptr<SubmittedOp> MakeOp(uint64_t id, size_t bytes) {
  auto op = std::make_shared<SubmittedOp>();
  op->client_op_id = id;
  op->held_bytes = bytes;
  op->work = std::make_shared<Work>(OpInfo{"g", "allreduce", id}, Work::kNoTimeout);
  return op;
}

// Reserves, adds and returns an op (as Sidecar::Submit does).
std::shared_ptr<SubmittedOp> Submit(SubmittedOps& ops, uint64_t id, size_t bytes) {
  EXPECT_TRUE(ops.Reserve(bytes).ok());
  auto op = MakeOp(id, bytes);
  ops.Add(op);
  return op;
}

// A ledger whose pending-op and pending-byte ceilings are the given ones (per session and in
// total), and the other ceilings the machine's defaults.
std::shared_ptr<ResourceLedger> Ledger(uint64_t ops_each, uint64_t ops_total, uint64_t bytes_each,
                                       uint64_t bytes_total) {
  ResourceCeilings ceilings = ResourceCeilings::Defaults(MachineLimits::OfThisProcess());
  ceilings[Resource::kPendingOps] = {ops_each, ops_total};
  ceilings[Resource::kPendingBytes] = {bytes_each, bytes_total};
  return ResourceLedger::Create(ceilings, nullptr);
}

std::shared_ptr<ResourceLedger> DefaultLedger() {
  return Ledger(1 << 20, 1 << 20, 1 << 30, 1 << 30);
}

std::shared_ptr<ResourceShare> Share(const std::string& label = "session s1") {
  return std::make_shared<ResourceShare>(label);
}

void Finish(SubmittedOps& ops, const std::shared_ptr<SubmittedOp>& op) {
  op->work->Complete(Status::Ok());
  ops.Completed(op);
}

TEST(SubmittedOps, PendingOpsAreBoundedAndFreedByCompletion) {
  SessionQuotas quotas;
  SubmittedOps ops(quotas, Ledger(3, 100, 1 << 20, 1 << 20), Share());
  auto a = Submit(ops, 1, 0);
  Submit(ops, 2, 0);
  Submit(ops, 3, 0);
  Status refused = ops.Reserve(0);
  EXPECT_EQ(refused.kind(), ErrorKind::kResourceExhausted);
  EXPECT_NE(refused.message().find("pending_ops: session s1 holds 3, its share is 3 "
                                   "(--client-max-pending-ops raises it)"),
            std::string::npos)
      << refused.message();
  Finish(ops, a);
  EXPECT_TRUE(ops.Reserve(0).ok());
  ops.Unreserve(0);
  EXPECT_TRUE(ops.Reserve(0).ok());
}

TEST(SubmittedOps, PendingBytesAreBounded) {
  SessionQuotas quotas;
  quotas.completed_ops_kept = 0;  // completed ops' bytes go back at once
  SubmittedOps ops(quotas, Ledger(100, 100, 100, 1000), Share());
  auto a = Submit(ops, 1, 60);
  Status refused = ops.Reserve(41);
  EXPECT_EQ(refused.kind(), ErrorKind::kResourceExhausted);
  EXPECT_NE(refused.message().find("pending_bytes: session s1 holds 60 and asks 41 more"),
            std::string::npos)
      << refused.message();
  EXPECT_TRUE(ops.Reserve(40).ok());
  ops.Unreserve(40);
  Finish(ops, a);
  EXPECT_TRUE(ops.Reserve(100).ok());
}

TEST(SubmittedOps, CompletedOpsAreForgottenOldestFirstByCountAndByBytes) {
  SessionQuotas quotas;
  quotas.completed_ops_kept = 3;
  quotas.max_completed_bytes = 250;
  SubmittedOps ops(quotas, DefaultLedger(), Share());
  for (uint64_t id = 1; id <= 4; ++id) Finish(ops, Submit(ops, id, 10));
  EXPECT_EQ(ops.Find(1), nullptr);  // over the count
  EXPECT_NE(ops.Find(2), nullptr);
  Finish(ops, Submit(ops, 5, 200));  // 10 + 10 + 200 kept; 2 goes by count
  EXPECT_EQ(ops.Find(2), nullptr);
  EXPECT_NE(ops.Find(3), nullptr);
  Finish(ops, Submit(ops, 6, 100));  // 3, 4 and 5 would hold 320 bytes: they go
  EXPECT_EQ(ops.Find(3), nullptr);
  EXPECT_EQ(ops.Find(4), nullptr);
  EXPECT_EQ(ops.Find(5), nullptr);
  EXPECT_NE(ops.Find(6), nullptr);
}

TEST(SubmittedOps, PendingOpsAreNeverForgotten) {
  SessionQuotas quotas;
  quotas.completed_ops_kept = 1;
  SubmittedOps ops(quotas, DefaultLedger(), Share());
  auto pending = Submit(ops, 1, 0);
  for (uint64_t id = 2; id <= 5; ++id) Finish(ops, Submit(ops, id, 0));
  EXPECT_EQ(ops.Find(1), pending);
}

TEST(SubmittedOps, AReusedIdIsAccountedPerOp) {
  SessionQuotas quotas;
  quotas.completed_ops_kept = 1;
  SubmittedOps ops(quotas, Ledger(2, 100, 1 << 20, 1 << 20), Share());
  auto first = Submit(ops, 7, 0);
  auto second = Submit(ops, 7, 0);  // the client reused the id: Find gives the newer op
  EXPECT_EQ(ops.Find(7), second);
  EXPECT_FALSE(ops.Reserve(0).ok());
  Finish(ops, first);  // the older op completing frees its own slot and keeps the newer one
  EXPECT_EQ(ops.Find(7), second);
  Finish(ops, Submit(ops, 8, 0));  // forgets `first` (by count), which no longer owns id 7
  EXPECT_EQ(ops.Find(7), second);
}

TEST(SubmittedOps, TheSidecarTotalBoundsAllSessionsTogether) {
  SessionQuotas quotas;
  auto ledger = Ledger(3, 4, 1 << 20, 1 << 20);
  SubmittedOps first(quotas, ledger, Share("session s1"));
  SubmittedOps second(quotas, ledger, Share("session s2"));
  Submit(first, 1, 0);
  Submit(first, 2, 0);
  Submit(first, 3, 0);
  auto held = Submit(second, 1, 0);
  // s2 is within its share, but the sidecar holds its total.
  Status refused = second.Reserve(0);
  EXPECT_EQ(refused.kind(), ErrorKind::kResourceExhausted);
  EXPECT_NE(refused.message().find("pending_ops: the sidecar holds 4 for all clients, its total "
                                   "is 4 (--max-pending-ops raises it)"),
            std::string::npos)
      << refused.message();
  Finish(second, held);
  EXPECT_TRUE(second.Reserve(0).ok());
  second.Unreserve(0);
}

TEST(SubmittedOps, WhatAnEndedSessionHeldGoesBack) {
  SessionQuotas quotas;
  auto ledger = DefaultLedger();
  {
    SubmittedOps ops(quotas, ledger, Share());
    Submit(ops, 1, 100);
    Finish(ops, Submit(ops, 2, 50));  // remembered: its bytes still count
    EXPECT_EQ(ledger->InUse(Resource::kPendingOps), 1u);
    EXPECT_EQ(ledger->InUse(Resource::kPendingBytes), 150u);
  }
  EXPECT_EQ(ledger->InUse(Resource::kPendingOps), 0u);
  EXPECT_EQ(ledger->InUse(Resource::kPendingBytes), 0u);
}

}  // namespace
}  // namespace collectived
