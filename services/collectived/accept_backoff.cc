#include "services/collectived/accept_backoff.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace collectived {

bool AcceptBackoff::IsExhaustion(int error) {
  return error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM;
}

bool AcceptBackoff::Failed(int error, Clock::TimePoint now) {
  const bool began = !exhausted_;
  exhausted_ = true;
  delay_ = began ? kFirst : std::min(kMost, delay_ * 2);
  retry_at_ = now + delay_;
  reason_ = std::strerror(error);
  return began;
}

bool AcceptBackoff::Succeeded() {
  const bool ended = exhausted_;
  exhausted_ = false;
  delay_ = std::chrono::milliseconds(0);
  reason_.clear();
  return ended;
}

int AcceptBackoff::MillisUntilRetry(Clock::TimePoint now) const {
  if (!exhausted_) return -1;
  if (now >= retry_at_) return 0;
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(retry_at_ - now).count());
}

}  // namespace collectived
