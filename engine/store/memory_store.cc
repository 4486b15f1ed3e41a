#include "engine/store/memory_store.h"

#include <charconv>
#include <string>
#include <system_error>
#include <utility>

namespace collectived {

// ---------------------------------------------------------------------------------------------
// Store (store.h): argument validation and messages shared by all implementations. It lives
// here because engine/store has no store.cc in its build.
// ---------------------------------------------------------------------------------------------

namespace {

constexpr std::size_t kMaxQuotedBytes = 128;  // longest key or value quoted in a message
constexpr std::size_t kMaxListedKeys = 8;     // most keys listed in one message

std::string Quote(std::string_view text) {
  if (text.size() <= kMaxQuotedBytes) return "'" + std::string(text) + "'";
  return "'" + std::string(text.substr(0, kMaxQuotedBytes)) + "...' (" +
         std::to_string(text.size()) + " bytes)";
}

// "key 'a'" or "keys ['a', 'b']", with at most kMaxListedKeys keys listed.
std::string ListKeys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (std::size_t i = 0; i < keys.size() && i < kMaxListedKeys; ++i) {
    if (i > 0) out += ", ";
    out += Quote(keys[i]);
  }
  if (keys.size() > kMaxListedKeys) {
    out += ", ... (" + std::to_string(keys.size() - kMaxListedKeys) + " more)";
  }
  return out + "]";
}

std::string DescribeKeys(const std::vector<std::string>& keys) {
  if (keys.size() == 1) return "key " + Quote(keys[0]);
  return "keys " + ListKeys(keys);
}

Status ValidateKey(const std::string& key) {
  if (key.empty()) return Status::InvalidArgument("invalid store key '': keys must not be empty");
  if (key.size() > kMaxKeyBytes) {
    return Status::InvalidArgument("invalid store key " + Quote(key) + ": " +
                                   std::to_string(key.size()) + " bytes, over the limit of " +
                                   std::to_string(kMaxKeyBytes) + " bytes");
  }
  return Status::Ok();
}

Status ValidateKeys(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) COLLECTIVED_RETURN_IF_ERROR(ValidateKey(key));
  return Status::Ok();
}

Status ValidateValue(const std::string& key, std::size_t size, std::string_view what = "value") {
  if (size > kMaxValueBytes) {
    return Status::InvalidArgument(std::string(what) + " for store key " + Quote(key) + " is " +
                                   std::to_string(size) + " bytes, over the limit of " +
                                   std::to_string(kMaxValueBytes) + " bytes (16 MiB)");
  }
  return Status::Ok();
}

Status ValidateTimeout(std::chrono::milliseconds timeout, const std::vector<std::string>& keys) {
  if (timeout < std::chrono::milliseconds::zero()) {
    return Status::InvalidArgument("invalid timeout of " + std::to_string(timeout.count()) +
                                   " ms for " + DescribeKeys(keys) +
                                   ": timeouts must not be negative (0 means no deadline)");
  }
  if (timeout > kMaxStoreTimeout) {
    return Status::InvalidArgument("absurd timeout of " + std::to_string(timeout.count()) +
                                   " ms for " + DescribeKeys(keys) + ": over the limit of " +
                                   std::to_string(kMaxStoreTimeout.count()) +
                                   " ms (7 days); use 0 for no deadline");
  }
  return Status::Ok();
}

}  // namespace

Store::~Store() = default;

std::string Store::QuoteKey(std::string_view key) {
  return Quote(key);
}

Status Store::TimeoutError(const std::vector<std::string>& keys,
                           const std::vector<std::string>& missing,
                           std::chrono::milliseconds timeout) {
  std::string message = "Timeout after " + std::to_string(timeout.count()) + " ms waiting for " +
                        DescribeKeys(keys) + " in store (" + std::to_string(missing.size()) +
                        " of " + std::to_string(keys.size()) + " keys missing";
  if (keys.size() > 1) message += ": " + ListKeys(missing);
  return Status::Timeout(message + ")");
}

std::chrono::milliseconds Store::default_timeout() const {
  return std::chrono::milliseconds(default_timeout_ms_.load(std::memory_order_relaxed));
}

Status Store::SetDefaultTimeout(std::chrono::milliseconds timeout) {
  if (timeout < std::chrono::milliseconds::zero() || timeout > kMaxStoreTimeout) {
    return Status::InvalidArgument("invalid default store timeout of " +
                                   std::to_string(timeout.count()) +
                                   " ms: must be between 0 (no deadline) and " +
                                   std::to_string(kMaxStoreTimeout.count()) + " ms (7 days)");
  }
  default_timeout_ms_.store(timeout.count(), std::memory_order_relaxed);
  return Status::Ok();
}

Status Store::Set(const std::string& key, std::string value) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateKey(key));
  COLLECTIVED_RETURN_IF_ERROR(ValidateValue(key, value.size()));
  return DoSet(key, std::move(value));
}

StatusOr<std::string> Store::Get(const std::string& key, StoreTimeout timeout) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateKey(key));
  const std::chrono::milliseconds resolved = timeout.value_or(default_timeout());
  COLLECTIVED_RETURN_IF_ERROR(ValidateTimeout(resolved, {key}));
  return DoGet(key, resolved);
}

StatusOr<std::int64_t> Store::Add(const std::string& key, std::int64_t delta) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateKey(key));
  return DoAdd(key, delta);
}

StatusOr<std::string> Store::CompareSet(const std::string& key, const std::string& expected,
                                        std::string desired) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateKey(key));
  COLLECTIVED_RETURN_IF_ERROR(ValidateValue(key, expected.size(), "expected value"));
  COLLECTIVED_RETURN_IF_ERROR(ValidateValue(key, desired.size(), "desired value"));
  return DoCompareSet(key, expected, std::move(desired));
}

Status Store::Wait(const std::vector<std::string>& keys, StoreTimeout timeout) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateKeys(keys));
  const std::chrono::milliseconds resolved = timeout.value_or(default_timeout());
  COLLECTIVED_RETURN_IF_ERROR(ValidateTimeout(resolved, keys));
  if (keys.empty()) return Status::Ok();
  return DoWait(keys, resolved);
}

StatusOr<bool> Store::Check(const std::vector<std::string>& keys) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateKeys(keys));
  if (keys.empty()) return true;
  return DoCheck(keys);
}

StatusOr<bool> Store::DeleteKey(const std::string& key) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateKey(key));
  return DoDeleteKey(key);
}

StatusOr<std::int64_t> Store::DeletePrefix(const std::string& prefix) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateKey(prefix));
  return DoDeletePrefix(prefix);
}

StatusOr<std::int64_t> Store::NumKeys() {
  return DoNumKeys();
}

StatusOr<std::vector<std::string>> Store::MultiGet(const std::vector<std::string>& keys,
                                                   StoreTimeout timeout) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateKeys(keys));
  const std::chrono::milliseconds resolved = timeout.value_or(default_timeout());
  COLLECTIVED_RETURN_IF_ERROR(ValidateTimeout(resolved, keys));
  if (keys.empty()) return std::vector<std::string>();
  return DoMultiGet(keys, resolved);
}

Status Store::MultiSet(const std::vector<std::string>& keys, std::vector<std::string> values) {
  if (keys.size() != values.size()) {
    return Status::InvalidArgument("MultiSet of " + DescribeKeys(keys) + " got " +
                                   std::to_string(keys.size()) + " keys but " +
                                   std::to_string(values.size()) + " values: the sizes must match");
  }
  for (std::size_t i = 0; i < keys.size(); ++i) {
    COLLECTIVED_RETURN_IF_ERROR(ValidateKey(keys[i]));
    COLLECTIVED_RETURN_IF_ERROR(ValidateValue(keys[i], values[i].size()));
  }
  if (keys.empty()) return Status::Ok();
  return DoMultiSet(keys, std::move(values));
}

Status Store::Append(const std::string& key, std::string_view value) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateKey(key));
  COLLECTIVED_RETURN_IF_ERROR(ValidateValue(key, value.size()));
  return DoAppend(key, value);
}

WaitId Store::WaitAsync(std::vector<std::string> keys, StoreTimeout timeout, WaitCallback done) {
  if (!done) done = [](Status) {};
  const std::chrono::milliseconds resolved = timeout.value_or(default_timeout());
  Status status = ValidateKeys(keys);
  if (status.ok()) status = ValidateTimeout(resolved, keys);
  if (!status.ok()) {
    done(std::move(status));
    return kInvalidWaitId;
  }
  if (keys.empty()) {
    done(Status::Ok());
    return kInvalidWaitId;
  }
  return DoWaitAsync(std::move(keys), resolved, std::move(done));
}

bool Store::CancelWait(WaitId id) {
  if (id == kInvalidWaitId) return false;
  return DoCancelWait(id);
}

// ---------------------------------------------------------------------------------------------
// MemoryStore
// ---------------------------------------------------------------------------------------------

MemoryStore::MemoryStore(std::size_t capacity_bytes, Clock& clock)
    : clock_(clock), capacity_bytes_(capacity_bytes) {}

Status MemoryStore::ChargeLocked(const std::string& key, std::optional<std::size_t> old_size,
                                 std::optional<std::size_t> new_size) {
  const std::size_t before = old_size ? key.size() + *old_size : 0;
  const std::size_t after = new_size ? key.size() + *new_size : 0;
  if (!FitsLocked(before, after)) return CapacityErrorLocked(after, "writing " + Quote(key));
  used_bytes_ = used_bytes_ - before + after;
  return Status::Ok();
}

bool MemoryStore::FitsLocked(std::size_t before, std::size_t after) const {
  return after <= before || after - before <= capacity_bytes_ - used_bytes_;
}

Status MemoryStore::CapacityErrorLocked(std::size_t after, const std::string& what) const {
  return Status::ResourceExhausted("the store holds " + std::to_string(used_bytes_) + " bytes in " +
                                   std::to_string(data_.size()) + " keys; " + what + " (" +
                                   std::to_string(after) + " bytes) would pass its capacity of " +
                                   std::to_string(capacity_bytes_) +
                                   " bytes (delete keys, or raise --store-max-bytes)");
}

MemoryStore::~MemoryStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();

  Completions completions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<WaiterPtr> pending;
    pending.reserve(async_waiters_.size());
    for (auto& [id, waiter] : async_waiters_) pending.push_back(waiter);
    for (const WaiterPtr& w : pending) {
      Status aborted =
          Status::Aborted("store destroyed while waiting for " + DescribeKeys(w->keys));
      completions.emplace_back(TakeAsyncLocked(w), std::move(aborted));
    }
  }
  RunCompletions(completions);
}

void MemoryStore::RunCompletions(Completions& completions) {
  for (auto& [done, status] : completions) {
    if (done) done(std::move(status));
  }
  completions.clear();
}

bool MemoryStore::HasKeyLocked(const std::string& key) const {
  return data_.count(key) != 0;
}

std::vector<std::string> MemoryStore::MissingKeysLocked(
    const std::vector<std::string>& keys) const {
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    if (!HasKeyLocked(key)) missing.push_back(key);
  }
  return missing;
}

bool MemoryStore::RegisterMissingLocked(const WaiterPtr& w) {
  bool any_missing = false;
  for (const std::string& key : w->keys) {
    if (HasKeyLocked(key)) continue;
    any_missing = true;
    if (w->registered.insert(std::string_view(key)).second) waiters_[key].insert(w);
  }
  return any_missing;
}

void MemoryStore::UnregisterLocked(const WaiterPtr& w) {
  for (std::string_view key : w->registered) {
    auto it = waiters_.find(std::string(key));
    if (it == waiters_.end()) continue;
    it->second.erase(w);
    if (it->second.empty()) waiters_.erase(it);
  }
  w->registered.clear();
}

void MemoryStore::KeyCreatedLocked(const std::string& key, Completions& out) {
  auto it = waiters_.find(key);
  if (it == waiters_.end()) return;
  std::unordered_set<WaiterPtr> list = std::move(it->second);
  waiters_.erase(it);
  for (const WaiterPtr& w : list) {
    w->registered.erase(std::string_view(key));
    // A waiter still registered on another key waits for that key: it cannot be satisfied
    // yet, so neither wake it nor look at its other keys (with many waiters on many keys, as in
    // a rendezvous of R ranks on R keys, that would be R checks per waiter per write).
    if (!w->registered.empty()) continue;
    if (!w->is_async) {
      w->notified = true;
      w->cv.notify_one();
      continue;
    }
    // Satisfied when every key exists; otherwise it registers on the missing ones (keys that
    // were deleted after it last saw them).
    if (!RegisterMissingLocked(w)) out.emplace_back(TakeAsyncLocked(w), Status::Ok());
  }
}

WaitCallback MemoryStore::TakeAsyncLocked(const WaiterPtr& w) {
  UnregisterLocked(w);
  async_waiters_.erase(w->id);
  if (w->deadline) deadlines_.erase({*w->deadline, w->id});
  return std::move(w->done);
}

Status MemoryStore::BlockUntilPresentLocked(std::unique_lock<std::mutex>& lock,
                                            const std::vector<std::string>& keys,
                                            std::chrono::milliseconds timeout) {
  auto w = std::make_shared<Waiter>();
  w->keys = keys;
  const Clock::TimePoint deadline =
      timeout == kNoTimeout ? Clock::TimePoint::max() : clock_.After(timeout);
  // Each round registers on the keys still missing and sleeps until all of them have been
  // created; then it looks again, since a key can be deleted after the write that created it.
  while (RegisterMissingLocked(w)) {
    w->notified = false;
    auto notified = [&w] { return w->notified; };
    if (!clock_.WaitUntil(w->cv, lock, deadline, notified)) {
      std::vector<std::string> missing = MissingKeysLocked(keys);
      UnregisterLocked(w);
      if (missing.empty()) return Status::Ok();
      return TimeoutError(keys, missing, timeout);
    }
  }
  UnregisterLocked(w);
  return Status::Ok();
}

Status MemoryStore::DoSet(const std::string& key, std::string value) {
  Completions completions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    COLLECTIVED_RETURN_IF_ERROR(ChargeLocked(
        key, it == data_.end() ? std::nullopt : std::optional(it->second.size()), value.size()));
    if (data_.insert_or_assign(key, std::move(value)).second) KeyCreatedLocked(key, completions);
  }
  RunCompletions(completions);
  return Status::Ok();
}

StatusOr<std::string> MemoryStore::DoGet(const std::string& key,
                                         std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it != data_.end()) return it->second;
  COLLECTIVED_RETURN_IF_ERROR(BlockUntilPresentLocked(lock, {key}, timeout));
  return data_.at(key);
}

StatusOr<std::int64_t> MemoryStore::DoAdd(const std::string& key, std::int64_t delta) {
  Completions completions;
  std::int64_t result = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    std::int64_t current = 0;
    if (it != data_.end() && !it->second.empty()) {
      const std::string& text = it->second;
      const char* end = text.data() + text.size();
      auto [ptr, ec] = std::from_chars(text.data(), end, current);
      if (ec != std::errc() || ptr != end) {
        return Status::InvalidArgument("cannot add to store key " + Quote(key) + ": its value " +
                                       Quote(text) + " is not a decimal int64 integer");
      }
    }
    if (__builtin_add_overflow(current, delta, &result)) {
      return Status::InvalidArgument("cannot add " + std::to_string(delta) + " to store key " +
                                     Quote(key) + ": " + std::to_string(current) +
                                     " + delta overflows int64");
    }
    std::string text = std::to_string(result);
    COLLECTIVED_RETURN_IF_ERROR(ChargeLocked(
        key, it == data_.end() ? std::nullopt : std::optional(it->second.size()), text.size()));
    if (it == data_.end()) {
      data_.emplace(key, std::move(text));
      KeyCreatedLocked(key, completions);
    } else {
      it->second = std::move(text);
    }
  }
  RunCompletions(completions);
  return result;
}

StatusOr<std::string> MemoryStore::DoCompareSet(const std::string& key, const std::string& expected,
                                                std::string desired) {
  Completions completions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      if (!expected.empty()) return expected;
      COLLECTIVED_RETURN_IF_ERROR(ChargeLocked(key, std::nullopt, desired.size()));
      data_.emplace(key, desired);
      KeyCreatedLocked(key, completions);
    } else {
      if (it->second != expected) return it->second;
      COLLECTIVED_RETURN_IF_ERROR(ChargeLocked(key, it->second.size(), desired.size()));
      it->second = desired;
    }
  }
  RunCompletions(completions);
  return desired;
}

Status MemoryStore::DoWait(const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return BlockUntilPresentLocked(lock, keys, timeout);
}

StatusOr<bool> MemoryStore::DoCheck(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& key : keys) {
    if (!HasKeyLocked(key)) return false;
  }
  return true;
}

StatusOr<bool> MemoryStore::DoDeleteKey(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  (void)ChargeLocked(key, it->second.size(), std::nullopt);  // frees: cannot fail
  data_.erase(it);
  return true;
}

StatusOr<std::int64_t> MemoryStore::DoDeletePrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  std::int64_t deleted = 0;
  for (auto it = data_.begin(); it != data_.end();) {
    if (it->first.compare(0, prefix.size(), prefix) == 0) {
      (void)ChargeLocked(it->first, it->second.size(), std::nullopt);  // frees: cannot fail
      it = data_.erase(it);
      ++deleted;
    } else {
      ++it;
    }
  }
  return deleted;
}

StatusOr<std::int64_t> MemoryStore::DoNumKeys() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<std::int64_t>(data_.size());
}

StatusOr<std::vector<std::string>> MemoryStore::DoMultiGet(const std::vector<std::string>& keys,
                                                           std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  COLLECTIVED_RETURN_IF_ERROR(BlockUntilPresentLocked(lock, keys, timeout));
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) values.push_back(data_.at(key));
  return values;
}

Status MemoryStore::DoMultiSet(const std::vector<std::string>& keys,
                               std::vector<std::string> values) {
  Completions completions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // All or nothing: the batch's size is checked before anything is written (a key may repeat
    // in it; its last value is the one that stays).
    std::unordered_map<std::string_view, std::size_t> final_sizes;
    for (std::size_t i = 0; i < keys.size(); ++i) final_sizes[keys[i]] = values[i].size();
    std::size_t before = 0, after = 0;
    for (const auto& [key, size] : final_sizes) {
      auto it = data_.find(std::string(key));
      if (it != data_.end()) before += key.size() + it->second.size();
      after += key.size() + size;
    }
    if (!FitsLocked(before, after)) {
      return CapacityErrorLocked(after, "a multi_set of " + std::to_string(keys.size()) + " keys");
    }
    used_bytes_ = used_bytes_ - before + after;
    std::vector<const std::string*> created;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (data_.insert_or_assign(keys[i], std::move(values[i])).second) {
        created.push_back(&keys[i]);
      }
    }
    // Wake only after every key is written, so no waiter sees part of the batch.
    for (const std::string* key : created) KeyCreatedLocked(*key, completions);
  }
  RunCompletions(completions);
  return Status::Ok();
}

Status MemoryStore::DoAppend(const std::string& key, std::string_view value) {
  Completions completions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = data_.find(key);
    if (it == data_.end()) {
      COLLECTIVED_RETURN_IF_ERROR(ChargeLocked(key, std::nullopt, value.size()));
      data_.emplace(key, std::string(value));
      KeyCreatedLocked(key, completions);
    } else {
      COLLECTIVED_RETURN_IF_ERROR(
          ValidateValue(key, it->second.size() + value.size(), "appended value"));
      COLLECTIVED_RETURN_IF_ERROR(
          ChargeLocked(key, it->second.size(), it->second.size() + value.size()));
      it->second.append(value);
    }
  }
  RunCompletions(completions);
  return Status::Ok();
}

WaitId MemoryStore::DoWaitAsync(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                                WaitCallback done) {
  auto w = std::make_shared<Waiter>();
  w->keys = std::move(keys);
  w->is_async = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (RegisterMissingLocked(w)) {
      w->id = next_wait_id_++;
      w->done = std::move(done);
      w->timeout = timeout;
      async_waiters_.emplace(w->id, w);
      if (timeout != kNoTimeout) {
        w->deadline = clock_.After(timeout);
        auto pos = deadlines_.insert({*w->deadline, w->id}).first;
        StartTimerLocked();
        if (pos == deadlines_.begin()) WakeTimerLocked();  // a new earliest deadline
      }
      return w->id;
    }
  }
  done(Status::Ok());  // every key already exists
  return kInvalidWaitId;
}

bool MemoryStore::DoCancelWait(WaitId id) {
  WaitCallback done;
  std::vector<std::string> keys;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = async_waiters_.find(id);
    if (it == async_waiters_.end()) return false;
    WaiterPtr w = it->second;
    keys = w->keys;
    done = TakeAsyncLocked(w);
  }
  if (done) done(Status::Aborted("wait for " + DescribeKeys(keys) + " in store was cancelled"));
  return true;
}

void MemoryStore::StartTimerLocked() {
  if (!timer_.joinable()) timer_ = std::thread([this] { TimerLoop(); });
}

void MemoryStore::WakeTimerLocked() {
  ++timer_wakeups_;
  timer_cv_.notify_all();
}

void MemoryStore::TimerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    // Until the earliest deadline (none: until woken), a new earliest deadline or the stop.
    const Clock::TimePoint first =
        deadlines_.empty() ? Clock::TimePoint::max() : deadlines_.begin()->first;
    const uint64_t wakeups = timer_wakeups_;
    if (clock_.Now() < first) {
      clock_.WaitUntil(timer_cv_, lock, first,
                       [&] { return stopping_ || timer_wakeups_ != wakeups; });
      continue;
    }
    Completions completions;
    const Clock::TimePoint now = clock_.Now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      WaiterPtr w = async_waiters_.at(deadlines_.begin()->second);
      Status timeout = TimeoutError(w->keys, MissingKeysLocked(w->keys), w->timeout);
      completions.emplace_back(TakeAsyncLocked(w), std::move(timeout));
    }
    lock.unlock();
    RunCompletions(completions);
    lock.lock();
  }
}

}  // namespace collectived
