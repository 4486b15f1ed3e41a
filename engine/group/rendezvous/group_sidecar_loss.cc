// GroupRegistry: a shrinking group that loses a peer sidecar (docs/fault-tolerance.md, losing a
// sidecar). The sidecar that finds the loss tells the others (a kSidecarsLost record); each
// survivor freezes its epoch (Group::Freeze), publishes the last op whose data phase it finished,
// and once every survivor did retires the epoch at the lowest of them (Group::RetireFrozen): the
// ops up to it finished everywhere and are handed out, the later ones run again in the next
// epoch from their kept inputs. The lowest survivor announces the lost sidecars' part in the next
// epoch (no live rank) in their place, so that the epoch forms as after a lost trainer
// (group_epochs.cc).
#include <algorithm>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "engine/group/rendezvous/group_records.h"
#include "engine/group/rendezvous/group_registry.h"
#include "engine/group/rendezvous/group_registry_internal.h"
#include "engine/vocabulary/logging.h"

namespace collectived {
void GroupRegistry::OnSidecarsLost(const std::string& name, int epoch,
                                   const std::vector<int>& lost_nodes, const Status& why) {
  std::shared_ptr<Elastic> elastic;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || !it->second.elastic || it->second.elastic->view.epoch != epoch) return;
    elastic = it->second.elastic;
    if (elastic->sidecar_cut || elastic->phase == Elastic::Phase::kFailed) return;
  }
  std::vector<int> sorted = lost_nodes;
  std::sort(sorted.begin(), sorted.end());
  ChangeRecord change;
  change.kind = ChangeRecord::Kind::kSidecarsLost;
  change.joiners = sorted;
  change.cause = why.message();
  Status published = PublishChange(*elastic, epoch, change);
  if (!published.ok()) {
    FailTransition(name, elastic,
                   Status::PeerLost(why.message() + " (and the loss could not be published: " +
                                    published.message() + ")"));
    return;
  }
  StartSidecarCut(name, elastic, epoch, sorted, why.message());
}

void GroupRegistry::StartSidecarCut(const std::string& name,
                                    const std::shared_ptr<Elastic>& elastic, int epoch,
                                    const std::vector<int>& lost_nodes, const std::string& cause) {
  std::shared_ptr<Group> group;
  std::string lost_ids;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || it->second.elastic != elastic || elastic->view.epoch != epoch) return;
    if (elastic->sidecar_cut) return;  // learned here and from a record: once
    switch (elastic->phase) {
      case Elastic::Phase::kFailed:
        return;
      case Elastic::Phase::kForming:
        // Retired here already at a lost rank's cut: the next epoch's formation leaves out the
        // sidecars that neither announce their part nor answer (ReplaceSilentSidecars).
        return;
      case Elastic::Phase::kSteady:
      case Elastic::Phase::kRetiring:
      case Elastic::Phase::kDraining:
        break;
    }
    group = it->second.group;
    if (!group->commits()) return;  // one sidecar: nothing to survive
    elastic->sidecar_cut = true;
    // Every op queues from now on (none is past a cut of 0); the frozen epoch hands out or takes
    // back what it already has.
    elastic->phase = Elastic::Phase::kRetiring;
    elastic->cut = 0;
    elastic->deferred_cut.reset();
    if (elastic->cause.empty()) elastic->cause = cause;
    lost_ids = group->topology().DescribeNodes(lost_nodes);
  }
  LogWarning("peer sidecar lost: its fault-tolerant group freezes and goes on without it",
             {{"group", name},
              {"epoch", std::to_string(epoch)},
              {"lost_sidecars", lost_ids},
              {"why", cause}});
  group->Freeze(WhileAlive(
      [this, name, elastic, epoch, lost_nodes](const Status& failure, uint64_t finished_through) {
        if (!failure.ok()) {
          PostEpochTask([this, name, elastic, failure] { FailTransition(name, elastic, failure); });
          return;
        }
        PostEpochTask([this, name, elastic, epoch, lost_nodes, finished_through] {
          AgreeSidecarCut(name, elastic, epoch, lost_nodes, finished_through);
        });
      }));
}

void GroupRegistry::AgreeSidecarCut(const std::string& name,
                                    const std::shared_ptr<Elastic>& elastic, int epoch,
                                    const std::vector<int>& lost_nodes, uint64_t finished_through) {
  std::shared_ptr<Group> group;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || it->second.elastic != elastic || elastic->view.epoch != epoch ||
        elastic->phase == Elastic::Phase::kFailed) {
      return;
    }
    group = it->second.group;
  }
  const GroupTopology& topology = group->topology();
  const int nodes = topology.node_count();
  std::vector<int> survivors;
  for (int node = 0; node < nodes; ++node) {
    if (!std::binary_search(lost_nodes.begin(), lost_nodes.end(), node)) survivors.push_back(node);
  }
  const GroupKeys keys = elastic->EpochKeys(epoch);
  Store& store = *elastic->request.store;
  std::vector<std::string> finished_keys;
  for (int node : survivors) finished_keys.push_back(keys.Finished(node));
  const std::shared_ptr<MovableStore>& movable = elastic->request.movable_store;
  // A store that moves meanwhile lost this sidecar's point: published again in the new one (the
  // wait in slices, to see the move).
  const Status all = AgainIfMoved(movable, [&](int, const std::function<bool()>& moved) -> Status {
    COLLECTIVED_RETURN_IF_ERROR(
        store.Set(keys.Finished(topology.my_node), std::to_string(finished_through)));
    // In slices also to end when the sidecar stops (Stopping).
    return WaitInSlices(store, finished_keys, kEpochFormBudget, std::chrono::milliseconds(200),
                        [&] { return moved() || Stopping(); });
  });
  StatusOr<std::vector<std::string>> points = all.ok()
                                                  ? store.MultiGet(finished_keys, kRecordReadBudget)
                                                  : StatusOr<std::vector<std::string>>(all);
  if (!points.ok()) {
    std::vector<int> silent;
    for (int node : survivors) {
      StatusOr<bool> there = store.Check({keys.Finished(node)});
      if (there.ok() && !*there) silent.push_back(node);
    }
    FailTransition(
        name, elastic,
        Status::PeerLost("group '" + name + "' lost sidecar(s) " + JoinRanks(lost_nodes) +
                         " of epoch " + std::to_string(epoch) + ", and sidecar(s) " +
                         JoinRanks(silent) + " did not say how far they got within " +
                         std::to_string(kEpochFormBudget.count()) +
                         " ms: " + points.status().message()));
    return;
  }
  uint64_t cut = std::numeric_limits<uint64_t>::max();
  for (const std::string& point : *points) {
    StatusOr<uint64_t> finished = DecodeFinishedPoint(point);
    if (!finished.ok()) {
      FailTransition(name, elastic, finished.status().WithContext("group '" + name + "'"));
      return;
    }
    cut = std::min(cut, *finished);
  }
  if (!survivors.empty() && topology.my_node == survivors.front()) {
    Status announced = AnnounceLostSidecars(*elastic, *group, epoch, lost_nodes, cut);
    if (!announced.ok()) {
      FailTransition(name, elastic, announced.WithContext("group '" + name + "'"));
      return;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (elastic->phase != Elastic::Phase::kRetiring) return;  // failed or destroyed meanwhile
    elastic->cut = cut;
  }
  LogInfo("fault-tolerant group retires its epoch after a sidecar loss",
          {{"group", name},
           {"epoch", std::to_string(epoch)},
           {"finished_here", std::to_string(finished_through)},
           {"cut", std::to_string(cut)}});
  group->RetireFrozen(cut, OnRetired(name, elastic));
}

Status GroupRegistry::AnnounceLostSidecars(const Elastic& elastic, const Group& group, int epoch,
                                           const std::vector<int>& lost_nodes, uint64_t cut) {
  const GroupTopology& topology = group.topology();
  Store& store = *elastic.request.store;
  Status marked;
  // A moved store lacks their incarnation counters (CarryIntoMovedStore counted the ranks live
  // then): a replacement finds them lost there as anywhere.
  const bool moved =
      elastic.request.movable_store && elastic.request.movable_store->generation() > 0;
  // Their ranks are lost: a replacement may claim them.
  for (int rank = 0; rank < topology.group_size && marked.ok(); ++rank) {
    if (std::binary_search(lost_nodes.begin(), lost_nodes.end(), topology.node_of_rank[rank])) {
      const int group_rank = group.spec().GroupRankOf(rank);
      marked = store.Set(elastic.keys.LostRank(group_rank), std::to_string(epoch));
      if (marked.ok() && moved) {
        marked = SeedIncarnationCounter(store, elastic.request, elastic.keys, group_rank);
      }
    }
  }
  const GroupKeys next = elastic.EpochKeys(epoch + 1);
  for (size_t i = 0; i < lost_nodes.size() && marked.ok(); ++i) {
    EpochNodeRecord none;
    none.sidecar_id = topology.node_ids[lost_nodes[i]];
    none.cut = cut;
    marked = store.Set(next.EpochNode(lost_nodes[i]), EncodeEpochNodeRecord(none));
    StatusOr<int64_t> arrived =
        marked.ok() ? store.Add(next.Arrived(), 1) : StatusOr<int64_t>(marked);
    if (!arrived.ok()) {
      marked = arrived.status();
    } else if (*arrived == topology.node_count()) {
      PublishEpoch(elastic, epoch + 1, topology.node_count());
    }
  }
  if (!marked.ok()) {
    return Status::PeerLost("cannot announce the lost sidecars' part in epoch " +
                            std::to_string(epoch + 1) + ": " + marked.message());
  }
  return Status::Ok();
}

void GroupRegistry::ReplaceSilentSidecars(const std::string& name,
                                          const std::shared_ptr<Elastic>& elastic, int epoch,
                                          uint64_t cut) {
  std::shared_ptr<Group> group;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || it->second.elastic != elastic || elastic->view.epoch != epoch ||
        elastic->phase != Elastic::Phase::kForming) {
      return;
    }
    group = it->second.group;  // the retired epoch: its roll call still answers
  }
  const GroupTopology& topology = group->topology();
  const GroupKeys next = elastic->EpochKeys(epoch + 1);
  Store& store = *elastic->request.store;
  std::vector<int> missing;
  for (int node = 0; node < topology.node_count(); ++node) {
    StatusOr<bool> there = store.Check({next.EpochNode(node)});
    if (there.ok() && !*there) missing.push_back(node);
  }
  if (missing.empty()) return;
  std::optional<std::vector<int>> silent = group->SilentPeers();
  if (!silent) return;
  std::vector<int> gone;
  std::set_intersection(missing.begin(), missing.end(), silent->begin(), silent->end(),
                        std::back_inserter(gone));
  if (gone.empty()) return;  // slow, not lost: the formation's budget still runs
  int lowest = 0;
  while (std::binary_search(silent->begin(), silent->end(), lowest)) ++lowest;
  LogWarning("peer sidecar lost while the next epoch formed: it goes on without it",
             {{"group", name},
              {"epoch", std::to_string(epoch + 1)},
              {"lost_sidecars", topology.DescribeNodes(gone)}});
  if (topology.my_node != lowest) return;
  Status announced = AnnounceLostSidecars(*elastic, *group, epoch, gone, cut);
  if (!announced.ok()) {
    LogWarning("cannot announce a lost sidecar's part in the next epoch",
               {{"group", name}, {"why", announced.message()}});
  }
}

}  // namespace collectived
