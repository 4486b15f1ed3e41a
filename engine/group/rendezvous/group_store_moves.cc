// GroupRegistry: a shrinking group whose store is lost with its sidecar (docs/fault-tolerance.md,
// losing the store's sidecar). The group's MovableStore moves to the store of the lowest sidecar
// of the epoch that answers, the same on every survivor; the registry then arms the group's
// watches again there and reads the epoch's change records from the first. The loss itself is a
// sidecar loss, handled in the new store as any other (group_sidecar_loss.cc). A next epoch
// forming when the store is lost is not formed again in the new store (docs: its limits).
#include <string>
#include <vector>

#include "engine/group/rendezvous/group_registry.h"
#include "engine/group/rendezvous/group_registry_internal.h"
#include "engine/vocabulary/logging.h"

namespace collectived {

std::vector<MovableStore::Successor> GroupRegistry::StoreSuccessors(const Group& group) const {
  std::vector<MovableStore::Successor> successors;
  if (!options_.store_at) return successors;
  const GroupTopology& topology = group.topology();
  for (int node = 0; node < topology.node_count(); ++node) {
    const bool mine = node == topology.my_node;
    const std::string address = static_cast<size_t>(node) < topology.node_addresses.size()
                                    ? topology.node_addresses[node]
                                    : std::string();
    // A sidecar that announced no address is no successor, for its peers nor itself: every
    // sidecar's list must be the same.
    if (address.empty()) continue;
    successors.push_back(MovableStore::Successor{
        "sidecar " + topology.node_ids[node],
        [store_at = options_.store_at, address = mine ? std::string() : address] {
          return store_at(address);
        }});
  }
  return successors;
}

void GroupRegistry::MoveStoreIfLost(const std::weak_ptr<Runtime>& runtime,
                                    const std::shared_ptr<MovableStore>& movable, int generation,
                                    const Status& status) {
  if (!movable || status.kind() != ErrorKind::kUnavailable) return;
  std::shared_ptr<Runtime> alive = runtime.lock();
  if (!alive) return;
  // On the store's completion thread, which must not call a store: on the executor.
  alive->executor().Post([movable, generation] {
    Executor::Blocking blocking;  // probes of remote stores
    (void)movable->MoveOn(generation);
  });
}

void GroupRegistry::OnStoreMoved(const std::string& name, const std::weak_ptr<MovableStore>& weak,
                                 int generation, const std::string& to) {
  std::shared_ptr<MovableStore> movable = weak.lock();
  if (!movable) return;
  std::shared_ptr<Elastic> elastic;
  std::shared_ptr<Store> store;
  std::vector<WaitId> lost_watches;
  int epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || it->second.movable_store != movable || !it->second.elastic) return;
    Live& live = it->second;
    elastic = live.elastic;
    // Moved again since: that move arms the watches.
    if (elastic->phase == Elastic::Phase::kFailed || movable->generation() != generation) return;
    lost_watches = {live.failure_watch, live.roll_call_watch, elastic->loss_watch};
    store = live.store;
    epoch = elastic->view.epoch;
    elastic->store_generation = generation;
    elastic->losses_seen = 0;
    WatchPeers(live, elastic->EpochKeys(epoch));
    WatchLossesLocked(name, elastic);
  }
  for (WaitId watch : lost_watches) {
    if (watch != kInvalidWaitId) store->CancelWait(watch);
  }
  LogWarning("the store of a fault-tolerant group was lost: it goes on in a surviving sidecar's",
             {{"group", name},
              {"epoch", std::to_string(epoch)},
              {"store", to},
              {"moves", std::to_string(generation)}});
}

}  // namespace collectived
