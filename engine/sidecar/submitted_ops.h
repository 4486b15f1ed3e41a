// SubmittedOps: the asynchronous ops of one session, by client op id: those still pending and
// the most recently completed ones (a bounded number), so that a client can wait for an op by
// its id after submitting it, even shortly after it completed.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>

#include "engine/sidecar/submitted_op.h"

namespace collectived {

class SubmittedOps {
 public:
  // Keeps at most `completed_kept` completed ops (oldest forgotten first); pending ops are
  // always kept.
  explicit SubmittedOps(size_t completed_kept) : completed_kept_(completed_kept) {}

  // Remembers `op` under its client op id (replacing an older op with the same id).
  void Add(std::shared_ptr<const SubmittedOp> op);

  // Records that the op `client_op_id` completed; forgets the oldest completed ops beyond the
  // bound.
  void Completed(uint64_t client_op_id);

  // The op submitted as `client_op_id`, or null if it was never submitted or was forgotten.
  std::shared_ptr<const SubmittedOp> Find(uint64_t client_op_id) const;

 private:
  const size_t completed_kept_;
  mutable std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<const SubmittedOp>> ops_;  // guarded by mutex_
  std::deque<uint64_t> completed_;  // guarded by mutex_; oldest first, bounded
};

}  // namespace collectived
