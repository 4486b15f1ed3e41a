#include "engine/sidecar/submitted_ops.h"

#include <string>

namespace collectived {

SubmittedOps::~SubmittedOps() {
  ledger_->GiveAll(*share_, {{Resource::kPendingOps, pending_ops_},
                             {Resource::kPendingBytes, pending_bytes_ + completed_bytes_}});
}

Status SubmittedOps::Reserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  COLLECTIVED_RETURN_IF_ERROR(
      ledger_->TakeAll(*share_, {{Resource::kPendingOps, 1}, {Resource::kPendingBytes, bytes}}));
  ++pending_ops_;
  pending_bytes_ += bytes;
  return Status::Ok();
}

void SubmittedOps::Unreserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  --pending_ops_;
  pending_bytes_ -= bytes;
  ledger_->GiveAll(*share_, {{Resource::kPendingOps, 1}, {Resource::kPendingBytes, bytes}});
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
  // Its bytes stay counted while it is remembered for a late Wait.
  ledger_->Give(*share_, Resource::kPendingOps, 1);
  completed_.push_back(op);
  completed_bytes_ += op->held_bytes;
  while (!completed_.empty() && (completed_.size() > quotas_.completed_ops_kept ||
                                 completed_bytes_ > quotas_.max_completed_bytes)) {
    const std::shared_ptr<const SubmittedOp>& oldest = completed_.front();
    auto it = ops_.find(oldest->client_op_id);
    if (it != ops_.end() && it->second == oldest) ops_.erase(it);  // not replaced since
    completed_bytes_ -= oldest->held_bytes;
    ledger_->Give(*share_, Resource::kPendingBytes, oldest->held_bytes);
    completed_.pop_front();
  }
}

std::shared_ptr<const SubmittedOp> SubmittedOps::Find(uint64_t client_op_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ops_.find(client_op_id);
  return it == ops_.end() ? nullptr : it->second;
}

}  // namespace collectived
