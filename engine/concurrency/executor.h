// Executor: the sidecar's fixed pool of threads that runs every group's work. A group is a queue
// of ops, not a thread: its steps (an op's data phase, a failure's handling) are tasks posted
// here, and an op waiting for its peers holds no thread at all (it waits as state, woken by its
// control channel or a timer).
//
// Some tasks block in a transport call whose peers are other sidecars' tasks (a Gloo collective
// returns only once every sidecar of the group made the same call). A fixed pool whose threads
// all sat in such calls could starve the very tasks they wait for on another sidecar (groups A
// and B blocked here on sidecar 2's B and A, queued behind each other there). A task declares
// such a call with a Blocking scope; while pool threads are blocked the pool lends up to
// `max_blocking_threads` more, so runnable tasks always find a thread, and the extra threads
// leave once they are no longer needed. The threads of a sidecar are therefore bounded by
// threads + max_blocking_threads, whatever the number of groups, ops and transfers.
//
// Thread-safety: every method may be called from any thread, tasks included.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <thread>

namespace collectived {

struct ExecutorOptions {
  // Threads that run tasks: 0 = one per core, at least 2.
  size_t threads = 0;
  // Threads lent while pool threads are blocked in transport calls (Blocking), at most.
  size_t max_blocking_threads = 64;
};

class Executor {
 public:
  explicit Executor(ExecutorOptions options = {});
  // Runs every task queued (tasks may post more), then joins the threads. Must not be called
  // from one of its own tasks.
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs `task` on a pool thread, in post order among tasks of no particular group (a group
  // orders its own steps). `task` must not throw.
  void Post(std::function<void()> task);

  // While one lives on a pool thread, that thread counts as blocked in a transport call (see
  // the header comment). Elsewhere it does nothing.
  class Blocking {
   public:
    Blocking();
    ~Blocking();
    Blocking(const Blocking&) = delete;
    Blocking& operator=(const Blocking&) = delete;

   private:
    Executor* executor_;
  };

  // The threads that run tasks (options.threads resolved), and the most that may be alive.
  size_t threads() const { return threads_; }
  size_t max_threads() const { return threads_ + max_blocking_; }
  // Threads alive now, and the most ever alive at once.
  size_t ThreadCount() const;
  size_t PeakThreadCount() const;
  // Whether the calling thread is one of this executor's.
  bool OnPoolThread() const;

 private:
  void Worker();
  // Starts a thread when tasks wait, none is idle and fewer than threads_ are unblocked.
  void MaybeSpawnLocked();
  void EnterBlocking();
  void LeaveBlocking();

  const size_t threads_;
  const size_t max_blocking_;

  mutable std::mutex mutex_;
  std::condition_variable work_;
  std::deque<std::function<void()>> queue_;  // guarded by mutex_
  size_t alive_ = 0;                         // guarded by mutex_
  size_t idle_ = 0;                          // guarded by mutex_; waiting for a task
  size_t blocked_ = 0;                       // guarded by mutex_; in a Blocking scope
  size_t peak_ = 0;                          // guarded by mutex_
  bool stopping_ = false;                    // guarded by mutex_
  std::list<std::thread> threads_alive_;     // guarded by mutex_
  std::list<std::thread> threads_retired_;   // guarded by mutex_; exited, to be joined
};

}  // namespace collectived
