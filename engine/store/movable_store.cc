#include "engine/store/movable_store.h"

#include <chrono>
#include <utility>

namespace collectived {
namespace {

// Between the two probes of a store that failed a call.
constexpr std::chrono::milliseconds kProbeInterval{50};

ErrorKind KindOf(const Status& status) {
  return status.kind();
}
template <typename T>
ErrorKind KindOf(const StatusOr<T>& result) {
  return result.status().kind();
}

}  // namespace

MovableStore::MovableStore(std::shared_ptr<Store> first, std::string first_name,
                           std::string probe_key, Clock& clock)
    : probe_key_(std::move(probe_key)),
      clock_(clock),
      current_{std::move(first), 0},
      current_name_(std::move(first_name)) {
  (void)SetDefaultTimeout(current_.store->default_timeout());
}

MovableStore::~MovableStore() {
  std::map<WaitId, PendingWait> pending;
  {
    std::lock_guard<std::mutex> lock(waits_->mutex);
    pending.swap(waits_->pending);
  }
  for (auto& [id, wait] : pending) {
    if (wait.inner != kInvalidWaitId) wait.store->CancelWait(wait.inner);
  }
}

void MovableStore::SetSuccessors(std::vector<Successor> successors) {
  std::lock_guard<std::mutex> lock(mutex_);
  successors_ = std::move(successors);
}

void MovableStore::SetOnMoved(MovedCallback on_moved) {
  std::lock_guard<std::mutex> lock(mutex_);
  on_moved_ = std::move(on_moved);
}

int MovableStore::generation() const {
  return Current().generation;
}

std::string MovableStore::current_name() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_name_;
}

MovableStore::Target MovableStore::Current() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

bool MovableStore::Answers(Store& store) const {
  return store.Check({probe_key_}).status().kind() != ErrorKind::kUnavailable;
}

bool MovableStore::MoveOn(int from) {
  std::unique_lock<std::mutex> moving(move_mutex_);
  std::shared_ptr<Store> lost;
  std::vector<Successor> successors;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (current_.generation != from) return true;  // another call moved it already
    lost = current_.store;
    successors = successors_;
  }
  // Probed twice, apart: a store that answers either time is there (a passing failure), and one
  // sidecar must not leave a store its peers still use.
  if (Answers(*lost)) return true;
  clock_.SleepFor(kProbeInterval);
  if (Answers(*lost)) return true;
  for (const Successor& successor : successors) {
    StatusOr<std::shared_ptr<Store>> store = successor.resolve();
    if (!store.ok() || *store == lost || !Answers(**store)) continue;
    MovedCallback on_moved;
    int generation = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      current_ = Target{*store, current_.generation + 1};
      current_name_ = successor.name;
      generation = current_.generation;
      on_moved = on_moved_;
    }
    moving.unlock();  // the callback runs with no lock held
    if (on_moved) on_moved(generation, successor.name);
    return true;
  }
  return false;
}

template <typename Call>
auto MovableStore::Run(const Call& call) -> decltype(call(std::declval<Store&>())) {
  for (int moves = 0;; ++moves) {
    const Target target = Current();
    auto result = call(*target.store);
    if (KindOf(result) != ErrorKind::kUnavailable || moves == kMaxStoreMovesPerCall ||
        !MoveOn(target.generation)) {
      return result;
    }
  }
}

Status MovableStore::DoSet(const std::string& key, std::string value) {
  return Run([&](Store& store) { return store.Set(key, value); });
}

StatusOr<std::string> MovableStore::DoGet(const std::string& key,
                                          std::chrono::milliseconds timeout) {
  return Run([&](Store& store) { return store.Get(key, timeout); });
}

StatusOr<std::int64_t> MovableStore::DoAdd(const std::string& key, std::int64_t delta) {
  return Run([&](Store& store) { return store.Add(key, delta); });
}

StatusOr<std::string> MovableStore::DoCompareSet(const std::string& key,
                                                 const std::string& expected, std::string desired) {
  return Run([&](Store& store) { return store.CompareSet(key, expected, desired); });
}

Status MovableStore::DoWait(const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) {
  return Run([&](Store& store) { return store.Wait(keys, timeout); });
}

StatusOr<bool> MovableStore::DoCheck(const std::vector<std::string>& keys) {
  return Run([&](Store& store) { return store.Check(keys); });
}

StatusOr<bool> MovableStore::DoDeleteKey(const std::string& key) {
  return Run([&](Store& store) { return store.DeleteKey(key); });
}

StatusOr<std::int64_t> MovableStore::DoDeletePrefix(const std::string& prefix) {
  return Run([&](Store& store) { return store.DeletePrefix(prefix); });
}

StatusOr<std::int64_t> MovableStore::DoNumKeys() {
  return Run([&](Store& store) { return store.NumKeys(); });
}

StatusOr<std::vector<std::string>> MovableStore::DoMultiGet(const std::vector<std::string>& keys,
                                                            std::chrono::milliseconds timeout) {
  return Run([&](Store& store) { return store.MultiGet(keys, timeout); });
}

Status MovableStore::DoMultiSet(const std::vector<std::string>& keys,
                                std::vector<std::string> values) {
  return Run([&](Store& store) { return store.MultiSet(keys, values); });
}

Status MovableStore::DoAppend(const std::string& key, std::string_view value) {
  return Run([&](Store& store) { return store.Append(key, value); });
}

WaitId MovableStore::DoWaitAsync(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                                 WaitCallback done) {
  const Target target = Current();
  const WaitId id = next_wait_id_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(waits_->mutex);
    waits_->pending[id] = PendingWait{target.store, kInvalidWaitId};
  }
  const WaitId inner = target.store->WaitAsync(
      std::move(keys), timeout,
      [waits = std::weak_ptr<Waits>(waits_), id, done = std::move(done)](Status status) {
        if (auto alive = waits.lock()) {
          std::lock_guard<std::mutex> lock(alive->mutex);
          alive->pending.erase(id);
        }
        done(std::move(status));
      });
  std::lock_guard<std::mutex> lock(waits_->mutex);
  auto it = waits_->pending.find(id);
  if (inner == kInvalidWaitId) {
    if (it != waits_->pending.end()) waits_->pending.erase(it);
    return kInvalidWaitId;  // done ran already
  }
  if (it != waits_->pending.end()) it->second.inner = inner;
  return id;
}

bool MovableStore::DoCancelWait(WaitId id) {
  PendingWait wait;
  {
    std::lock_guard<std::mutex> lock(waits_->mutex);
    auto it = waits_->pending.find(id);
    if (it == waits_->pending.end() || it->second.inner == kInvalidWaitId) return false;
    wait = it->second;
  }
  return wait.store->CancelWait(wait.inner);
}

}  // namespace collectived
