// SubmittedOps: the asynchronous ops of one session, by client op id: those still pending and
// the most recently completed ones (bounded in number and in the bytes they hold), so that a
// client can wait for an op by its id after submitting it, even shortly after it completed.
// Its pending ops and the inline bytes they hold are counted in the sidecar's ResourceLedger
// (the session's share and the sidecar's total); what is still pending when it is destroyed (the
// session ended) is given back then.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "engine/sidecar/resource_ledger.h"
#include "engine/sidecar/session_quotas.h"
#include "engine/sidecar/submitted_op.h"
#include "engine/vocabulary/status.h"

namespace collectived {

class SubmittedOps {
 public:
  SubmittedOps(const SessionQuotas& quotas, std::shared_ptr<ResourceLedger> ledger,
               std::shared_ptr<ResourceShare> share)
      : quotas_(quotas), ledger_(std::move(ledger)), share_(std::move(share)) {}
  ~SubmittedOps();
  SubmittedOps(const SubmittedOps&) = delete;
  SubmittedOps& operator=(const SubmittedOps&) = delete;

  // Makes room for one more pending op holding `bytes`, before it starts. The ledger's
  // ResourceExhausted (pending_ops, pending_bytes) when the session's share or the sidecar's
  // total is used up.
  Status Reserve(size_t bytes);
  // Gives back a reservation whose op did not start.
  void Unreserve(size_t bytes);

  // Remembers `op` (reserved before) under its client op id, replacing an older op with the
  // same id for Find (the older one is still accounted until it completes).
  void Add(std::shared_ptr<const SubmittedOp> op);

  // Records that `op` completed: it no longer counts as pending; it is remembered among the
  // completed ops, and the oldest completed ones beyond the bounds are forgotten.
  void Completed(const std::shared_ptr<const SubmittedOp>& op);

  // The op submitted as `client_op_id`, or null if it was never submitted or was forgotten.
  std::shared_ptr<const SubmittedOp> Find(uint64_t client_op_id) const;

 private:
  const SessionQuotas quotas_;
  const std::shared_ptr<ResourceLedger> ledger_;
  const std::shared_ptr<ResourceShare> share_;
  mutable std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<const SubmittedOp>> ops_;  // guarded by mutex_
  std::deque<std::shared_ptr<const SubmittedOp>> completed_;    // guarded by mutex_; oldest first
  size_t pending_ops_ = 0;                                      // guarded by mutex_
  size_t pending_bytes_ = 0;                                    // guarded by mutex_
  size_t completed_bytes_ = 0;                                  // guarded by mutex_
};

}  // namespace collectived
