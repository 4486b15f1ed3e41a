#include "engine/concurrency/timer_queue.h"

namespace collectived {

TimerQueue::TimerQueue(Clock& clock) : clock_(clock) {
  thread_ = std::thread([this] { Loop(); });
}

TimerQueue::~TimerQueue() {
  Stop();
}

void TimerQueue::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  std::lock_guard<std::mutex> joining(join_mutex_);
  if (thread_.joinable()) thread_.join();
}

TimerQueue::TimerId TimerQueue::Schedule(Clock::TimePoint when, std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  const TimerId id = next_id_++;
  const bool first = timers_.empty() || Key{when, id} < timers_.begin()->first;
  timers_.emplace(Key{when, id}, std::move(fn));
  when_.emplace(id, when);
  if (first) {
    earlier_ = true;
    changed_.notify_all();
  }
  return id;
}

bool TimerQueue::Cancel(TimerId id) {
  std::function<void()> dropped;  // destroyed outside the lock: it may own anything
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = when_.find(id);
  if (it == when_.end()) return false;
  auto timer = timers_.find(Key{it->second, id});
  dropped = std::move(timer->second);
  timers_.erase(timer);
  when_.erase(it);
  return true;
}

size_t TimerQueue::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timers_.size();
}

bool TimerQueue::DueLocked() const {
  return !timers_.empty() && timers_.begin()->first.first <= clock_.Now();
}

void TimerQueue::Settle() {
  std::unique_lock<std::mutex> lock(mutex_);
  settled_.wait(lock, [this] { return stopping_ || (running_ == kNoTimer && !DueLocked()); });
}

void TimerQueue::Loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (!DueLocked()) {
      const Clock::TimePoint until =
          timers_.empty() ? Clock::TimePoint::max() : timers_.begin()->first.first;
      earlier_ = false;
      clock_.WaitUntil(changed_, lock, until, [this] { return stopping_ || earlier_; });
      continue;
    }
    auto first = timers_.begin();
    std::function<void()> fn = std::move(first->second);
    running_ = first->first.second;
    when_.erase(running_);
    timers_.erase(first);
    lock.unlock();
    fn();
    fn = nullptr;  // what it owns goes before the next timer runs
    lock.lock();
    running_ = kNoTimer;
    settled_.notify_all();
  }
  settled_.notify_all();
}

}  // namespace collectived
