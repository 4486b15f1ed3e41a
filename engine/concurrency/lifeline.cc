#include "engine/concurrency/lifeline.h"

namespace collectived {

bool Lifeline::Enter() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (retired_) return false;
  ++inside_;
  return true;
}

void Lifeline::Exit() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Under the lock: Retire's caller may destroy what the entry used as soon as it sees none left.
  if (--inside_ == 0) left_.notify_all();
}

void Lifeline::Retire() {
  std::unique_lock<std::mutex> lock(mutex_);
  retired_ = true;
  left_.wait(lock, [&] { return inside_ == 0; });
}

bool Lifeline::retired() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return retired_;
}

}  // namespace collectived
