#include "engine/sidecar/submitted_ops.h"

#include <string>

namespace collectived {

Status SubmittedOps::Reserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (pending_ops_ >= quotas_.max_pending_ops) {
    return Status::ResourceExhausted(
        std::to_string(pending_ops_) +
        " asynchronous ops are pending, the most a session may have: wait for some first");
  }
  if (bytes > quotas_.max_pending_bytes - pending_bytes_) {
    return Status::ResourceExhausted(
        "pending asynchronous ops hold " + std::to_string(pending_bytes_) + " inline bytes and " +
        "this one " + std::to_string(bytes) + " more, over the " +
        std::to_string(quotas_.max_pending_bytes) +
        " a session may hold: wait for some first, or use shared memory");
  }
  ++pending_ops_;
  pending_bytes_ += bytes;
  return Status::Ok();
}

void SubmittedOps::Unreserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  --pending_ops_;
  pending_bytes_ -= bytes;
}

void SubmittedOps::Add(std::shared_ptr<const SubmittedOp> op) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = op->client_op_id;
  ops_[id] = std::move(op);
}

void SubmittedOps::Completed(const std::shared_ptr<const SubmittedOp>& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  --pending_ops_;
  pending_bytes_ -= op->held_bytes;
  completed_.push_back(op);
  completed_bytes_ += op->held_bytes;
  while (!completed_.empty() && (completed_.size() > quotas_.completed_ops_kept ||
                                 completed_bytes_ > quotas_.max_completed_bytes)) {
    const std::shared_ptr<const SubmittedOp>& oldest = completed_.front();
    auto it = ops_.find(oldest->client_op_id);
    if (it != ops_.end() && it->second == oldest) ops_.erase(it);  // not replaced since
    completed_bytes_ -= oldest->held_bytes;
    completed_.pop_front();
  }
}

std::shared_ptr<const SubmittedOp> SubmittedOps::Find(uint64_t client_op_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ops_.find(client_op_id);
  return it == ops_.end() ? nullptr : it->second;
}

}  // namespace collectived
