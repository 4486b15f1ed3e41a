// Runtime: the threads and the time of one sidecar, shared by all of its groups — the clock, one
// timer thread (TimerQueue), one socket thread (Reactor) and the executor pool. Nothing else in
// the engine starts a thread for a group, an op or a transfer, so a sidecar's engine threads are
// bounded by max_threads() whatever it serves.
//
// Thread-safety: the accessors may be called from any thread; each part states its own.
#pragma once

#include <memory>

#include "engine/concurrency/clock.h"
#include "engine/concurrency/executor.h"
#include "engine/concurrency/reactor.h"
#include "engine/concurrency/timer_queue.h"
#include "engine/vocabulary/status.h"

namespace collectived {

struct RuntimeOptions {
  ExecutorOptions executor;
  // Null: the real clock. A test's ManualClock must outlive the runtime.
  Clock* clock = nullptr;
};

class Runtime {
 public:
  // Starts the threads; Internal when the reactor cannot be created.
  static StatusOr<std::shared_ptr<Runtime>> Create(RuntimeOptions options = {});
  // Every user (group, channel, backend) must be gone: stops the timers, drains the executor,
  // then stops the reactor.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Clock& clock() const { return clock_; }
  TimerQueue& timers() const { return *timers_; }
  Executor& executor() const { return *executor_; }
  Reactor& reactor() const { return *reactor_; }

  // The most engine threads this runtime ever runs at once: the executor's bound plus the
  // timer and reactor threads.
  size_t max_threads() const { return executor_->max_threads() + 2; }

 private:
  Runtime(Clock& clock, std::unique_ptr<Reactor> reactor, ExecutorOptions executor);

  Clock& clock_;
  std::unique_ptr<TimerQueue> timers_;
  std::unique_ptr<Reactor> reactor_;
  std::unique_ptr<Executor> executor_;
};

}  // namespace collectived
