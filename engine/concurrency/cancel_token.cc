#include "engine/concurrency/cancel_token.h"

#include <utility>

namespace collectived {

void CancelToken::Cancel(const Status& reason) {
  std::map<uint64_t, Callback> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!reason_.ok()) return;
    reason_ = reason.ok() ? Status::Aborted("cancelled") : reason;
    callbacks.swap(pending_);
  }
  for (auto& [id, fn] : callbacks) fn(reason_);
}

Status CancelToken::reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

uint64_t CancelToken::OnCancel(Callback fn) {
  Status reason;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (reason_.ok()) {
      const uint64_t id = next_id_++;
      pending_.emplace(id, std::move(fn));
      return id;
    }
    reason = reason_;
  }
  fn(reason);
  return 0;
}

void CancelToken::Remove(uint64_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.erase(id);
}

}  // namespace collectived
