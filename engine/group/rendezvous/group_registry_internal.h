// What the parts of GroupRegistry share (group_registry.cc, group_rendezvous.cc,
// group_epochs.cc): an incarnation being formed (Forming), a shrinking group's epochs (Elastic)
// and a destroyed group parked until it is quiescent (Parking). Internal to the registry.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "engine/concurrency/activity_count.h"
#include "engine/concurrency/executor.h"
#include "engine/group/core/group.h"
#include "engine/group/rendezvous/epoch_view.h"
#include "engine/group/rendezvous/group_keys.h"
#include "engine/group/rendezvous/group_registry.h"
#include "engine/store/store.h"

namespace collectived {

// How long a sidecar waits for every sidecar of a shrinking group's epoch to take part in a
// change (announce its part in the next epoch, say how far it got after a sidecar loss). Live
// sidecars do within milliseconds; one that does not is gone.
inline constexpr std::chrono::milliseconds kEpochFormBudget{30000};
// How long a read of a record that is known to be there may take.
inline constexpr std::chrono::milliseconds kRecordReadBudget{2000};

// "1,3,4": ranks or sidecar indices, in log fields and messages.
inline std::string JoinRanks(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) text += (text.empty() ? "" : ",") + std::to_string(rank);
  return text;
}

// Sets `group_rank`'s incarnation counter in `store` to the incarnation of `keys`, unless it holds
// a count (a moved store lacks the counters; a joiner that counted itself there keeps its count).
inline Status SeedIncarnationCounter(Store& store, const JoinRequest& request,
                                     const GroupKeys& keys, int group_rank) {
  return store
      .CompareSet(GroupKeys::IncarnationCounter(request.store_prefix, request.name, group_rank), "",
                  std::to_string(keys.incarnation()))
      .status();
}

// Waits for `keys` like Store::Wait within `budget`, in waits of at most `slice`, and ends early
// (with a Timeout) as soon as `stop` says so between two of them.
Status WaitInSlices(Store& store, const std::vector<std::string>& keys,
                    std::chrono::milliseconds budget, std::chrono::milliseconds slice,
                    const std::function<bool()>& stop);

// How often a protocol step runs at most (AgainIfMoved).
inline constexpr int kStepRuns = 3;
// Runs a protocol step of several store calls, and runs it again, whole, while the group's store
// moved (MovableStore) during it: a move splits its calls between two stores. `step(generation,
// moved)` gets the store's generation when it began and whether the store moved since. A group
// whose store cannot move (null) runs it once.
template <typename Step>
auto AgainIfMoved(const std::shared_ptr<MovableStore>& movable, const Step& step) {
  for (int run = 1;; ++run) {
    const int generation = movable ? movable->generation() : 0;
    const std::function<bool()> moved = [&] {
      return movable && movable->generation() != generation;
    };
    auto result = step(generation, moved);
    if (!moved() || run == kStepRuns) return result;
  }
}

struct GroupRegistry::Forming {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool started = false;
  bool done = false;
  Status status;
  Formed formed;
};

// A shrinking group's chain of epochs, as this sidecar follows it (group_epochs.cc). Guarded by
// the registry's mutex.
struct GroupRegistry::Elastic {
  enum class Phase {
    kSteady,    // ops go to the current epoch
    kRetiring,  // a rank was lost: ops up to the cut finish in this epoch, later ones queue
    kForming,   // retired here: the next epoch is being formed, ops queue
    kDraining,  // the next epoch is installed: what queued is submitted to it, ops still queue
    kFailed,    // the group could not go on: every op fails with `failure`
  };
  struct Queued {
    int group_rank = 0;
    OpRequest request;
    std::shared_ptr<Work> work;
    // Taken back from that epoch, translated for it (RetranslateForEpoch); null: as issued.
    std::shared_ptr<const EpochView> from;
  };

  explicit Elastic(GroupKeys incarnation) : keys(std::move(incarnation)) {}

  JoinRequest request;       // the first local rank's (store signed with the token, if any)
  GroupKeys keys;            // the incarnation's: epoch 0's
  std::vector<int> members;  // the group's global ranks, for ever
  EpochView view;            // the current epoch
  bool whole = true;         // no rank of the group lost (view.whole())
  Phase phase = Phase::kSteady;
  uint64_t cut = 0;  // kRetiring: the lowest cut of the losses seen
  // kDraining: the lowest cut of the losses of the new epoch seen meanwhile; it retires at it
  // once the queue is drained.
  std::optional<uint64_t> deferred_cut;
  int64_t losses_seen = 0;  // loss records of the current epoch read so far
  // The store's generation (MovableStore) the loss records are read from: a moved store numbers
  // the epoch's records from 1 again.
  int store_generation = 0;
  WaitId loss_watch = kInvalidWaitId;
  std::deque<Queued> queued;               // kRetiring (past the cut), kForming: in issue order
  std::set<int> lost_here;                 // local group ranks lost
  std::set<int> announced;                 // kForming: the local ranks announced for the next epoch
  std::vector<int> lost_after_announcing;  // to report lost in the next epoch once it formed
  std::string cause;                       // of the first loss of the current epoch
  Status failure;                          // kFailed
  bool dropped_out = false;  // no rank of this sidecar is in the group's epochs any more
  // Of the current epoch: the lost group ranks whose replacement waits (kJoining records), and
  // the replacements admitted, by the cut they were admitted after (kAdmitted records).
  std::set<int> joining;
  std::map<uint64_t, std::vector<int>> admissions;
  std::vector<int> joined;         // the group ranks the current epoch took back in (sorted)
  bool accepts_published = false;  // GroupKeys::AcceptsReplacements set by this sidecar
  // The current epoch froze after the loss of peer sidecars: its cut is the lowest point the
  // survivors' data phases reached (AgreeSidecarCut), not a lost rank's.
  bool sidecar_cut = false;

  GroupKeys EpochKeys(int epoch) const { return epoch == 0 ? keys : keys.Epoch(epoch); }
};

struct GroupRegistry::Parking {
  std::shared_ptr<ActivityCount> parked;  // one activity while this group is parked
  std::mutex mutex;
  std::shared_ptr<Group> group;  // guarded by mutex: set once destroyed, held until quiescent
  std::shared_ptr<Store> store;  // guarded by mutex: where its keys go once it is (null: kept)
  std::string keys_base;
  int sidecars = 0;

  // On the executor, once the group is quiescent: the group goes (nothing works for it any more,
  // so its destructor returns at once), then its keys (a store call: it may block).
  void Release() {
    std::shared_ptr<Group> released;
    std::shared_ptr<Store> keys_store;
    {
      std::lock_guard<std::mutex> lock(mutex);
      released = std::move(group);
      keys_store = std::move(store);
    }
    if (!released) return;
    released.reset();
    if (keys_store) {
      Executor::Blocking blocking;
      RemoveKeysOnceAllLeft(*keys_store, keys_base, sidecars);
    }
    parked->Exit();
  }
};

}  // namespace collectived
