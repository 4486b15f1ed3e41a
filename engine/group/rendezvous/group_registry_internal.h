// What the parts of GroupRegistry share (group_registry.cc, group_rendezvous.cc): an incarnation
// being formed (Forming) and a destroyed group parked until it is quiescent (Parking). Internal
// to the registry.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "engine/concurrency/activity_count.h"
#include "engine/concurrency/executor.h"
#include "engine/group/core/group.h"
#include "engine/group/rendezvous/group_registry.h"
#include "engine/store/store.h"

namespace collectived {

struct GroupRegistry::Forming {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool started = false;
  bool done = false;
  Status status;
  Formed formed;
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
