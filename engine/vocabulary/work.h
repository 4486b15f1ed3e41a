// Work, Future and Promise: the completion handles the engine returns for every collective.
// A Promise completes a shared Future with a value or an error; a Work wraps the Future of one
// op with its description (group, op, sequence number), its deadline and its timings.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/vocabulary/status.h"

namespace collectived {

template <typename T>
class Future;
template <typename T>
class Promise;

namespace internal {

// What a Future<T> stores: T itself, or std::monostate for Future<void>.
template <typename T>
using FutureValue = std::conditional_t<std::is_void_v<T>, std::monostate, T>;

// now + timeout on the steady clock, saturating at time_point::max() (which means "never").
// A negative timeout is treated as zero.
std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::milliseconds timeout);

// Prints "collectived: contract violation: <what>" to stderr and aborts. Used for programming
// errors only (e.g. reading the value of a failed future), never for run-time failures.
[[noreturn]] void ContractViolation(const char* what, const Status& status = Status());

// The state shared by a Promise and all copies of its Future.
template <typename T>
class FutureState {
 public:
  using Callback = std::function<void(const Status&)>;

  bool IsReady() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }

  // Blocks until completed or until `deadline` of `clock` (time_point::max() = forever).
  // Returns whether the state is completed.
  bool WaitUntil(std::chrono::steady_clock::time_point deadline,
                 const Clock& clock = Clock::Real()) const {
    std::unique_lock<std::mutex> lock(mu_);
    return clock.WaitUntil(cv_, lock, deadline, [this] { return done_; });
  }

  // OK while pending or after success; the error after a failure.
  Status status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }

  // Returns the stored value, or nullptr while pending or after a failure. The value is never
  // modified after completion, so the reference stays valid as long as the state lives.
  const FutureValue<T>* value() const {
    std::lock_guard<std::mutex> lock(mu_);
    return value_.has_value() ? &*value_ : nullptr;
  }

  // Completes with `value` (status empty) or with `status` (non-OK). The first completion wins;
  // later ones return false and change nothing. Callbacks run on this thread, in the order they
  // were added, after the lock is released.
  bool Complete(Status status, std::optional<FutureValue<T>> value) {
    std::vector<Callback> callbacks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (done_) return false;
      done_ = true;
      status_ = std::move(status);
      value_ = std::move(value);
      callbacks.swap(callbacks_);
    }
    cv_.notify_all();
    for (Callback& callback : callbacks) Invoke(callback);
    return true;
  }

  void AddCallback(Callback callback) {
    if (!callback) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!done_) {
        callbacks_.push_back(std::move(callback));
        return;
      }
    }
    Invoke(callback);
  }

 private:
  // Runs outside the lock. `status_` is immutable once done_ is set, so passing it by
  // reference is safe. noexcept: an exception escaping a callback terminates the process.
  void Invoke(Callback& callback) noexcept { callback(status_); }

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;                    // guarded by mu_
  Status status_;                        // guarded by mu_; immutable once done_
  std::optional<FutureValue<T>> value_;  // guarded by mu_; immutable once done_
  std::vector<Callback> callbacks_;      // guarded by mu_; emptied on completion
};

// Maps the return type R of a Then() continuation to the value type of the Future it returns:
// void and Status give Future<void>, StatusOr<V> gives Future<V>, anything else Future<R>.
template <typename R>
struct ThenValue {
  using type = R;
};
template <>
struct ThenValue<Status> {
  using type = void;
};
template <typename V>
struct ThenValue<StatusOr<V>> {
  using type = V;
};

template <typename T, typename F>
struct ThenResult {
  using type = std::remove_cvref_t<std::invoke_result_t<F&, const T&>>;
};
template <typename F>
struct ThenResult<void, F> {
  using type = std::remove_cvref_t<std::invoke_result_t<F&>>;
};

}  // namespace internal

// A handle to the eventual outcome of an operation: a value of type T (nothing for
// Future<void>) or a non-OK Status. Futures are created by a Promise (or by MakeReadyFuture /
// MakeFailedFuture); copies share one state, and that state lives as long as any handle.
//
// Thread-safety: all methods may be called concurrently from any thread on the same or on
// different copies. Assigning to one Future object while another thread uses that same object
// is not safe (as for std::shared_ptr).
template <typename T>
class Future {
  static_assert(!std::is_reference_v<T>, "Future<T&> is not supported");

 public:
  using ValueType = internal::FutureValue<T>;

  // Returns true once the future has completed, successfully or not. Never blocks.
  bool IsReady() const { return state_->IsReady(); }

  // Blocks until the future completes. Returns OK if it completed with a value, and the
  // operation's error if it failed.
  Status Wait() const {
    state_->WaitUntil(std::chrono::steady_clock::time_point::max());
    return state_->status();
  }

  // Blocks until the future completes or `timeout` has passed, whichever comes first.
  // Returns OK if it completed with a value, the operation's error if it failed, and a
  // Timeout status ("Timeout: future Timed out after N ms: ...") if the timeout passed
  // first; the operation itself is not cancelled and may still complete later.
  // A negative timeout is treated as zero (a poll).
  Status Wait(std::chrono::milliseconds timeout) const {
    if (state_->WaitUntil(internal::DeadlineAfter(timeout))) return state_->status();
    return Status::Timeout("Timeout: future Timed out after " + std::to_string(timeout.count()) +
                           " ms: it did not complete");
  }

  // Like Wait(timeout), with an absolute deadline (time_point::max() means no deadline). The
  // Timeout message is "Timeout: future Timed out: it did not complete before its deadline".
  Status WaitUntil(std::chrono::steady_clock::time_point deadline,
                   const Clock& clock = Clock::Real()) const {
    if (state_->WaitUntil(deadline, clock)) return state_->status();
    return Status::Timeout("Timeout: future Timed out: it did not complete before its deadline");
  }

  // Returns the error once the future has failed, and OK otherwise (while pending too). Use
  // IsReady() to tell "pending" from "succeeded". Never blocks.
  Status status() const { return state_->status(); }

  // Returns the value of a future that completed successfully. The reference stays valid as
  // long as any handle to this future exists; the value never changes once set.
  // REQUIRES: IsReady() && status().ok(); aborts the process otherwise (a programming error).
  const ValueType& value() const requires(!std::is_void_v<T>) {
    const ValueType* value = state_->value();
    if (value == nullptr) {
      internal::ContractViolation("Future::value() called on a pending or failed future",
                                  state_->status());
    }
    return *value;
  }

  // Arranges for `callback(status)` to run exactly once with the completion status (OK on
  // success). If the future has already completed, the callback runs at once on the calling
  // thread before AddCallback returns. Otherwise it runs on the thread that completes the
  // future, after all callbacks added before it, and after waiters have been woken.
  // Callbacks are never invoked while an internal lock is held, so they may call back into
  // this future (IsReady, status, value, AddCallback, Wait). They should be short and must
  // not throw: an exception escaping a callback terminates the process. An empty callback is
  // ignored. Note: a callback added (on another thread) just after completion runs at once on
  // its own thread and may overlap callbacks still running on the completing thread; ordering
  // is guaranteed among the callbacks that were added before completion.
  void AddCallback(std::function<void(const Status&)> callback) const {
    state_->AddCallback(std::move(callback));
  }

  // Returns a future for the result of running `fn` on this future's value once it succeeds:
  // fn(const T&) for Future<T>, fn() for Future<void>. fn runs where an AddCallback callback
  // would run. If this future fails, fn is not called and the returned future fails with the
  // same status. fn may return:
  //   void            -> Future<void>, completed OK;
  //   Status          -> Future<void>, completed with that status;
  //   StatusOr<V>     -> Future<V>, completed with the value or the error;
  //   any other V     -> Future<V>, completed with the value.
  // An exception thrown by fn fails the returned future with an Internal error.
  template <typename F>
  auto Then(F fn) const
      -> Future<typename internal::ThenValue<typename internal::ThenResult<T, F>::type>::type>;

 private:
  friend class Promise<T>;
  explicit Future(std::shared_ptr<internal::FutureState<T>> state) : state_(std::move(state)) {}

  std::shared_ptr<internal::FutureState<T>> state_;  // never null
};

// The producer side of a Future: completes it exactly once with a value or an error.
// Move-only. Destroying a Promise that has not completed its future fails the future with an
// Internal error ("promise abandoned ..."), so no waiter blocks forever.
//
// Thread-safety: SetValue/SetError/future() may be called concurrently from any thread (the
// first completion wins). Moving, assigning or destroying a Promise must not race with other
// calls on that same Promise object.
template <typename T>
class Promise {
 public:
  using ValueType = internal::FutureValue<T>;

  // Creates a promise with a pending future.
  Promise() : state_(std::make_shared<internal::FutureState<T>>()) {}

  Promise(const Promise&) = delete;
  Promise& operator=(const Promise&) = delete;
  Promise(Promise&& other) noexcept = default;
  Promise& operator=(Promise&& other) noexcept {
    if (this != &other) {
      Abandon();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  ~Promise() { Abandon(); }

  // Returns a handle to the future this promise completes; may be called any number of times.
  // REQUIRES: *this has not been moved from.
  Future<T> future() const { return Future<T>(CheckedState()); }

  // Completes the future successfully with `value` (nothing for Promise<void>), wakes all
  // waiters and runs the pending callbacks on this thread. Returns true if this call completed
  // the future, false if it had already been completed (the call is then ignored).
  // REQUIRES: *this has not been moved from.
  bool SetValue(ValueType value) requires(!std::is_void_v<T>) {
    return CheckedState()->Complete(Status(), std::move(value));
  }
  bool SetValue() requires std::is_void_v<T> {
    return CheckedState()->Complete(Status(), std::monostate());
  }

  // Completes the future with the error `status`, wakes all waiters and runs the pending
  // callbacks on this thread. Returns true if this call completed the future, false if it had
  // already been completed (the call is then ignored). Passing an OK status is a programming
  // error; the future then fails with an Internal error saying so.
  // REQUIRES: *this has not been moved from.
  bool SetError(Status status) {
    if (status.ok()) status = Status::Internal("Promise::SetError called with an OK status");
    return CheckedState()->Complete(std::move(status), std::nullopt);
  }

  // Returns true once the future has completed. REQUIRES: *this has not been moved from.
  bool IsReady() const { return CheckedState()->IsReady(); }

 private:
  const std::shared_ptr<internal::FutureState<T>>& CheckedState() const {
    if (state_ == nullptr) internal::ContractViolation("use of a moved-from Promise");
    return state_;
  }
  void Abandon() {
    if (state_ != nullptr && !state_->IsReady()) {
      state_->Complete(
          Status::Internal("promise abandoned: its producer was destroyed without completing it"),
          std::nullopt);
    }
  }

  std::shared_ptr<internal::FutureState<T>> state_;  // null only when moved from
};

// Returns a future that has already completed with `value`.
template <typename T>
Future<T> MakeReadyFuture(T value) {
  Promise<T> promise;
  promise.SetValue(std::move(value));
  return promise.future();
}

// Returns a Future<void> that has already completed successfully.
inline Future<void> MakeReadyFuture() {
  Promise<void> promise;
  promise.SetValue();
  return promise.future();
}

// Returns a future that has already failed with `status` (an OK status becomes Internal).
template <typename T>
Future<T> MakeFailedFuture(Status status) {
  Promise<T> promise;
  promise.SetError(std::move(status));
  return promise.future();
}

template <typename T>
template <typename F>
auto Future<T>::Then(F fn) const
    -> Future<typename internal::ThenValue<typename internal::ThenResult<T, F>::type>::type> {
  using R = typename internal::ThenResult<T, F>::type;
  using U = typename internal::ThenValue<R>::type;
  // std::function needs a copyable callable, so the child promise is shared by the callback.
  // Capturing state_ makes a cycle (state -> callback -> state) that completion breaks, and the
  // Promise guarantees completion (abandoning completes too).
  auto child = std::make_shared<Promise<U>>();
  Future<U> result = child->future();
  AddCallback([state = state_, child, fn = std::move(fn)](const Status& status) mutable {
    if (!status.ok()) {
      child->SetError(status);
      return;
    }
    try {
      auto call = [&]() -> decltype(auto) {
        if constexpr (std::is_void_v<T>) {
          return fn();
        } else {
          return fn(*state->value());
        }
      };
      if constexpr (std::is_void_v<R>) {
        call();
        child->SetValue();
      } else if constexpr (std::is_same_v<R, Status>) {
        Status s = call();
        if (s.ok()) {
          child->SetValue();
        } else {
          child->SetError(std::move(s));
        }
      } else if constexpr (std::is_same_v<R, StatusOr<U>>) {
        R r = call();
        if (r.ok()) {
          child->SetValue(std::move(r).value());
        } else {
          child->SetError(r.status());
        }
      } else {
        child->SetValue(call());
      }
    } catch (const std::exception& e) {
      child->SetError(
          Status::Internal(std::string("exception in Future::Then callback: ") + e.what()));
    } catch (...) {
      child->SetError(Status::Internal("unknown exception in Future::Then callback"));
    }
  });
  return result;
}

// What a Work is about: the group, the op and the op's sequence number in that group.
struct OpInfo {
  std::string group;
  std::string op;
  uint64_t sequence_number = 0;

  // "allreduce (seq 12) on group 'g'", for messages.
  std::string Describe() const;
};

// When a Work was created, started running and finished (success or failure). started and
// finished are empty until MarkStarted() / Complete() have been called.
struct WorkTimes {
  std::chrono::steady_clock::time_point created;
  std::optional<std::chrono::steady_clock::time_point> started;
  std::optional<std::chrono::steady_clock::time_point> finished;
};

// The handle of one collective op (like c10d's Work). The engine creates it, calls
// MarkStarted() when the op begins moving data and Complete() exactly once when it ends;
// callers wait on it, poll it, or attach callbacks.
//
// Every op has a timeout, measured from the Work's creation: Wait() without an explicit timeout
// returns a Timeout error once that deadline has passed. Waiting never completes or cancels the
// op; failing a stuck op is the engine's job (e.g. Complete(TimeoutError(timeout()))).
//
// Thread-safety: a Work is safe for concurrent use from any number of threads without external
// synchronization. It is neither copyable nor movable; share it through std::shared_ptr.
class Work {
 public:
  // A timeout that never expires.
  static constexpr std::chrono::milliseconds kNoTimeout = std::chrono::milliseconds::max();

  // Creates a pending Work for `info` whose deadline is now + `timeout` (kNoTimeout: none;
  // a negative timeout is treated as zero), timed by `clock` (which must outlive the Work).
  Work(OpInfo info, std::chrono::milliseconds timeout, const Clock& clock = Clock::Real());

  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // If the Work was never completed, fails its future with an Internal error
  // ("promise abandoned: <op> was destroyed before it completed") so that holders of
  // future() do not block forever.
  ~Work();

  const OpInfo& info() const { return info_; }
  // The op's own timeout, as given to the constructor.
  std::chrono::milliseconds timeout() const { return timeout_; }
  // created + timeout (time_point::max() for kNoTimeout).
  std::chrono::steady_clock::time_point deadline() const { return deadline_; }

  // Returns true once the op has completed, successfully or not. Never blocks.
  bool IsCompleted() const { return future_.IsReady(); }

  // Blocks until the op completes or a timeout passes. Without `timeout`, waits until the
  // op's deadline (creation + timeout()); with it, waits at most `timeout` from now (instead
  // of the op's deadline). Returns OK if the op succeeded, its error if it failed, and
  // otherwise a Timeout status whose message names the op, e.g.
  // "Timeout: allreduce (seq 12) on group 'g' Timed out after 1000 ms: it did not complete".
  // A timed-out wait does not complete the op; a later Wait may still succeed.
  Status Wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const;

  // Returns the op's error once it has failed, and OK otherwise (pending or succeeded).
  // Never blocks.
  Status status() const { return future_.status(); }
  // Same as status(); named after c10d's Work::exception().
  Status exception() const { return status(); }

  // The future of the op's completion; completes at the same moment as the Work.
  Future<void> future() const { return future_; }

  // Same contract as Future::AddCallback: runs `callback(status)` exactly once, at once if
  // already completed, otherwise on the completing thread, in the order added, never under
  // a lock; must not throw.
  void AddCallback(std::function<void(const Status&)> callback) const {
    future_.AddCallback(std::move(callback));
  }

  // Snapshot of the op's timings (steady clock). `finished` is recorded just before the
  // future completes, so callbacks and returning waiters always see it set (a concurrent
  // poller may briefly see it set while IsCompleted() is still false).
  WorkTimes times() const;

  // Returns the Timeout status this Work reports after `waited`:
  // "Timeout: <Describe()> Timed out after <waited> ms: it did not complete" (c10d's " Timed out "
  // wording, which scripts match). The engine may complete a stuck op with it so that every
  // waiter sees the same message.
  Status TimeoutError(std::chrono::milliseconds waited) const;

  // A recv's sender: the group rank its data came from, or -1 (not a recv, or not matched yet).
  // Set by the engine before Complete, so callbacks and returning waiters see it.
  int source_rank() const;
  void SetSourceRank(int group_rank);

  // Where a collective ran: its sequence number, the membership epoch of a shrinking group it
  // ran in (docs/fault-tolerance.md) and that epoch's first sequence number (0, 0 and 1 until
  // the engine took the op; an op taken back and run again in the next epoch is stamped again).
  // A step whose first op precedes the epoch of its last one ran in more than one membership.
  struct EpochStamp {
    uint64_t sequence_number = 0;
    int epoch = 0;
    uint64_t epoch_first_sequence_number = 1;
  };
  EpochStamp epoch_stamp() const;
  void SetEpochStamp(EpochStamp stamp);

  // Engine side. Records the time the op started moving data. Only the first call has an
  // effect; calls after completion are ignored.
  void MarkStarted();

  // Engine side. Completes the op: successfully if `status` is OK, with that error otherwise.
  // Records the finish time, wakes all waiters and runs the callbacks on this thread.
  // Returns true if this call completed the op, false if it had already been completed
  // (the call is then ignored).
  bool Complete(Status status);

 private:
  const OpInfo info_;
  const std::chrono::milliseconds timeout_;
  const Clock& clock_;
  const std::chrono::steady_clock::time_point created_;
  const std::chrono::steady_clock::time_point deadline_;
  Promise<void> promise_;
  const Future<void> future_;

  mutable std::mutex mu_;
  std::optional<std::chrono::steady_clock::time_point> started_;   // guarded by mu_
  std::optional<std::chrono::steady_clock::time_point> finished_;  // guarded by mu_
  int source_rank_ = -1;                                           // guarded by mu_
  EpochStamp epoch_stamp_;                                         // guarded by mu_
};

}  // namespace collectived
