// SeverableStore: a store that can die as a sidecar's does when its process is killed: from
// Sever() on, every call fails with Unavailable and every pending wait completes with it, as a
// remote store's calls do once its sidecar is gone. For the tests of MovableStore and of groups
// that lose the sidecar whose store they meet in (movable_store_test.cc,
// group_sidecar_loss_test.cc).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/store/memory_store.h"
#include "engine/store/store.h"

namespace collectived {
namespace store_testing {

class SeverableStore final : public Store {
 public:
  SeverableStore() = default;
  ~SeverableStore() override = default;

  // The store's sidecar dies.
  void Sever() {
    std::set<WaitId> pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      severed_ = true;
      pending.swap(pending_);
    }
    for (WaitId id : pending) inner_.CancelWait(id);  // their callbacks report Unavailable
  }

 protected:
  Status DoSet(const std::string& key, std::string value) override {
    COLLECTIVED_RETURN_IF_ERROR(Alive());
    return inner_.Set(key, std::move(value));
  }
  StatusOr<std::string> DoGet(const std::string& key, std::chrono::milliseconds timeout) override {
    COLLECTIVED_RETURN_IF_ERROR(BlockUntilPresent({key}, timeout));
    return inner_.Get(key, std::chrono::milliseconds(1000));
  }
  StatusOr<std::int64_t> DoAdd(const std::string& key, std::int64_t delta) override {
    COLLECTIVED_RETURN_IF_ERROR(Alive());
    return inner_.Add(key, delta);
  }
  StatusOr<std::string> DoCompareSet(const std::string& key, const std::string& expected,
                                     std::string desired) override {
    COLLECTIVED_RETURN_IF_ERROR(Alive());
    return inner_.CompareSet(key, expected, std::move(desired));
  }
  // A blocked wait returns Unavailable at once when the store is severed, as a remote store's.
  Status DoWait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    return BlockUntilPresent(keys, timeout);
  }
  StatusOr<bool> DoCheck(const std::vector<std::string>& keys) override {
    COLLECTIVED_RETURN_IF_ERROR(Alive());
    return inner_.Check(keys);
  }
  StatusOr<bool> DoDeleteKey(const std::string& key) override {
    COLLECTIVED_RETURN_IF_ERROR(Alive());
    return inner_.DeleteKey(key);
  }
  StatusOr<std::int64_t> DoDeletePrefix(const std::string& prefix) override {
    COLLECTIVED_RETURN_IF_ERROR(Alive());
    return inner_.DeletePrefix(prefix);
  }
  StatusOr<std::int64_t> DoNumKeys() override {
    COLLECTIVED_RETURN_IF_ERROR(Alive());
    return inner_.NumKeys();
  }
  StatusOr<std::vector<std::string>> DoMultiGet(const std::vector<std::string>& keys,
                                                std::chrono::milliseconds timeout) override {
    COLLECTIVED_RETURN_IF_ERROR(BlockUntilPresent(keys, timeout));
    return inner_.MultiGet(keys, std::chrono::milliseconds(1000));
  }
  Status DoMultiSet(const std::vector<std::string>& keys,
                    std::vector<std::string> values) override {
    COLLECTIVED_RETURN_IF_ERROR(Alive());
    return inner_.MultiSet(keys, std::move(values));
  }
  Status DoAppend(const std::string& key, std::string_view value) override {
    COLLECTIVED_RETURN_IF_ERROR(Alive());
    return inner_.Append(key, value);
  }
  WaitId DoWaitAsync(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                     WaitCallback done) override {
    if (Status alive = Alive(); !alive.ok()) {
      done(alive);
      return kInvalidWaitId;
    }
    const WaitId id =
        inner_.WaitAsync(std::move(keys), timeout, [this, done = std::move(done)](Status status) {
          done(severed() ? Lost() : std::move(status));
        });
    if (id == kInvalidWaitId) return id;
    // A Sever between the inner wait and here did not see its id: cancelled now.
    bool severed_now = false;
    {
      std::lock_guard<std::mutex> state(mutex_);
      if (severed_) {
        severed_now = true;
      } else {
        pending_.insert(id);
      }
    }
    if (severed_now) inner_.CancelWait(id);
    return id;
  }
  bool DoCancelWait(WaitId id) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending_.erase(id);
    }
    return inner_.CancelWait(id);
  }

 private:
  // Waits as Store::Wait does, through an asynchronous wait that Sever completes.
  Status BlockUntilPresent(const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout) {
    struct Outcome {
      std::mutex mutex;
      std::condition_variable done;
      std::optional<Status> status;
    };
    auto outcome = std::make_shared<Outcome>();
    DoWaitAsync(keys, timeout, [outcome](Status status) {
      std::lock_guard<std::mutex> lock(outcome->mutex);
      outcome->status = std::move(status);
      outcome->done.notify_all();
    });
    std::unique_lock<std::mutex> lock(outcome->mutex);
    outcome->done.wait(lock, [&] { return outcome->status.has_value(); });
    return *outcome->status;
  }
  static Status Lost() {
    return Status::Unavailable("the store's sidecar is gone (a severed test store)");
  }
  bool severed() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return severed_;
  }
  Status Alive() const { return severed() ? Lost() : Status::Ok(); }

  MemoryStore inner_;
  mutable std::mutex mutex_;
  bool severed_ = false;  // guarded by mutex_
  // Guarded by mutex_: the waits not cancelled (some may have completed: cancelling those does
  // nothing).
  std::set<WaitId> pending_;
};

}  // namespace store_testing
}  // namespace collectived
