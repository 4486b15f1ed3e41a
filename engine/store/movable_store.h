// MovableStore: a store that moves on to the next of its successors when the one it uses stops
// answering (Unavailable, and two probes of it 50 ms apart fail too), so that a shrinking group
// outlives the sidecar whose store it met in (docs/fault-tolerance.md, losing the store's
// sidecar).
//
// Every sidecar of a group holds one, with the same successors in the same order (the sidecars
// of the group's current epoch), so each moves to the first successor that answers it: the same
// one, the lowest live sidecar. A moved store starts empty of what the lost one held; the group
// takes it from there (its watches re-armed, a protocol step split by the move done again).
//
// A synchronous call that fails with Unavailable moves the store and runs again on the new one
// (a wait waits its whole timeout again). An asynchronous wait is not moved: it completes with
// the Unavailable of the store it waited on, and its owner arms it again (OnMoved tells when).
//
// Thread-safety: safe for concurrent use; moves are serialized.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/store/store.h"

namespace collectived {

// How many moves one call follows before it gives up with the last store's error.
inline constexpr int kMaxStoreMovesPerCall = 4;

class MovableStore final : public Store {
 public:
  struct Successor {
    std::string name;  // for logs and errors (a sidecar's id)
    // The store to move to; called only when it is tried.
    std::function<StatusOr<std::shared_ptr<Store>>()> resolve;
  };
  // Told of each move (after it, on the thread that moved, with no lock held): the new
  // generation (the first store's is 0) and the successor moved to.
  using MovedCallback = std::function<void(int generation, const std::string& to)>;

  // Uses `first` (named `first_name`) until it is lost. `probe_key`: a key whose Check tells
  // whether a store answers (its value does not matter). The pause between two probes is read
  // on `clock`, which must outlive the store.
  MovableStore(std::shared_ptr<Store> first, std::string first_name, std::string probe_key,
               Clock& clock = Clock::Real());
  ~MovableStore() override;

  // The stores to move to, in order; replaces the previous list.
  void SetSuccessors(std::vector<Successor> successors);
  void SetOnMoved(MovedCallback on_moved);

  // How many times the store moved.
  int generation() const;
  // The name of the store in use.
  std::string current_name() const;

  // The store of generation `from` failed a call: unless it moved since, or answers a probe
  // after all, moves to the first successor that answers. Returns whether the store in use now
  // is worth another try (it moved, or it answers); false when none answers.
  bool MoveOn(int from);

 protected:
  Status DoSet(const std::string& key, std::string value) override;
  StatusOr<std::string> DoGet(const std::string& key, std::chrono::milliseconds timeout) override;
  StatusOr<std::int64_t> DoAdd(const std::string& key, std::int64_t delta) override;
  StatusOr<std::string> DoCompareSet(const std::string& key, const std::string& expected,
                                     std::string desired) override;
  Status DoWait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  StatusOr<bool> DoCheck(const std::vector<std::string>& keys) override;
  StatusOr<bool> DoDeleteKey(const std::string& key) override;
  StatusOr<std::int64_t> DoDeletePrefix(const std::string& prefix) override;
  StatusOr<std::int64_t> DoNumKeys() override;
  StatusOr<std::vector<std::string>> DoMultiGet(const std::vector<std::string>& keys,
                                                std::chrono::milliseconds timeout) override;
  Status DoMultiSet(const std::vector<std::string>& keys, std::vector<std::string> values) override;
  Status DoAppend(const std::string& key, std::string_view value) override;
  WaitId DoWaitAsync(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                     WaitCallback done) override;
  bool DoCancelWait(WaitId id) override;

 private:
  struct Target {
    std::shared_ptr<Store> store;
    int generation = 0;
  };
  // A pending WaitAsync: which store holds it, under which id there.
  struct PendingWait {
    std::shared_ptr<Store> store;
    WaitId inner = kInvalidWaitId;
  };
  struct Waits {
    std::mutex mutex;
    std::map<WaitId, PendingWait> pending;
  };

  Target Current() const;
  // Runs `call` on the store in use, moving on and running it again while it fails with
  // Unavailable and a move helps.
  template <typename Call>
  auto Run(const Call& call) -> decltype(call(std::declval<Store&>()));
  // Whether `store` answers at all (anything but Unavailable).
  bool Answers(Store& store) const;

  const std::string probe_key_;
  Clock& clock_;
  mutable std::mutex mutex_;
  Target current_;                     // guarded by mutex_
  std::string current_name_;           // guarded by mutex_
  std::vector<Successor> successors_;  // guarded by mutex_
  MovedCallback on_moved_;             // guarded by mutex_
  std::mutex move_mutex_;              // one move at a time
  std::atomic<WaitId> next_wait_id_{1};
  const std::shared_ptr<Waits> waits_ = std::make_shared<Waits>();
};

}  // namespace collectived
