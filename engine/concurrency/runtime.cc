#include "engine/concurrency/runtime.h"

namespace collectived {

StatusOr<std::shared_ptr<Runtime>> Runtime::Create(RuntimeOptions options) {
  StatusOr<std::unique_ptr<Reactor>> reactor = Reactor::Create();
  if (!reactor.ok()) return reactor.status();
  Clock& clock = options.clock != nullptr ? *options.clock : Clock::Real();
  return std::shared_ptr<Runtime>(new Runtime(clock, std::move(*reactor), options.executor));
}

Runtime::Runtime(Clock& clock, std::unique_ptr<Reactor> reactor, ExecutorOptions executor)
    : clock_(clock),
      timers_(std::make_unique<TimerQueue>(clock)),
      reactor_(std::move(reactor)),
      executor_(std::make_unique<Executor>(executor)) {}

Runtime::~Runtime() {
  // Timers post to the executor and tasks use the reactor: stop the timers first, let the tasks
  // finish, then the reactor.
  timers_->Stop();
  executor_.reset();
  reactor_.reset();
  timers_.reset();
}

}  // namespace collectived
