// SubmittedOps: the asynchronous ops of one session, by client op id: those still pending and
// the most recently completed ones (bounded in number and in the bytes they hold), so that a
// client can wait for an op by its id after submitting it, even shortly after it completed.
// It also enforces the session's quotas on pending ops (SessionQuotas).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "engine/sidecar/session_quotas.h"
#include "engine/sidecar/submitted_op.h"
#include "engine/status.h"

namespace collectived {

class SubmittedOps {
 public:
  explicit SubmittedOps(const SessionQuotas& quotas) : quotas_(quotas) {}

  // Makes room for one more pending op holding `bytes`, before it starts. ResourceExhausted
  // naming the quota if the session already has the most pending ops or bytes it may have.
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
  mutable std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<const SubmittedOp>> ops_;  // guarded by mutex_
  std::deque<std::shared_ptr<const SubmittedOp>> completed_;    // guarded by mutex_; oldest first
  size_t pending_ops_ = 0;                                      // guarded by mutex_
  size_t pending_bytes_ = 0;                                    // guarded by mutex_
  size_t completed_bytes_ = 0;                                  // guarded by mutex_
};

}  // namespace collectived
