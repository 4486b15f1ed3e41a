// Store: the rendezvous key-value interface of collectived, with the semantics of PyTorch
// c10d's Store (set, get, add, compare_set, wait, check, delete_key, num_keys, multi_get,
// multi_set, append) plus an asynchronous wait that does not hold a thread while blocked.
//
// Keys and values are byte strings (std::string may hold any bytes). Numbers written by Add
// are stored as decimal text, as in c10d, so Get after Add(key, 5) returns "5".
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/vocabulary/status.h"

namespace collectived {

// Longest key accepted by any store, in bytes.
inline constexpr std::size_t kMaxKeyBytes = 4096;
// Largest value accepted by any store, in bytes (also the limit for the result of Append).
inline constexpr std::size_t kMaxValueBytes = 16 * 1024 * 1024;
// A timeout of zero means "no deadline" (c10d's kNoTimeout).
inline constexpr std::chrono::milliseconds kNoTimeout{0};
// The default timeout of a new store (c10d's default of 300 s).
inline constexpr std::chrono::milliseconds kDefaultStoreTimeout{std::chrono::seconds(300)};
// Longest timeout accepted; anything longer is rejected as absurd (use kNoTimeout instead).
inline constexpr std::chrono::milliseconds kMaxStoreTimeout{std::chrono::hours(24 * 7)};

// A timeout argument: std::nullopt means "the store's default timeout" (see
// Store::default_timeout), kNoTimeout (0 ms) means "wait forever", anything else is the
// longest time to wait, measured from the call.
using StoreTimeout = std::optional<std::chrono::milliseconds>;

// Identifies one pending WaitAsync call of one store; never reused by that store.
using WaitId = std::uint64_t;
// Returned by WaitAsync when `done` already ran before it returned; CancelWait(kInvalidWaitId)
// returns false.
inline constexpr WaitId kInvalidWaitId = 0;

// Completion callback of WaitAsync; see WaitAsync for when and where it runs.
using WaitCallback = std::function<void(Status)>;

// The abstract store. The public methods validate their arguments (and resolve the default
// timeout) once, here, and then call the protected Do* methods that implementations provide,
// so every implementation reports invalid input with the same messages.
//
// Validation errors (all InvalidArgument, with a message naming the key): an empty key, a key
// longer than kMaxKeyBytes, a value longer than kMaxValueBytes, a negative timeout, a timeout
// longer than kMaxStoreTimeout, MultiSet with different numbers of keys and values.
//
// Thread-safety: every method of every Store in collectived is safe to call concurrently from
// many threads without external synchronization; implementations must keep it that way.
class Store {
 public:
  Store() = default;
  virtual ~Store();

  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Sets `key` to `value`, creating or overwriting it, and releases waiters on `key`.
  // Returns OK, or InvalidArgument for a bad key or value.
  Status Set(const std::string& key, std::string value);

  // Returns the value of `key`, blocking until the key exists. Returns Timeout if it does not
  // exist before the timeout passes; the message contains "Timeout", the timeout and the key,
  // e.g. "Timeout after 1000 ms waiting for key 'foo' in store (1 of 1 keys missing)".
  StatusOr<std::string> Get(const std::string& key, StoreTimeout timeout = std::nullopt);

  // Atomically adds `delta` to the integer stored at `key` and returns the new value. A
  // missing (or empty, as in c10d) value counts as 0, so Add creates the key. The value is
  // stored as decimal text. Returns InvalidArgument naming the key if the current value is not
  // a decimal integer or the sum overflows int64. Releases waiters on `key` when it creates it.
  StatusOr<std::int64_t> Add(const std::string& key, std::int64_t delta);

  // Atomic compare-and-set with c10d's exact semantics; returns:
  //   key missing, `expected` empty      -> sets `desired`, returns `desired`;
  //   key missing, `expected` non-empty  -> sets nothing, returns `expected`;
  //   key present and equal to expected  -> sets `desired`, returns `desired`;
  //   key present and different          -> sets nothing, returns the current value.
  // Returns InvalidArgument for a bad key or value.
  StatusOr<std::string> CompareSet(const std::string& key, const std::string& expected,
                                   std::string desired);

  // Blocks until every key in `keys` exists at the same moment (an empty list is satisfied at
  // once). Returns OK, Timeout (naming the keys and how many are missing) or InvalidArgument.
  Status Wait(const std::vector<std::string>& keys, StoreTimeout timeout = std::nullopt);

  // Returns whether every key in `keys` exists right now (true for an empty list); never waits.
  // Returns InvalidArgument for a bad key.
  StatusOr<bool> Check(const std::vector<std::string>& keys);

  // Deletes `key`. Returns whether it existed, or InvalidArgument for a bad key.
  StatusOr<bool> DeleteKey(const std::string& key);

  // Deletes every key that starts with `prefix` (a key itself: not empty) and returns how many
  // there were. Waiters are not released. Returns InvalidArgument for a bad prefix. Not part of
  // c10d: the sidecars use it to remove a destroyed group's keys.
  StatusOr<std::int64_t> DeletePrefix(const std::string& prefix);

  // Returns the number of keys in the store. See each implementation for what it counts
  // (PrefixStore counts the keys of the whole underlying store, as c10d does).
  StatusOr<std::int64_t> NumKeys();

  // Waits until all `keys` exist (as Wait) and returns their values, in the order of `keys`,
  // read atomically at one moment. Returns Timeout or InvalidArgument as Wait does.
  StatusOr<std::vector<std::string>> MultiGet(const std::vector<std::string>& keys,
                                              StoreTimeout timeout = std::nullopt);

  // Sets keys[i] to values[i] for all i, atomically: a waiter or reader sees either none or all
  // of the new values. Returns InvalidArgument if the sizes differ or any key or value is bad
  // (then nothing is set). A key listed twice takes its last value.
  Status MultiSet(const std::vector<std::string>& keys, std::vector<std::string> values);

  // Appends `value` to the value of `key`, creating the key if it is missing, and releases
  // waiters on `key` when it creates it. Returns InvalidArgument for a bad key or value or if
  // the result would be longer than kMaxValueBytes (then nothing changes).
  Status Append(const std::string& key, std::string_view value);

  // Asynchronous Wait: arranges for `done` to be called exactly once with
  //   OK                when all `keys` exist (as in Wait);
  //   Timeout           when the timeout passes first (same message as Wait);
  //   Aborted           when CancelWait(id) cancels it, or the store is destroyed first;
  //   InvalidArgument   when the arguments are bad.
  // No thread is blocked while the wait is pending. `done` runs on whichever thread completes
  // the wait: inline, before WaitAsync returns, when the keys already exist or the arguments
  // are bad (then WaitAsync returns kInvalidWaitId); otherwise on the thread whose write made
  // the last key exist, on the store's timer thread, or on the thread calling CancelWait. It
  // may therefore run before WaitAsync has returned the id to the caller. `done` is never
  // called with a store lock held, so it may call back into the store, but it must not throw
  // and should not block (it delays the writer or the timer of the store).
  // An empty `done` is replaced by a no-op. Returns the id to pass to CancelWait.
  WaitId WaitAsync(std::vector<std::string> keys, StoreTimeout timeout, WaitCallback done);

  // Cancels a pending WaitAsync. Returns true if this call cancelled it: then `done` has been
  // called with an Aborted status, on this thread, before CancelWait returns, and will never be
  // called again. Returns false if `id` is unknown or the wait has already completed (its
  // `done` has run or is running on another thread right now; CancelWait does not wait for it).
  bool CancelWait(WaitId id);

  // Sets the timeout used when a call passes std::nullopt. kNoTimeout means wait forever.
  // Returns InvalidArgument for a negative timeout or one longer than kMaxStoreTimeout.
  Status SetDefaultTimeout(std::chrono::milliseconds timeout);

  // Returns the timeout used when a call passes std::nullopt (initially kDefaultStoreTimeout).
  std::chrono::milliseconds default_timeout() const;

 protected:
  // Implementations. Arguments are already validated; `timeout` is resolved (never nullopt,
  // never negative, never over kMaxStoreTimeout; kNoTimeout means wait forever). They have the
  // contracts of the public methods of the same name.
  virtual Status DoSet(const std::string& key, std::string value) = 0;
  virtual StatusOr<std::string> DoGet(const std::string& key,
                                      std::chrono::milliseconds timeout) = 0;
  virtual StatusOr<std::int64_t> DoAdd(const std::string& key, std::int64_t delta) = 0;
  virtual StatusOr<std::string> DoCompareSet(const std::string& key, const std::string& expected,
                                             std::string desired) = 0;
  virtual Status DoWait(const std::vector<std::string>& keys,
                        std::chrono::milliseconds timeout) = 0;
  virtual StatusOr<bool> DoCheck(const std::vector<std::string>& keys) = 0;
  virtual StatusOr<bool> DoDeleteKey(const std::string& key) = 0;
  virtual StatusOr<std::int64_t> DoDeletePrefix(const std::string& prefix) = 0;
  virtual StatusOr<std::int64_t> DoNumKeys() = 0;
  virtual StatusOr<std::vector<std::string>> DoMultiGet(const std::vector<std::string>& keys,
                                                        std::chrono::milliseconds timeout) = 0;
  virtual Status DoMultiSet(const std::vector<std::string>& keys,
                            std::vector<std::string> values) = 0;
  virtual Status DoAppend(const std::string& key, std::string_view value) = 0;
  virtual WaitId DoWaitAsync(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                             WaitCallback done) = 0;
  virtual bool DoCancelWait(WaitId id) = 0;

  // Returns the c10d-style timeout message shared by all implementations, e.g.
  // "Timeout after 1000 ms waiting for key 'foo' in store (1 of 1 keys missing)".
  // `missing` lists the keys of `keys` that did not exist when the deadline passed.
  static Status TimeoutError(const std::vector<std::string>& keys,
                             const std::vector<std::string>& missing,
                             std::chrono::milliseconds timeout);

  // Returns `key` quoted and shortened for an error message ("'foo'", or the first bytes of a
  // long key followed by "...' (5000 bytes)").
  static std::string QuoteKey(std::string_view key);

 private:
  std::atomic<std::int64_t> default_timeout_ms_{kDefaultStoreTimeout.count()};
};

}  // namespace collectived
