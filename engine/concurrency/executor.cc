#include "engine/concurrency/executor.h"

#include <algorithm>
#include <string>
#include <system_error>

#include "engine/vocabulary/logging.h"

namespace collectived {
namespace {

thread_local Executor* current_executor = nullptr;

size_t ResolveThreads(size_t threads) {
  if (threads > 0) return threads;
  return std::max<size_t>(2, std::thread::hardware_concurrency());
}

}  // namespace

Executor::Executor(ExecutorOptions options)
    : threads_(ResolveThreads(options.threads)), max_blocking_(options.max_blocking_threads) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t i = 0; i < threads_; ++i) {
    ++alive_;
    threads_alive_.emplace_back([this] { Worker(); });
  }
  peak_ = alive_;
}

Executor::~Executor() {
  std::unique_lock<std::mutex> lock(mutex_);
  stopping_ = true;
  work_.notify_all();
  while (!threads_alive_.empty() || !threads_retired_.empty()) {
    work_.wait(lock, [this] { return !threads_retired_.empty(); });
    std::list<std::thread> retired;
    retired.swap(threads_retired_);
    lock.unlock();
    for (std::thread& thread : retired) thread.join();
    lock.lock();
  }
}

void Executor::Post(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.push_back(std::move(task));
  if (idle_ > 0) {
    work_.notify_one();
  } else {
    MaybeSpawnLocked();
  }
}

void Executor::MaybeSpawnLocked() {
  if (queue_.empty() || idle_ > 0 || stopping_) return;
  if (alive_ - blocked_ >= threads_ || alive_ >= threads_ + max_blocking_) return;
  // Threads that left have returned from Worker (it leaves under the lock held here): joining
  // them costs nothing, and at most max_blocking_ wait for it.
  for (std::thread& thread : threads_retired_) thread.join();
  threads_retired_.clear();
  try {
    threads_alive_.emplace_back([this] { Worker(); });
  } catch (const std::system_error& error) {
    // Out of threads or address space: the task waits for a thread of the pool to free up
    // instead of failing the process (the list is unchanged when the thread cannot start).
    LogWarning("the executor cannot start a thread; the task waits for one",
               {{"error", error.what()}, {"alive", std::to_string(alive_)}});
    return;
  }
  ++alive_;
  peak_ = std::max(peak_, alive_);
}

void Executor::Worker() {
  current_executor = this;
  std::unique_lock<std::mutex> lock(mutex_);
  // Started under the lock, so its std::thread is in threads_alive_ by now.
  const std::thread::id self = std::this_thread::get_id();
  for (;;) {
    if (queue_.empty()) {
      // A lent thread leaves once the blocked threads it stood in for are back.
      if (stopping_ || alive_ - blocked_ > threads_) break;
      ++idle_;
      work_.wait(lock,
                 [this] { return stopping_ || !queue_.empty() || alive_ - blocked_ > threads_; });
      --idle_;
      continue;
    }
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    task = nullptr;
    lock.lock();
  }
  --alive_;
  for (auto it = threads_alive_.begin(); it != threads_alive_.end(); ++it) {
    if (it->get_id() == self) {
      threads_retired_.splice(threads_retired_.end(), threads_alive_, it);
      break;
    }
  }
  work_.notify_all();  // the destructor joins retired threads
}

void Executor::EnterBlocking() {
  std::lock_guard<std::mutex> lock(mutex_);
  ++blocked_;
  MaybeSpawnLocked();
}

void Executor::LeaveBlocking() {
  std::lock_guard<std::mutex> lock(mutex_);
  --blocked_;
  if (idle_ > 0 && alive_ - blocked_ > threads_) work_.notify_all();
}

size_t Executor::ThreadCount() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return alive_;
}

size_t Executor::PeakThreadCount() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_;
}

bool Executor::OnPoolThread() const {
  return current_executor == this;
}

Executor::Blocking::Blocking() : executor_(current_executor) {
  if (executor_ != nullptr) executor_->EnterBlocking();
}

Executor::Blocking::~Blocking() {
  if (executor_ != nullptr) executor_->LeaveBlocking();
}

}  // namespace collectived
