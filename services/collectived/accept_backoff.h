// AcceptBackoff: what a listener does when accept fails for want of resources (EMFILE, ENFILE,
// ENOBUFS, ENOMEM). The connection stays queued, so polling the listener again at once spins
// (a sidecar out of descriptors burned two cores that way and never recovered); instead the
// listener is left alone for a while, doubling from 10 ms to 1 s, and tried again, so that it
// serves again by itself as soon as resources return.
//
// Not thread-safe: one per listener thread. Times are read by the caller (Clock::Now()).
#pragma once

#include <chrono>
#include <string>

#include "engine/concurrency/clock.h"

namespace collectived {

class AcceptBackoff {
 public:
  // Whether accept failing with `error` means the process or system is out of something.
  static bool IsExhaustion(int error);

  // Records an accept that failed with an exhaustion error: the listener rests. Returns true
  // when this begins an episode (the first failure since the last success).
  bool Failed(int error, Clock::TimePoint now);
  // Records an accepted connection. Returns true when this ends an episode.
  bool Succeeded();

  // Whether the listener must not be polled now.
  bool Resting(Clock::TimePoint now) const { return exhausted_ && now < retry_at_; }
  // Milliseconds until the listener may be tried again (0 when it may now; -1 when not resting).
  int MillisUntilRetry(Clock::TimePoint now) const;
  // Why accept failed last ("too many open files"), while exhausted.
  const std::string& reason() const { return reason_; }

 private:
  static constexpr std::chrono::milliseconds kFirst{10};
  static constexpr std::chrono::milliseconds kMost{1000};

  bool exhausted_ = false;
  std::chrono::milliseconds delay_{0};
  Clock::TimePoint retry_at_{};
  std::string reason_;
};

}  // namespace collectived
