// ActivityCount: how many asynchronous activities (queued tasks, pending callbacks, armed timers)
// still work for an object, so that its owner learns without polling when the object may be
// destroyed: Wait blocks until none is left, and once Close was called the last activity to end
// calls the idle hook.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>

#include "engine/concurrency/clock.h"

namespace collectived {

class ActivityCount {
 public:
  // An activity begins. Pair each Enter with one Exit.
  void Enter();
  // An activity ended. When it was the last one and Close was called, runs the idle hook (taken
  // out under the lock, run after it; Wait returns once it returned). Nothing of the counted
  // object may be touched after an Exit.
  void Exit();

  // No activity left now.
  bool Idle() const;
  size_t count() const;

  // From now on, the moment no activity is left runs `on_idle` once (at once, here, if none is
  // left already). Must not block.
  void Close(std::function<void()> on_idle);

  // Blocks until no activity is left and an idle hook that the last Exit runs has returned.
  void Wait() const;
  // Likewise, or until `deadline` of `clock` passes. Returns whether none is left.
  bool WaitUntil(const Clock& clock, Clock::TimePoint deadline) const;

 private:
  mutable std::mutex mutex_;
  mutable std::condition_variable idle_;
  size_t count_ = 0;               // guarded by mutex_
  bool closed_ = false;            // guarded by mutex_
  bool hook_running_ = false;      // guarded by mutex_: the last Exit runs on_idle_
  std::function<void()> on_idle_;  // guarded by mutex_; run once
};

}  // namespace collectived
