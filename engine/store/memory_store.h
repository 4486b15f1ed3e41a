// MemoryStore: the in-process Store (c10d's HashStore), used by the sidecar to serve the
// rendezvous Store API and by tests. Waiters are woken only by writes to the keys they wait
// on (per-key waiter lists); async waits are timed by one timer thread with a deadline queue.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/store/store.h"

namespace collectived {

// Thread-safety: safe for concurrent use from any number of threads without external
// synchronization (one mutex guards the data; each blocked waiter sleeps on its own condition
// variable). The destructor must not run concurrently with other calls; it completes every
// pending WaitAsync with Aborted (on the destroying thread) and joins the timer thread.
class MemoryStore final : public Store {
 public:
  // The most bytes (keys and values) a store holds by default: a client writing without end
  // gets ResourceExhausted instead of taking the sidecar's memory.
  static constexpr std::size_t kDefaultCapacityBytes = std::size_t{1} << 30;

  // Creates an empty store whose default timeout is kDefaultStoreTimeout, holding at most
  // `capacity_bytes` of keys and values: a write that would pass it fails with ResourceExhausted
  // and changes nothing. The timer thread is started by the first WaitAsync with a deadline.
  // Every timeout is read on `clock`, which must outlive the store.
  explicit MemoryStore(std::size_t capacity_bytes = kDefaultCapacityBytes,
                       Clock& clock = Clock::Real());
  ~MemoryStore() override;

 protected:
  Status DoSet(const std::string& key, std::string value) override;
  StatusOr<std::string> DoGet(const std::string& key, std::chrono::milliseconds timeout) override;
  StatusOr<std::int64_t> DoAdd(const std::string& key, std::int64_t delta) override;
  StatusOr<std::string> DoCompareSet(const std::string& key, const std::string& expected,
                                     std::string desired) override;
  Status DoWait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  StatusOr<bool> DoCheck(const std::vector<std::string>& keys) override;
  StatusOr<bool> DoDeleteKey(const std::string& key) override;
  // Visits every key: O(keys in the store).
  StatusOr<std::int64_t> DoDeletePrefix(const std::string& prefix) override;
  // Counts every key in this store.
  StatusOr<std::int64_t> DoNumKeys() override;
  StatusOr<std::vector<std::string>> DoMultiGet(const std::vector<std::string>& keys,
                                                std::chrono::milliseconds timeout) override;
  Status DoMultiSet(const std::vector<std::string>& keys, std::vector<std::string> values) override;
  Status DoAppend(const std::string& key, std::string_view value) override;
  WaitId DoWaitAsync(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                     WaitCallback done) override;
  bool DoCancelWait(WaitId id) override;

 private:
  // One blocked Wait/Get/MultiGet call or one pending WaitAsync.
  struct Waiter {
    std::vector<std::string> keys;  // what it waits for (may repeat keys); never changed
    // Keys whose waiter list holds this waiter (views of `keys`). Each was missing when
    // registered; a write that creates a key takes the whole list, so a registered key is
    // always a missing key, and the waiter need not look at its keys again until every
    // registered key has been created.
    std::unordered_set<std::string_view> registered;
    // Synchronous waiters: set (under mu_) when the last registered key was created; cv wakes
    // it.
    bool notified = false;
    std::condition_variable cv;
    // Asynchronous waiters only.
    bool is_async = false;
    WaitId id = kInvalidWaitId;
    WaitCallback done;
    std::chrono::milliseconds timeout{0};
    std::optional<Clock::TimePoint> deadline;
  };
  using WaiterPtr = std::shared_ptr<Waiter>;
  // Callbacks to run once mu_ is released.
  using Completions = std::vector<std::pair<WaitCallback, Status>>;

  // All below require mu_ held.
  bool HasKeyLocked(const std::string& key) const;
  // Accounts for `key` holding a value of `new_size` bytes instead of `old_size` (nullopt: the
  // key is absent before or after): ResourceExhausted, and no change, if the store would then
  // hold more than its capacity.
  Status ChargeLocked(const std::string& key, std::optional<std::size_t> old_size,
                      std::optional<std::size_t> new_size);
  // Whether `before` bytes of keys and values may become `after` within the capacity.
  bool FitsLocked(std::size_t before, std::size_t after) const;
  // ResourceExhausted for a write (`what`) that would make the store hold more than it may.
  Status CapacityErrorLocked(std::size_t after, const std::string& what) const;
  std::vector<std::string> MissingKeysLocked(const std::vector<std::string>& keys) const;
  // Registers `w` on each of its keys that is missing and not registered yet. Returns false
  // (registering nothing new) if no key of `w` is missing.
  bool RegisterMissingLocked(const WaiterPtr& w);
  // Removes `w` from the waiter lists of all keys it is registered on.
  void UnregisterLocked(const WaiterPtr& w);
  // Called after `key` went from missing to present: releases its waiters. Synchronous ones are
  // notified; satisfied async ones are removed and their callbacks appended to `out`.
  void KeyCreatedLocked(const std::string& key, Completions& out);
  // Removes a pending async waiter from every index and returns its callback.
  WaitCallback TakeAsyncLocked(const WaiterPtr& w);
  // Blocks on a synchronous waiter until all `keys` exist or the deadline passes. On success
  // returns OK with mu_ held and all keys present.
  Status BlockUntilPresentLocked(std::unique_lock<std::mutex>& lock,
                                 const std::vector<std::string>& keys,
                                 std::chrono::milliseconds timeout);
  void StartTimerLocked();
  // Makes the timer thread look at deadlines_ again.
  void WakeTimerLocked();
  void TimerLoop();

  static void RunCompletions(Completions& completions);

  Clock& clock_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, std::string> data_;
  const std::size_t capacity_bytes_;
  std::size_t used_bytes_ = 0;  // keys and values in data_
  std::unordered_map<std::string, std::unordered_set<WaiterPtr>> waiters_;  // by missing key
  std::unordered_map<WaitId, WaiterPtr> async_waiters_;  // pending WaitAsync calls
  WaitId next_wait_id_ = 1;
  // Deadlines of pending async waits, earliest first.
  std::set<std::pair<Clock::TimePoint, WaitId>> deadlines_;
  std::condition_variable timer_cv_;
  uint64_t timer_wakeups_ = 0;  // guarded by mu_: counts timer_cv_'s notifications
  bool stopping_ = false;
  std::thread timer_;
};

}  // namespace collectived
