#include "engine/sidecar/submitted_ops.h"

namespace collectived {

void SubmittedOps::Add(std::shared_ptr<const SubmittedOp> op) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t id = op->client_op_id;
  ops_[id] = std::move(op);
}

void SubmittedOps::Completed(uint64_t client_op_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  completed_.push_back(client_op_id);
  while (completed_.size() > completed_kept_) {
    auto oldest = ops_.find(completed_.front());
    if (oldest != ops_.end() && oldest->second->work->IsCompleted()) ops_.erase(oldest);
    completed_.pop_front();
  }
}

std::shared_ptr<const SubmittedOp> SubmittedOps::Find(uint64_t client_op_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ops_.find(client_op_id);
  return it == ops_.end() ? nullptr : it->second;
}

}  // namespace collectived
