// GroupRegistry: a shrinking group whose store is lost with its sidecar (docs/fault-tolerance.md,
// losing the store's sidecar). The group's MovableStore moves to the store of the lowest sidecar
// of the epoch that answers, the same on every survivor; the registry then arms the group's
// watches again there and reads the epoch's change records from the first. The loss itself is a
// sidecar loss, handled in the new store as any other (group_sidecar_loss.cc). A next epoch
// forming when the store is lost is not formed again in the new store (docs: its limits). Every
// survivor writes into the new store what a replacement reads of the group, so that one started
// later finds it there (through the group's address list, store_addresses.h).
#include <string>
#include <vector>

#include "engine/group/rendezvous/group_records.h"
#include "engine/group/rendezvous/group_registry.h"
#include "engine/group/rendezvous/group_registry_internal.h"
#include "engine/group/rendezvous/job_token.h"
#include "engine/vocabulary/logging.h"

namespace collectived {

std::vector<MovableStore::Successor> GroupRegistry::StoreSuccessors(
    const std::vector<std::string>& fallbacks, const Group* group) const {
  std::vector<MovableStore::Successor> successors;
  if (!options_.store_at) return successors;
  for (const std::string& address : fallbacks) {
    successors.push_back(MovableStore::Successor{
        "store " + address, [store_at = options_.store_at, address] { return store_at(address); }});
  }
  if (!group) return successors;
  const GroupTopology& topology = group->topology();
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
  std::shared_ptr<Group> group;
  std::vector<WaitId> lost_watches;
  std::vector<int> local_ranks;
  bool accepts = false;
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
    group = live.group;
    local_ranks.assign(live.local_ranks.begin(), live.local_ranks.end());
    accepts = elastic->accepts_published;
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
  if (!group) return;
  Executor::Blocking blocking;  // the new store may be another sidecar's
  Status carried = CarryIntoMovedStore(*elastic, *group, local_ranks, accepts);
  if (!carried.ok()) {
    LogWarning(
        "cannot carry a fault-tolerant group's keys into its moved store: a replacement "
        "may not find it there",
        {{"group", name}, {"store", to}, {"error", carried.message()}});
  }
}

Status GroupRegistry::CarryIntoMovedStore(const Elastic& elastic, const Group& group,
                                          const std::vector<int>& local_ranks, bool accepts) const {
  const JoinRequest& request = elastic.request;
  Store& store = *request.store;  // signs what it sets when the group has a token
  const std::string& prefix = request.store_prefix;
  const std::string& name = request.name;
  const EpochView& view = elastic.view;
  // The token first: a rank 0 that came first into an empty store would fix its own.
  COLLECTIVED_RETURN_IF_ERROR(
      store
          .CompareSet(GroupKeys::TokenCommitment(prefix, name), "",
                      JobTokenCommitment(request.job_token, GroupKeys::TokenScope(prefix, name)))
          .status());
  for (int group_rank : local_ranks) {
    COLLECTIVED_RETURN_IF_ERROR(SeedIncarnationCounter(store, request, elastic.keys, group_rank));
  }
  for (int group_rank : view.Lost()) {
    COLLECTIVED_RETURN_IF_ERROR(SeedIncarnationCounter(store, request, elastic.keys, group_rank));
    COLLECTIVED_RETURN_IF_ERROR(
        store.Set(elastic.keys.LostRank(group_rank), std::to_string(view.epoch)));
  }
  if (accepts) COLLECTIVED_RETURN_IF_ERROR(store.Set(elastic.keys.AcceptsReplacements(), "1"));
  if (view.epoch == 0) return Status::Ok();  // epoch 0's records are not read by a replacement
  // The epoch's records as its formation published them (PublishEpoch): the same bytes on every
  // survivor, so their writes agree.
  const GroupKeys keys = elastic.EpochKeys(view.epoch);
  const GroupTopology& topology = group.topology();
  GroupMembership membership;
  membership.sidecar_ids = topology.node_ids;
  membership.admin_addresses = topology.node_addresses;
  membership.sidecar_of_rank = topology.node_of_rank;
  COLLECTIVED_RETURN_IF_ERROR(store.Set(keys.EpochMembers(), EncodeRankList(group.spec().members)));
  COLLECTIVED_RETURN_IF_ERROR(store.Set(keys.Membership(), EncodeMembership(membership)));
  // The current epoch only where no later one was published yet: a survivor that carries late
  // must not take it back (each sidecar forms the next epoch only after its own carry, on the
  // same serialized epoch tasks, so the next one needs every carry done).
  StatusOr<bool> published = store.Check({elastic.keys.CurrentEpoch()});
  if (!published.ok()) return published.status();
  if (!*published) {
    COLLECTIVED_RETURN_IF_ERROR(store.Set(elastic.keys.CurrentEpoch(), std::to_string(view.epoch)));
  }
  return Status::Ok();
}

}  // namespace collectived
