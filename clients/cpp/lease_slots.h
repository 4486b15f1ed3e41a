// LeaseSlots: numbered slots taken and given back, the lowest free one first, made as needed
// up to a bound; past the bound a taker waits for a slot to be given back. It numbers the
// trainer's leased ready events (cuda_tensor_export.h, ReadyEventLease), so that an event is never
// recorded again while the op it was recorded for may still be waited on by a sidecar, and so
// that the events in use stay few (the sidecar caches the ones it opened).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <optional>
#include <set>

namespace collectived {

class LeaseSlots {
 public:
  explicit LeaseSlots(size_t max_slots);

  // The lowest free slot, now taken; a new one (numbered made()) when none is free and fewer
  // than the bound were made; when every slot is taken, waits up to `timeout` for one to be given
  // back. nullopt when none was within it.
  std::optional<size_t> Acquire(std::chrono::milliseconds timeout);
  // Gives `slot` back (a slot not taken is ignored).
  void Release(size_t slot);

  size_t made() const;   // slots numbered so far
  size_t taken() const;  // slots taken now

 private:
  const size_t max_slots_;
  mutable std::mutex mutex_;
  std::condition_variable released_;
  size_t made_ = 0;        // guarded by mutex_
  std::set<size_t> free_;  // guarded by mutex_; made and not taken
};

}  // namespace collectived
