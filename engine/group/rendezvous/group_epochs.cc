// GroupRegistry: a shrinking group's epochs (docs/fault-tolerance.md). A lost rank's sidecar
// publishes the cut (the rank's last op); every sidecar lets the ops up to it finish, takes the
// later ones back, announces the ranks it still hosts, and once every sidecar of the epoch did,
// forms the next epoch among the live ranks and submits the ops taken back and those issued
// meanwhile to it, translated. Apart from the first epoch's rendezvous (group_rendezvous.cc).
#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "engine/group/rendezvous/group_records.h"
#include "engine/group/rendezvous/group_registry.h"
#include "engine/group/rendezvous/group_registry_internal.h"
#include "engine/vocabulary/logging.h"
#include "engine/vocabulary/op_traits.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

// The index of sidecar `id` in `membership`, which takes it in when it is not there yet.
int SidecarIndex(GroupMembership& membership, const std::string& id, const std::string& address) {
  for (size_t i = 0; i < membership.sidecar_ids.size(); ++i) {
    if (membership.sidecar_ids[i] == id) return static_cast<int>(i);
  }
  membership.sidecar_ids.push_back(id);
  membership.admin_addresses.push_back(address);
  return static_cast<int>(membership.sidecar_ids.size()) - 1;
}

// After this long without the next epoch's membership, the sidecars that did not announce their
// part are asked whether they are alive (ReplaceSilentSidecars).
constexpr milliseconds kSlowFormation{1000};

// Waits for epoch `keys`' membership, calling `on_slow` once after kSlowFormation, in slices:
// Aborted as soon as `stopping` (the sidecar stops: its own store may outlive every peer that
// would answer). `sliced` (a sidecar with no rank left in it): NotFound as soon as this sidecar's
// own announcement (node `node`) is gone, for the sidecars of the next epoch may end the group
// and remove its keys before this one reads them.
Status WaitForEpoch(Store& store, const GroupKeys& keys, int node, bool sliced,
                    const std::function<void()>& on_slow, const std::function<bool()>& stopping) {
  constexpr milliseconds slice{200};
  Status formed;
  bool slow = false;
  for (milliseconds waited{0}; waited < kEpochFormBudget; waited += slice) {
    formed = store.Wait({keys.Membership()}, std::min(slice, kEpochFormBudget - waited));
    if (!formed.IsTimeout()) return formed;
    if (stopping()) return Status::Aborted("the sidecar is stopping");
    if (sliced) {
      StatusOr<bool> mine = store.Check({keys.EpochNode(node)});
      if (mine.ok() && !*mine) return Status::NotFound("the group's keys are gone");
    }
    if (!slow && waited + slice >= kSlowFormation) {
      slow = true;
      on_slow();
    }
  }
  return formed;
}

}  // namespace

void GroupRegistry::StartElasticLocked(Live& live, const JoinRequest& request,
                                       const GroupKeys& keys) {
  auto elastic = std::make_shared<Elastic>(keys);
  elastic->request = request;
  elastic->request.abandoned = nullptr;  // the epochs belong to the group, not to a joiner
  elastic->request.store = live.store;   // the group's, whichever local rank formed it
  elastic->request.movable_store = live.movable_store;
  elastic->request.timeout = live.group->spec().timeout;
  const GroupSpec& spec = live.group->spec();
  elastic->members = spec.group_members.empty() ? spec.members : spec.group_members;
  elastic->view = EpochViewOf(live.group->spec());
  elastic->whole = elastic->view.whole();  // a replacement's first epoch may lack ranks
  live.elastic = elastic;
  if (const std::shared_ptr<MovableStore>& movable = live.movable_store) {
    movable->SetSuccessors(StoreSuccessors(request.store_fallbacks, live.group.get()));
    movable->SetOnMoved(
        WhileAlive([this, name = request.name, weak = std::weak_ptr<MovableStore>(movable)](
                       int generation, const std::string& to) {
          PostEpochTask(
              [this, name, weak, generation, to] { OnStoreMoved(name, weak, generation, to); });
        }));
    elastic->store_generation = movable->generation();
  }
  WatchLossesLocked(request.name, elastic);
}

void GroupRegistry::PostEpochTask(std::function<void()> task) {
  if (!life_->Enter()) return;  // the registry is going: no epoch changes any more
  runtime_->executor().Post([life = life_, task = std::move(task)] {
    {
      Executor::Blocking blocking;  // store calls, and the next epoch's rendezvous
      task();
    }
    life->Exit();
  });
}

void GroupRegistry::WatchLossesLocked(const std::string& name,
                                      const std::shared_ptr<Elastic>& elastic) {
  const int epoch = elastic->view.epoch;
  const int64_t next = elastic->losses_seen + 1;
  const int generation = elastic->store_generation;
  std::shared_ptr<MovableStore> movable;
  if (auto it = live_.find(name); it != live_.end()) movable = it->second.movable_store;
  std::weak_ptr<Elastic> weak = elastic;
  elastic->loss_watch = elastic->request.store->WaitAsync(
      {elastic->EpochKeys(epoch).Loss(next)}, kNoTimeout,
      WhileAlive([this, name, weak, epoch, next, generation, movable,
                  runtime = std::weak_ptr<Runtime>(runtime_)](Status s) {
        if (!s.ok()) {  // cancelled (the epoch or the group is gone), or the store lost
          MoveStoreIfLost(runtime, movable, generation, s);
          return;
        }
        std::shared_ptr<Elastic> elastic = weak.lock();
        if (!elastic) return;
        // On the store's completion thread, which must not call the store: on the executor.
        PostEpochTask([this, name, elastic, epoch, next, generation] {
          OnLossRecord(name, elastic, epoch, next, generation);
        });
      }));
}

Group::RetiredCallback GroupRegistry::OnRetired(const std::string& name,
                                                const std::shared_ptr<Elastic>& elastic) {
  return WhileAlive(
      [this, name, elastic](const Status& failure, std::vector<Group::TakenBack> taken) {
        auto ops = std::make_shared<std::vector<Group::TakenBack>>(std::move(taken));
        PostEpochTask([this, name, elastic, failure, ops] {
          if (!failure.ok()) {
            FailTransition(name, elastic, failure);
          } else {
            NextEpoch(name, elastic, std::move(*ops));
          }
        });
      });
}

void GroupRegistry::OnLossRecord(const std::string& name, std::shared_ptr<Elastic> elastic,
                                 int epoch, int64_t record, int store_generation) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (elastic->store_generation != store_generation) return;  // of a store lost since
  }
  StatusOr<std::string> value =
      elastic->request.store->Get(elastic->EpochKeys(epoch).Loss(record), kRecordReadBudget);
  StatusOr<ChangeRecord> change =
      value.ok() ? DecodeChangeRecord(*value) : StatusOr<ChangeRecord>(value.status());
  std::shared_ptr<Group> group;
  uint64_t cut = 0;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || it->second.elastic != elastic || elastic->view.epoch != epoch ||
        elastic->store_generation != store_generation) {
      return;
    }
    elastic->losses_seen = std::max(elastic->losses_seen, record);
    WatchLossesLocked(name, elastic);
    const int size = elastic->view.group_size();
    auto out_of_range = [size](int rank) { return rank < 0 || rank >= size; };
    const char* refused = nullptr;
    const int nodes = it->second.group->topology().node_count();
    const int me = it->second.group->topology().my_node;
    if (!change.ok()) {
      refused = "unreadable";
    } else if (change->kind == ChangeRecord::Kind::kSidecarsLost) {
      if (change->joiners.empty() ||
          std::any_of(change->joiners.begin(), change->joiners.end(),
                      [&](int node) { return node < 0 || node >= nodes || node == me; })) {
        refused = "lost sidecar out of range";
      }
    } else if (change->kind != ChangeRecord::Kind::kAdmitted && out_of_range(change->group_rank)) {
      refused = "rank out of range";
    } else if (change->kind == ChangeRecord::Kind::kAdmitted &&
               (change->joiners.empty() ||
                std::any_of(change->joiners.begin(), change->joiners.end(), out_of_range))) {
      refused = "joiner out of range";
    }
    if (refused) {
      // Forged (the job token's MAC does not match) or not ours: the group goes on as it is.
      LogWarning("ignored a change record of a fault-tolerant group",
                 {{"group", name}, {"why", change.ok() ? refused : change.status().message()}});
      return;
    }
    if (change->kind == ChangeRecord::Kind::kSidecarsLost) {
      lock.unlock();
      StartSidecarCut(name, elastic, epoch, change->joiners, change->cause);
      return;
    }
    if (change->kind == ChangeRecord::Kind::kJoining) {
      // A replacement waits: the live ranks learn of it (Replacements) and admit it at a step
      // boundary. Nothing retires.
      if (elastic->view.lost(change->group_rank)) elastic->joining.insert(change->group_rank);
      return;
    }
    // The epoch froze after a sidecar loss: its cut is the survivors' (AgreeSidecarCut).
    if (elastic->sidecar_cut) return;
    if (change->kind == ChangeRecord::Kind::kAdmitted) {
      std::vector<int>& admitted = elastic->admissions[change->cut];
      if (admitted.empty()) admitted = change->joiners;
    }
    if (elastic->cause.empty()) elastic->cause = change->cause;
    switch (elastic->phase) {
      case Elastic::Phase::kSteady:
        elastic->phase = Elastic::Phase::kRetiring;
        elastic->cut = change->cut;
        break;
      case Elastic::Phase::kRetiring:
        elastic->cut = std::min(elastic->cut, change->cut);
        break;
      case Elastic::Phase::kDraining:  // retires once the queue went to the epoch
        elastic->deferred_cut = std::min(elastic->deferred_cut.value_or(change->cut), change->cut);
        return;
      case Elastic::Phase::kForming:  // retired here already: a later change of the same epoch
      case Elastic::Phase::kFailed:
        return;
    }
    group = it->second.group;
    cut = elastic->cut;
  }
  group->Retire(cut, OnRetired(name, elastic));
}

Status GroupRegistry::LoseRank(const std::string& name, int group_rank, const Status& reason) {
  std::shared_ptr<Elastic> elastic;
  std::shared_ptr<Group> group;
  std::vector<std::shared_ptr<Work>> dropped;
  bool publish = false;
  bool retire = true;
  uint64_t rank_cut = 0;
  uint64_t cut = 0;
  int epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || !it->second.local_ranks.count(group_rank)) {
      return Status::NotFound("group '" + name + "' has no rank " + std::to_string(group_rank) +
                              " on this sidecar");
    }
    Live& live = it->second;
    if (!live.elastic) {
      return Status::InvalidArgument("group '" + name + "' does not shrink");
    }
    elastic = live.elastic;
    elastic->lost_here.insert(group_rank);
    for (auto q = elastic->queued.begin(); q != elastic->queued.end();) {
      if (q->group_rank != group_rank) {
        ++q;
        continue;
      }
      dropped.push_back(q->work);
      q = elastic->queued.erase(q);
    }
    epoch = elastic->view.epoch;
    switch (elastic->phase) {
      case Elastic::Phase::kFailed:
        break;
      case Elastic::Phase::kForming:
        if (elastic->announced.count(group_rank)) {
          elastic->lost_after_announcing.push_back(group_rank);
        }
        break;
      case Elastic::Phase::kSteady:
      case Elastic::Phase::kRetiring:
      case Elastic::Phase::kDraining:
        rank_cut = live.group->SequenceNumber(elastic->view.epoch_rank[group_rank]);
        if (elastic->cause.empty()) elastic->cause = reason.message();
        group = live.group;
        publish = true;
        if (elastic->sidecar_cut) {
          // The epoch froze after a sidecar loss: its cut is the survivors' (AgreeSidecarCut);
          // the rank is left out of the next epoch (lost_here).
          retire = false;
          break;
        }
        if (elastic->phase == Elastic::Phase::kDraining) {
          // Published now; this sidecar retires the epoch once its queue went to it.
          elastic->deferred_cut = std::min(elastic->deferred_cut.value_or(rank_cut), rank_cut);
          retire = false;
          break;
        }
        cut =
            elastic->phase == Elastic::Phase::kSteady ? rank_cut : std::min(elastic->cut, rank_cut);
        elastic->phase = Elastic::Phase::kRetiring;
        elastic->cut = cut;
        break;
    }
  }
  for (auto& work : dropped) work->Complete(reason);
  LogWarning("rank lost: its fault-tolerant group goes on without it",
             {{"group", name},
              {"group_rank", std::to_string(group_rank)},
              {"epoch", std::to_string(epoch)},
              {"cut", std::to_string(rank_cut)},
              {"why", reason.message()}});
  if (!publish) return Status::Ok();
  Status published = PublishLoss(*elastic, epoch, group_rank, rank_cut, reason.message());
  if (!published.ok()) {
    // The other sidecars cannot learn of the loss: fail as a fail-fast group does.
    Status failed = Status::PeerLost(
        reason.message() + " (and the loss could not be published: " + published.message() + ")");
    group->Fail(failed);
    FailTransition(name, elastic, failed);
    return Status::Ok();
  }
  if (retire) group->Retire(cut, OnRetired(name, elastic));
  return Status::Ok();
}

Status GroupRegistry::PublishChange(const Elastic& elastic, int epoch, const ChangeRecord& change) {
  Executor::Blocking blocking;
  const GroupKeys keys = elastic.EpochKeys(epoch);
  // A store that moved between the count and the record has one without the other: published
  // again, whole, in the new one (a record read twice changes nothing).
  return AgainIfMoved(
      elastic.request.movable_store, [&](int, const std::function<bool()>&) -> Status {
        StatusOr<int64_t> n = elastic.request.store->Add(keys.Losses(), 1);
        if (!n.ok()) return n.status();
        return elastic.request.store->Set(keys.Loss(*n), EncodeChangeRecord(change));
      });
}

Status GroupRegistry::PublishLoss(const Elastic& elastic, int epoch, int group_rank, uint64_t cut,
                                  const std::string& cause) {
  Executor::Blocking blocking;
  Status marked =
      elastic.request.store->Set(elastic.keys.LostRank(group_rank), std::to_string(epoch));
  if (!marked.ok()) return marked;
  ChangeRecord loss;
  loss.kind = ChangeRecord::Kind::kLost;
  loss.group_rank = group_rank;
  loss.cut = cut;
  loss.cause = cause;
  return PublishChange(elastic, epoch, loss);
}

void GroupRegistry::NextEpoch(const std::string& name, std::shared_ptr<Elastic> elastic,
                              std::vector<Group::TakenBack> taken) {
  std::vector<std::shared_ptr<Work>> dropped;
  Status dropped_with = Status::PeerLost("group '" + name + "': the op's rank was lost");
  EpochNodeRecord mine;
  int epoch = 0;
  int nodes = 0;
  int node = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    const bool current = it != live_.end() && it->second.elastic == elastic;
    if (!current || elastic->phase != Elastic::Phase::kRetiring) {
      dropped_with = elastic->phase == Elastic::Phase::kFailed
                         ? elastic->failure
                         : Status::Aborted("group '" + name + "' was destroyed");
      for (auto& op : taken) {
        for (auto& work : op.works) {
          if (work) dropped.push_back(work);
        }
      }
    } else {
      Live& live = it->second;
      elastic->phase = Elastic::Phase::kForming;
      // The ops taken back go first: every one precedes, on its rank, what was queued since.
      auto from = std::make_shared<const EpochView>(elastic->view);
      const std::vector<int>& local = live.group->topology().local_ranks();
      std::deque<Elastic::Queued> first;
      for (auto& op : taken) {
        for (size_t i = 0; i < op.works.size() && i < local.size(); ++i) {
          if (!op.works[i] || !op.requests[i]) continue;
          const int group_rank = elastic->view.GroupRankOf(local[i]);
          if (elastic->lost_here.count(group_rank)) {
            dropped.push_back(op.works[i]);
            continue;
          }
          first.push_back({group_rank, std::move(*op.requests[i]), op.works[i], from});
        }
      }
      elastic->queued.insert(elastic->queued.begin(), std::make_move_iterator(first.begin()),
                             std::make_move_iterator(first.end()));
      mine.sidecar_id = sidecar_id_;
      mine.admin_address = AdminAddress();
      mine.cut = elastic->cut;
      elastic->announced.clear();
      for (int rank : live.local_ranks) {
        if (elastic->lost_here.count(rank)) continue;
        elastic->announced.insert(rank);
        mine.live_ranks.push_back(elastic->members[rank]);
      }
      std::sort(mine.live_ranks.begin(), mine.live_ranks.end());
      // Replacements come in only at the cut they were admitted after: a change that cut the
      // epoch earlier (a loss) leaves them waiting for a later admission.
      if (auto admitted = elastic->admissions.find(elastic->cut);
          admitted != elastic->admissions.end()) {
        mine.joiners = admitted->second;
        mine.admitted_after = elastic->cut;
      }
      epoch = elastic->view.epoch;
      nodes = live.group->topology().node_count();
      node = live.group->topology().my_node;
    }
  }
  for (auto& work : dropped) work->Complete(dropped_with);
  if (mine.sidecar_id.empty()) return;  // the group was destroyed or failed meanwhile

  const int next = epoch + 1;
  const GroupKeys keys = elastic->EpochKeys(next);
  Store& store = *elastic->request.store;
  Status announced = store.Set(keys.EpochNode(node), EncodeEpochNodeRecord(mine));
  StatusOr<int64_t> arrived =
      announced.ok() ? store.Add(keys.Arrived(), 1) : StatusOr<int64_t>(announced);
  if (!arrived.ok()) {
    FailTransition(name, elastic,
                   Status::PeerLost("group '" + name +
                                    "': cannot announce this sidecar's part in "
                                    "epoch " +
                                    std::to_string(next) + ": " + arrived.status().message()));
    return;
  }
  if (*arrived == nodes) PublishEpoch(*elastic, next, nodes);
  Status formed = WaitForEpoch(
      store, keys, node, /*sliced=*/mine.live_ranks.empty(),
      [&] { ReplaceSilentSidecars(name, elastic, epoch, mine.cut); }, [&] { return Stopping(); });
  if (formed.IsNotFound()) {
    // Its own announcement is gone: the sidecars of a later epoch (this one had no rank left in
    // it) ended the group and removed its keys before this one read the membership.
    DropOut(name, elastic, /*keys_stay=*/true);
    return;
  }
  if (!formed.ok()) {
    // Some sidecar of the epoch never announced itself and still answered the roll call, or
    // died after the call (ReplaceSilentSidecars): the group cannot form its next epoch.
    std::vector<int> silent;
    for (int i = 0; i < nodes; ++i) {
      StatusOr<bool> there = store.Check({keys.EpochNode(i)});
      if (there.ok() && !*there) silent.push_back(i);
    }
    FailTransition(
        name, elastic,
        Status::PeerLost("group '" + name + "': sidecar(s) " + JoinRanks(silent) + " of epoch " +
                         std::to_string(epoch) + " did not take part in epoch " +
                         std::to_string(next) + " within " +
                         std::to_string(kEpochFormBudget.count()) + " ms: " + formed.message()));
    return;
  }
  // Every sidecar retired the epoch (each announced only then): its connections may close.
  StatusOr<std::string> members_record = store.Get(keys.EpochMembers(), kRecordReadBudget);
  StatusOr<std::vector<int>> members = members_record.ok()
                                           ? DecodeRankList(*members_record)
                                           : StatusOr<std::vector<int>>(members_record.status());
  if (!members.ok()) {
    FailTransition(name, elastic, members.status().WithContext("group '" + name + "'"));
    return;
  }
  bool hosts_replacement = false;
  if (mine.live_ranks.empty() && !mine.joiners.empty()) {
    StatusOr<std::string> record = store.Get(keys.Membership(), kRecordReadBudget);
    StatusOr<GroupMembership> membership =
        record.ok() ? DecodeMembership(*record) : StatusOr<GroupMembership>(record.status());
    hosts_replacement = membership.ok() && membership->refusal.ok() &&
                        std::find(membership->sidecar_ids.begin(), membership->sidecar_ids.end(),
                                  sidecar_id_) != membership->sidecar_ids.end();
  }
  if (mine.live_ranks.empty() && !hosts_replacement) {
    // Nothing of this sidecar's is in the next epoch: it leaves the group. When the group goes
    // on elsewhere, the sidecars of its last epoch remove its keys; when it ends here (no live
    // rank left, or too few), every sidecar of this epoch counts itself out as a destroy does.
    StatusOr<std::string> record = store.Get(keys.Membership(), kRecordReadBudget);
    StatusOr<GroupMembership> membership =
        record.ok() ? DecodeMembership(*record) : StatusOr<GroupMembership>(record.status());
    const bool goes_on = !members->empty() && membership.ok() && membership->refusal.ok();
    DropOut(name, elastic, /*keys_stay=*/goes_on);
    return;
  }
  StatusOr<Formed> group = Form(elastic->request, keys, *members, elastic->request.timeout,
                                EpochStart{next, mine.cut + 1, elastic->members});
  if (!group.ok()) {
    FailTransition(name, elastic, group.status());
    return;
  }
  Install(name, elastic, keys, std::move(*group));
}

void GroupRegistry::DropOut(const std::string& name, const std::shared_ptr<Elastic>& elastic,
                            bool keys_stay) {
  Live doomed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || it->second.elastic != elastic) return;
    elastic->phase = Elastic::Phase::kFailed;
    elastic->dropped_out = keys_stay;
    elastic->failure =
        Status::PeerLost("group '" + name + "' has no live rank on this sidecar any more");
    if (!it->second.local_ranks.empty()) return;  // they leave (Leave) and take it along
    doomed = std::move(it->second);
    live_.erase(it);
  }
  TearDown(name, doomed);
}

void GroupRegistry::PublishEpoch(const Elastic& elastic, int next, int nodes) {
  const GroupKeys keys = elastic.EpochKeys(next);
  Store& store = *elastic.request.store;
  std::vector<std::string> node_keys;
  for (int i = 0; i < nodes; ++i) node_keys.push_back(keys.EpochNode(i));
  StatusOr<std::vector<std::string>> records = store.MultiGet(node_keys, kRecordReadBudget);
  GroupMembership membership;
  std::vector<int> live;
  std::map<int, int> sidecar_of_global;
  std::set<int> joiners;
  if (!records.ok()) {
    membership.refusal = records.status().WithContext("group '" + elastic.view.group + "'");
  } else {
    std::optional<uint64_t> cut;
    for (int i = 0; i < nodes && membership.refusal.ok(); ++i) {
      StatusOr<EpochNodeRecord> record = DecodeEpochNodeRecord((*records)[i]);
      if (!record.ok()) {
        membership.refusal = record.status().WithContext("group '" + elastic.view.group + "'");
        break;
      }
      if (cut && *cut != record->cut) {
        membership.refusal =
            Status::Internal("group '" + elastic.view.group + "': its sidecars retired epoch " +
                             std::to_string(next - 1) + " at different cuts (" +
                             std::to_string(*cut) + ", " + std::to_string(record->cut) + ")");
        break;
      }
      cut = record->cut;
      if (record->admitted_after == record->cut) {
        joiners.insert(record->joiners.begin(), record->joiners.end());
      }
      if (record->live_ranks.empty()) continue;
      const int index = SidecarIndex(membership, record->sidecar_id, record->admin_address);
      for (int rank : record->live_ranks) {
        sidecar_of_global[rank] = index;
        live.push_back(rank);
      }
    }
  }
  // The replacements admitted at this cut, where they claimed their rank. One that withdrew
  // meanwhile (its join gave up) stays lost.
  for (int joiner : joiners) {
    if (!membership.refusal.ok() || joiner < 0 ||
        joiner >= static_cast<int>(elastic.members.size())) {
      break;
    }
    const int global = elastic.members[joiner];
    if (sidecar_of_global.count(global)) continue;  // live already
    StatusOr<std::string> claim = store.Get(elastic.keys.Joining(joiner), kRecordReadBudget);
    StatusOr<EpochNodeRecord> placement =
        claim.ok() ? DecodeEpochNodeRecord(*claim) : StatusOr<EpochNodeRecord>(claim.status());
    if (!placement.ok() || placement->live_ranks != std::vector<int>{global}) {
      LogWarning("an admitted replacement is not there any more: its rank stays lost",
                 {{"group", elastic.view.group},
                  {"group_rank", std::to_string(joiner)},
                  {"why", placement.ok() ? "its claim names another rank"
                                         : placement.status().message()}});
      continue;
    }
    sidecar_of_global[global] =
        SidecarIndex(membership, placement->sidecar_id, placement->admin_address);
    live.push_back(global);
  }
  std::sort(live.begin(), live.end());
  if (membership.refusal.ok()) {
    const int min_ranks = elastic.request.fault_tolerance.min_ranks;
    if (static_cast<int>(live.size()) < min_ranks) {
      membership.refusal = Status::PeerLost(
          "group '" + elastic.view.group + "' lost ranks and has " + std::to_string(live.size()) +
          " live, fewer than its minimum of " + std::to_string(min_ranks) +
          " (COLLECTIVED_FAULT_TOLERANCE_MIN_RANKS): it fails as a fail-fast group");
    }
  }
  if (membership.refusal.ok()) {
    // Sidecars in the order of their first rank, as every rendezvous numbers them.
    std::vector<int> renumbered(membership.sidecar_ids.size(), -1);
    GroupMembership ordered;
    for (int rank : live) {
      const int sidecar = sidecar_of_global[rank];
      if (renumbered[sidecar] < 0) {
        renumbered[sidecar] = static_cast<int>(ordered.sidecar_ids.size());
        ordered.sidecar_ids.push_back(membership.sidecar_ids[sidecar]);
        ordered.admin_addresses.push_back(membership.admin_addresses[sidecar]);
      }
      ordered.sidecar_of_rank.push_back(renumbered[sidecar]);
    }
    membership = std::move(ordered);
  }
  Status written = store.Set(keys.EpochMembers(), EncodeRankList(live));
  if (written.ok()) written = store.Set(elastic.keys.CurrentEpoch(), std::to_string(next));
  if (written.ok()) written = store.Set(keys.Membership(), EncodeMembership(membership));
  if (!written.ok()) {
    LogWarning("cannot publish the next epoch of a fault-tolerant group",
               {{"group", elastic.view.group}, {"error", written.message()}});
  }
}

void GroupRegistry::Install(const std::string& name, const std::shared_ptr<Elastic>& elastic,
                            const GroupKeys& keys, Formed formed) {
  std::shared_ptr<Group> retired;
  std::shared_ptr<Parking> retired_parking;
  std::vector<WaitId> watches;
  std::vector<int> lost;
  std::vector<int> joined;
  std::vector<int> lost_after_announcing;
  std::string cause;
  bool sidecar_lost = false;
  int epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || it->second.elastic != elastic ||
        elastic->phase != Elastic::Phase::kForming) {
      retired = formed.group;  // destroyed or failed meanwhile: this epoch never serves
      retired_parking = formed.parking;
    } else {
      Live& live = it->second;
      retired = live.group;
      retired_parking = live.parking;
      watches = {live.failure_watch, live.roll_call_watch, elastic->loss_watch};
      live.group = formed.group;
      live.parking = formed.parking;
      WatchPeers(live, keys);
      if (live.movable_store) {
        live.movable_store->SetSuccessors(
            StoreSuccessors(elastic->request.store_fallbacks, live.group.get()));
      }
      const EpochView previous = std::move(elastic->view);
      elastic->view = EpochViewOf(formed.group->spec());
      elastic->whole = elastic->view.whole();
      elastic->losses_seen = 0;
      elastic->joining.clear();
      elastic->admissions.clear();
      lost = elastic->view.Lost();
      for (int rank = 0; rank < elastic->view.group_size(); ++rank) {
        if (previous.lost(rank) && !elastic->view.lost(rank)) {
          joined.push_back(rank);
          elastic->lost_here.erase(rank);  // its replacement is here
        }
      }
      elastic->joined = joined;
      cause = elastic->cause;
      elastic->cause.clear();
      sidecar_lost = elastic->sidecar_cut;
      elastic->sidecar_cut = false;
      lost_after_announcing.swap(elastic->lost_after_announcing);
      epoch = elastic->view.epoch;
      elastic->phase = Elastic::Phase::kDraining;
      // Ranks lost after this sidecar announced them for the epoch are lost in it, from its
      // first op (published below).
      if (!lost_after_announcing.empty()) {
        elastic->deferred_cut = formed.group->spec().first_sequence_number - 1;
      }
      WatchLossesLocked(name, elastic);
    }
  }
  epoch_changed_.notify_all();
  for (WaitId watch : watches) {
    if (watch != kInvalidWaitId) elastic->request.store->CancelWait(watch);
  }
  // The retired epoch goes once quiescent; its keys stay (no store: the incarnation's go with
  // the last epoch's sidecars).
  Live old;
  old.group = retired;
  old.parking = retired_parking;
  Park(old);
  if (epoch == 0) return;
  LogWarning("fault-tolerant group changed its membership",
             {{"group", name},
              {"epoch", std::to_string(epoch)},
              {"lost_group_ranks", JoinRanks(lost)},
              {"joined_group_ranks", joined.empty() ? "none" : JoinRanks(joined)},
              {"live_ranks", std::to_string(formed.group->spec().members.size())},
              {"cause", cause}});
  if (options_.observer) {
    options_.observer->OnMembershipChange(name, epoch,
                                          !joined.empty() ? "rank_joined"
                                          : sidecar_lost  ? "sidecar_lost"
                                                          : "rank_lost");
  }
  const uint64_t first_cut = formed.group->spec().first_sequence_number - 1;
  for (int rank : lost_after_announcing) {
    Status published = PublishLoss(*elastic, epoch, rank, first_cut, "its session ended");
    if (!published.ok()) {
      FailTransition(name, elastic,
                     Status::PeerLost(
                         "group '" + name + "': group rank " + std::to_string(rank) +
                         " was lost, and the loss could not be published: " + published.message()));
      return;
    }
  }
  DrainQueued(name, elastic);
}

void GroupRegistry::DrainQueued(const std::string& name, const std::shared_ptr<Elastic>& elastic) {
  std::shared_ptr<Group> retiring;
  uint64_t cut = 0;
  while (true) {
    Elastic::Queued next;
    std::shared_ptr<Group> group;
    EpochView view;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (elastic->phase != Elastic::Phase::kDraining) return;
      auto it = live_.find(name);
      if (elastic->queued.empty()) {
        if (!elastic->deferred_cut) {
          elastic->phase = Elastic::Phase::kSteady;
          return;
        }
        // A loss of this epoch arrived while its queue drained: it retires now.
        elastic->phase = Elastic::Phase::kRetiring;
        elastic->cut = *elastic->deferred_cut;
        elastic->deferred_cut.reset();
        if (it != live_.end() && it->second.elastic == elastic) retiring = it->second.group;
        cut = elastic->cut;
        break;
      }
      next = std::move(elastic->queued.front());
      elastic->queued.pop_front();
      if (it != live_.end() && it->second.elastic == elastic) group = it->second.group;
      view = elastic->view;
    }
    if (!group) {
      next.work->Complete(Status::Aborted("group '" + name + "' was destroyed"));
      continue;
    }
    Status translated = next.from
                            ? RetranslateForEpoch(next.request, next.group_rank, *next.from, view)
                            : TranslateForEpoch(next.request, next.group_rank, view);
    if (!translated.ok()) {
      next.work->Complete(translated);
      continue;
    }
    group->Submit(view.epoch_rank[next.group_rank], std::move(next.request), next.work);
  }
  if (retiring) retiring->Retire(cut, OnRetired(name, elastic));
}

void GroupRegistry::FailTransition(const std::string& name, const std::shared_ptr<Elastic>& elastic,
                                   const Status& reason) {
  std::deque<Elastic::Queued> queued;
  std::shared_ptr<Group> group;
  Live doomed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (elastic->phase == Elastic::Phase::kFailed) return;
    elastic->phase = Elastic::Phase::kFailed;
    elastic->failure = reason;
    queued.swap(elastic->queued);
    auto it = live_.find(name);
    if (it != live_.end() && it->second.elastic == elastic) {
      group = it->second.group;
      // Its ranks left while the epoch changed (Leave left the teardown to the change).
      if (it->second.local_ranks.empty()) {
        doomed = std::move(it->second);
        live_.erase(it);
      }
    }
  }
  epoch_changed_.notify_all();
  LogWarning("fault-tolerant group cannot go on", {{"group", name}, {"why", reason.message()}});
  if (group) group->Fail(reason);
  for (auto& op : queued) op.work->Complete(reason);
  if (doomed.group) TearDown(name, doomed);
}

std::shared_ptr<Work> GroupRegistry::Submit(const std::string& name, int group_rank,
                                            OpRequest request) {
  std::shared_ptr<Group> group;
  EpochView view;
  bool translate = false;
  int original_rank = group_rank;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end()) {
      return FailedWork(OpInfo{name, std::string(OpKindName(request.kind)), 0},
                        Status::InvalidArgument("unknown group '" + name + "' (create it first)"),
                        runtime_->clock());
    }
    group = it->second.group;
    const std::shared_ptr<Elastic>& elastic = it->second.elastic;
    if (elastic) {
      if (group_rank < 0 || group_rank >= elastic->view.group_size()) {
        return group->Submit(group_rank, std::move(request));  // refused there, with the reason
      }
      const OpInfo info{name, std::string(OpKindName(request.kind)), 0};
      if (elastic->phase == Elastic::Phase::kFailed) {
        return FailedWork(info, elastic->failure, runtime_->clock());
      }
      if (elastic->lost_here.count(group_rank)) {
        return FailedWork(info,
                          Status::PeerLost("group rank " + std::to_string(group_rank) +
                                           " of group '" + name + "' was lost"),
                          runtime_->clock());
      }
      const int rank_in_epoch = elastic->view.epoch_rank[group_rank];
      // While the epoch retires, a rank's ops up to the cut still go to it; later ones (and
      // every op once it retired here) wait for the next epoch.
      const bool queue =
          elastic->phase == Elastic::Phase::kForming ||
          elastic->phase == Elastic::Phase::kDraining ||
          (elastic->phase == Elastic::Phase::kRetiring &&
           (IsPointToPoint(request.kind) || group->SequenceNumber(rank_in_epoch) >= elastic->cut));
      if (queue) {
        const milliseconds timeout =
            request.timeout == kUseGroupTimeout ? elastic->request.timeout : request.timeout;
        auto work = std::make_shared<Work>(info, timeout, runtime_->clock());
        elastic->queued.push_back({group_rank, std::move(request), work, nullptr});
        return work;
      }
      // An epoch that lost nothing changes nothing of an op: no copy of its view per op.
      if (!elastic->whole) {
        view = elastic->view;
        translate = true;
      }
      original_rank = group_rank;
      group_rank = rank_in_epoch;
    }
  }
  if (translate) {
    Status translated = TranslateForEpoch(request, original_rank, view);
    if (!translated.ok()) {
      if (request.stream_signal) StoreSignal(*request.stream_signal);
      return FailedWork(OpInfo{name, std::string(OpKindName(request.kind)), 0}, translated,
                        runtime_->clock());
    }
  }
  return group->Submit(group_rank, std::move(request));
}

uint64_t GroupRegistry::SequenceNumber(const std::string& name, int group_rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(name);
  if (it == live_.end()) return 0;
  if (!it->second.elastic) return it->second.group->SequenceNumber(group_rank);
  const EpochView& view = it->second.elastic->view;
  if (group_rank < 0 || group_rank >= view.group_size() || view.lost(group_rank)) return 0;
  return it->second.group->SequenceNumber(view.epoch_rank[group_rank]);
}

uint64_t GroupRegistry::SequenceNumber(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(name);
  return it == live_.end() ? 0 : it->second.group->SequenceNumber();
}

bool GroupRegistry::Shrinks(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(name);
  return it != live_.end() && it->second.elastic != nullptr;
}

}  // namespace collectived
