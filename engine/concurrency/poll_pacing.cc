#include "engine/concurrency/poll_pacing.h"

#include <sys/prctl.h>

#include <algorithm>

namespace collectived {

void PollPacing::Activity(TimePoint now) {
  spin_until_ = std::max(spin_until_, now + options_.spin);
}

PollPacing::Micros PollPacing::NextSleep(TimePoint now, TimePoint newest_wait_start) const {
  if (now < spin_until_) return Micros(0);
  const auto waited = std::chrono::duration_cast<Micros>(now - newest_wait_start);
  return std::clamp(waited / options_.fraction, options_.shortest_sleep, options_.longest_sleep);
}

void PollPacing::FineTimerSlackForThisThread() {
  prctl(PR_SET_TIMERSLACK, 1000UL, 0UL, 0UL, 0UL);  // nanoseconds
}

}  // namespace collectived
