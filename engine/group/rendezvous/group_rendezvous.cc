// GroupRegistry: the rendezvous that forms an incarnation of a group through the store (the job
// token's check, the announcements, the membership, the group built on it). Apart from the
// registry's bookkeeping of live and parked groups (group_registry.cc).
#include <algorithm>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include "engine/group/rendezvous/group_records.h"
#include "engine/group/rendezvous/group_registry.h"
#include "engine/group/rendezvous/group_registry_internal.h"
#include "engine/group/rendezvous/job_token.h"
#include "engine/store/cancellable_wait.h"
#include "engine/store/prefix_store.h"
#include "engine/vocabulary/logging.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

// How much longer than the roll call's budget a sidecar waits for another's result.
constexpr milliseconds kRollCallResultMargin{1000};
constexpr milliseconds kFailureLookupBudget{100};

RankAnnouncement AnnouncementOf(const std::string& sidecar_id, const std::string& admin_address,
                                const JoinRequest& request, std::string members_digest) {
  return RankAnnouncement{
      sidecar_id,
      request.world_size,
      std::move(members_digest),
      JobTokenCommitment(request.job_token,
                         GroupKeys::TokenScope(request.store_prefix, request.name)),
      request.device == DeviceKind::kCuda ? "cuda:" + std::to_string(request.device_index)
                                          : std::string("cpu"),
      admin_address,
      request.fault_tolerance.Encode()};
}

}  // namespace

Status WaitInSlices(Store& store, const std::vector<std::string>& keys, milliseconds budget,
                    milliseconds slice, const std::function<bool()>& stop) {
  Status all = Status::Timeout("waited no slice");
  for (milliseconds waited{0}; waited < budget && all.IsTimeout() && !stop(); waited += slice) {
    all = store.Wait(keys, std::min(slice, budget - waited));
  }
  return all;
}

StatusOr<Membership> GroupRegistry::JoinChecked(const JoinRequest& request,
                                                const std::vector<int>& members, int group_rank,
                                                const std::string& members_digest,
                                                milliseconds timeout, Store& unsigned_store) {
  const std::string& name = request.name;
  const int group_size = static_cast<int>(members.size());
  StatusOr<int64_t> incarnation =
      request.store->Add(GroupKeys::IncarnationCounter(request.store_prefix, name, group_rank), 1);
  if (!incarnation.ok()) return incarnation.status().WithContext("joining group '" + name + "'");
  if (*incarnation > 1) {
    // The previous incarnation may be a shrinking group still running: this join would take the
    // next incarnation, which its live ranks never join (a wait until the timeout). A process
    // for one of its lost ranks is a replacement; one for a live rank is refused at once.
    const GroupKeys running(request.store_prefix, name, *incarnation - 1);
    auto withdraw = [&] {
      (void)request.store->Add(
          GroupKeys::IncarnationCounter(request.store_prefix, name, group_rank), -1);
    };
    StatusOr<bool> lost = request.store->Check({running.LostRank(group_rank)});
    if (lost.ok() && *lost) {
      withdraw();
      return JoinAsReplacement(request, members, group_rank, running, timeout);
    }
    StatusOr<bool> changed = request.store->Check({running.CurrentEpoch()});
    if (changed.ok() && *changed) {
      StatusOr<std::string> epoch = request.store->Get(running.CurrentEpoch(), timeout);
      StatusOr<std::string> live =
          epoch.ok()
              ? request.store->Get(running.Epoch(std::atoi(epoch->c_str())).EpochMembers(), timeout)
              : StatusOr<std::string>(epoch.status());
      StatusOr<std::vector<int>> ranks =
          live.ok() ? DecodeRankList(*live) : StatusOr<std::vector<int>>(live.status());
      if (ranks.ok() && std::binary_search(ranks->begin(), ranks->end(), request.rank)) {
        withdraw();
        return Status::InvalidArgument(
            "group '" + name + "': group rank " + std::to_string(group_rank) + " (global rank " +
            std::to_string(request.rank) + ") is live in the running group (epoch " + *epoch +
            "): only a lost rank can be replaced");
      }
    }
  }
  const GroupKeys group_keys(request.store_prefix, name, *incarnation);
  const std::string& base = group_keys.base();
  const std::string my_key = group_keys.Rank(group_rank);
  COLLECTIVED_RETURN_IF_ERROR(
      request.store
          ->Set(my_key, EncodeAnnouncement(
                            AnnouncementOf(sidecar_id_, AdminAddress(), request, members_digest)))
          .WithContext("joining group '" + name + "'"));
  // Counted in, then one key to wait on: the rank that completes the count assembles the
  // membership from every announcement once, and everyone reads that record (no rank waits on
  // R keys, so the store's work grows with R, not R^2).
  COLLECTIVED_RETURN_IF_ERROR(
      request.store->Append(group_keys.Arrivals(), EncodeRankList({group_rank}))
          .WithContext("joining group '" + name + "'"));
  StatusOr<int64_t> arrived = request.store->Add(group_keys.Arrived(), 1);
  if (!arrived.ok()) return arrived.status().WithContext("joining group '" + name + "'");
  if (*arrived >= group_size) PublishMembership(request, group_keys, group_size, timeout);
  bool gave_up = false;
  Status all_here = WaitUnlessCancelled(*request.store, {group_keys.Membership()}, timeout,
                                        request.abandoned.get(), runtime_->clock(), &gave_up);
  if (gave_up) {
    LogInfo("join abandoned",
            {{"group", name}, {"rank", std::to_string(request.rank)}, {"why", all_here.message()}});
    // Withdraw the announcement, the count and the incarnation this join took (best effort), so
    // that the rank's next join meets the other ranks' first one under the same keys.
    (void)request.store->DeleteKey(my_key);
    (void)request.store->Add(group_keys.Arrived(), -1);
    (void)request.store->Add(GroupKeys::IncarnationCounter(request.store_prefix, name, group_rank),
                             -1);
    return all_here.WithContext("creating group '" + name + "' (rank " +
                                std::to_string(request.rank) + ") was abandoned");
  }
  if (!all_here.ok()) {
    if (!all_here.IsTimeout()) return all_here.WithContext("joining group '" + name + "'");
    return NeverFormed(request, group_keys, members, timeout, unsigned_store);
  }

  std::shared_ptr<Forming> forming;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& slot = forming_[base];
    if (!slot) slot = std::make_shared<Forming>();
    forming = slot;
  }
  bool form_here = false;
  {
    std::unique_lock<std::mutex> lock(forming->mutex);
    if (!forming->started) {
      forming->started = true;
      form_here = true;
    } else {
      forming->done_cv.wait(lock, [&] { return forming->done; });
    }
  }
  if (form_here) {
    StatusOr<Formed> formed = Form(request, group_keys, members, timeout, EpochStart());
    std::lock_guard<std::mutex> lock(forming->mutex);
    forming->done = true;
    forming->status = formed.status();
    if (formed.ok()) forming->formed = *formed;
    forming->done_cv.notify_all();
  }
  if (!forming->status.ok()) return forming->status;

  std::shared_ptr<Group> group = forming->formed.group;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Live& live = live_[name];
    if (live.group && live.group != group) {
      return Status::InvalidArgument("group '" + name +
                                     "' is still alive on this sidecar from an earlier " +
                                     "creation; destroy it on every local rank first");
    }
    if (!live.group) {
      live.group = group;
      live.parking = forming->formed.parking;
      live.store = forming->formed.store;
      live.movable_store = forming->formed.movable_store;
      live.keys_base = group_keys.base();
      WatchPeers(live, group_keys);
      if (request.fault_tolerance.shrinks()) {
        StartElasticLocked(live, request, group_keys);
      }
    }
    live.local_ranks.insert(group_rank);
  }
  LogInfo("joined group", {{"group", name},
                           {"rank", std::to_string(request.rank)},
                           {"group_rank", std::to_string(group_rank)},
                           {"group_size", std::to_string(group_size)},
                           {"sidecars", std::to_string(group->topology().node_count())},
                           {"local_ranks", FormatRanks(group->topology().local_ranks())}});
  return Membership{group, group_rank};
}

void GroupRegistry::WatchPeers(Live& live, const GroupKeys& keys) {
  std::shared_ptr<Group> group = live.group;
  const std::weak_ptr<Runtime> runtime = runtime_;
  const std::shared_ptr<MovableStore> movable = live.movable_store;
  const int generation = movable ? movable->generation() : 0;
  const GroupKeys round = keys.RollCallRound(generation);
  live.roll_call_watch = live.store->WaitAsync(
      {round.RollCall()}, kNoTimeout,
      [runtime, movable, generation, store = live.store, key = round.Alive(sidecar_id_)](Status s) {
        if (!s.ok()) {  // cancelled (the group is gone), or the store lost
          MoveStoreIfLost(runtime, movable, generation, s);
          return;
        }
        // Not on the store's completion thread (see below).
        if (auto alive = runtime.lock()) {
          alive->executor().Post([store, key] {
            Executor::Blocking blocking;
            (void)store->Set(key, "1");
          });
        }
      });
  live.failure_watch = live.store->WaitAsync(
      {keys.Failed()}, kNoTimeout,
      [runtime, movable, generation, weak = std::weak_ptr<Group>(group), store = live.store,
       failed = keys.Failed()](Status s) {
        if (!s.ok()) {  // cancelled (the group is gone), or the store lost
          MoveStoreIfLost(runtime, movable, generation, s);
          return;
        }
        // This runs on the store's completion thread (a gRPC callback thread for a remote
        // store), which must not block on another call to the store: read the reason on
        // the executor.
        auto alive = runtime.lock();
        if (!alive) return;
        alive->executor().Post([weak, store, failed] {
          Executor::Blocking blocking;
          auto group = weak.lock();
          if (!group) return;
          StatusOr<std::string> value = store->Get(failed, milliseconds(2000));
          if (value.status().kind() == ErrorKind::kPermissionDenied) {
            // Forged: not written by a member sidecar (SignedStore). The group goes on;
            // real failures still reach it through its connections.
            LogWarning("ignored a failure record the group's job token does not authenticate",
                       {{"group", group->name()}});
            return;
          }
          if (!value.ok()) {
            group->Fail(Status::PeerLost("a peer sidecar of group '" + group->name() +
                                         "' reported a failure"),
                        /*from_peer=*/true);
            return;
          }
          FailureRecord failure = DecodeFailureRecord(*value);
          group->Fail(failure.reason, /*from_peer=*/true, failure.completed_through);
        });
      });
}

void GroupRegistry::PublishMembership(const JoinRequest& request, const GroupKeys& keys,
                                      int group_size, milliseconds timeout) {
  // Every rank has counted itself in after announcing itself: the announcements are there.
  StatusOr<std::vector<std::string>> announced =
      request.store->MultiGet(keys.Ranks(group_size), timeout);
  GroupMembership membership;
  if (announced.ok()) {
    membership = AssembleMembership(request.name, *announced);
  } else {
    // A rank withdrew after being counted (its join was abandoned): nothing to publish; the
    // others time out naming who is missing.
    LogWarning("cannot assemble the membership of a group",
               {{"group", request.name}, {"error", announced.status().message()}});
    return;
  }
  Status published = request.store->Set(keys.Membership(), EncodeMembership(membership));
  if (!published.ok()) {
    LogWarning("cannot publish the membership of a group",
               {{"group", request.name}, {"error", published.message()}});
  }
}

Status GroupRegistry::NeverFormed(const JoinRequest& request, const GroupKeys& keys,
                                  const std::vector<int>& members, milliseconds timeout,
                                  Store& unsigned_store) {
  const std::string& name = request.name;
  const std::string what = "Timeout: creating group '" + name + "' (rank " +
                           std::to_string(request.rank) + ") Timed out after " +
                           std::to_string(timeout.count()) + " ms: ";
  // Who arrived, from the list every rank appended to: one read, however large the group. An
  // appended list carries no MAC, so it is read from the store beneath a group's signed records,
  // for this message only.
  StatusOr<std::string> arrivals = unsigned_store.Get(keys.Arrivals(), milliseconds(2000));
  StatusOr<std::vector<int>> arrived =
      arrivals.ok() ? DecodeRankList(*arrivals) : StatusOr<std::vector<int>>(arrivals.status());
  if (!arrived.ok()) {
    return Status::Timeout(what + "the ranks that never joined cannot be named (" +
                           arrived.status().message() + ")");
  }
  std::vector<bool> here(members.size(), false);
  for (int rank : *arrived) {
    if (rank >= 0 && rank < static_cast<int>(here.size())) here[rank] = true;
  }
  std::vector<int> missing;
  std::vector<int> missing_global;
  for (size_t r = 0; r < here.size(); ++r) {
    if (here[r]) continue;
    missing.push_back(static_cast<int>(r));
    missing_global.push_back(members[r]);
  }
  if (missing.empty()) {
    return Status::Timeout(what +
                           "every rank joined, but the membership was never published (the "
                           "sidecar of the last rank to join is gone, or one rank withdrew)");
  }
  return Status::Timeout(what + std::to_string(missing.size()) + " of " +
                         std::to_string(members.size()) + " group ranks " +
                         FormatRanksBounded(missing) + " (global ranks " +
                         FormatRanksBounded(missing_global) + ") never joined");
}

Status GroupRegistry::CheckJobToken(const JoinRequest& request, int group_rank, int first_member,
                                    milliseconds timeout) {
  const std::string& name = request.name;
  if (request.job_token.size() > kMaxJobTokenBytes) {
    return Status::InvalidArgument(
        "group '" + name + "': the job token has " + std::to_string(request.job_token.size()) +
        " bytes, more than the " + std::to_string(kMaxJobTokenBytes) + " accepted");
  }
  const std::string key = GroupKeys::TokenCommitment(request.store_prefix, name);
  const std::string mine =
      JobTokenCommitment(request.job_token, GroupKeys::TokenScope(request.store_prefix, name));
  std::string established;
  if (group_rank == 0) {
    // The first rank 0 to arrive fixes the group's token for good (for this store prefix and
    // name); a rank 0 that presents another token later is refused like any other rank.
    StatusOr<std::string> current = request.store->CompareSet(key, "", mine);
    if (!current.ok()) return current.status().WithContext("joining group '" + name + "'");
    established = *current;
  } else {
    bool gave_up = false;
    Status fixed = WaitUnlessCancelled(*request.store, {key}, timeout, request.abandoned.get(),
                                       runtime_->clock(), &gave_up);
    if (fixed.IsTimeout()) {
      return Status::Timeout("Timeout: creating group '" + name + "' (rank " +
                             std::to_string(request.rank) + ") Timed out after " +
                             std::to_string(timeout.count()) + " ms: group rank 0 (global rank " +
                             std::to_string(first_member) + ") never joined");
    }
    if (!fixed.ok()) {
      return fixed.WithContext("creating group '" + name + "' (rank " +
                               std::to_string(request.rank) + ")");
    }
    StatusOr<std::string> current = request.store->Get(key, timeout);
    if (!current.ok()) return current.status().WithContext("joining group '" + name + "'");
    established = *current;
  }
  if (ConstantTimeEquals(established, mine)) return Status::Ok();
  const std::string who = "group '" + name + "' (rank " + std::to_string(request.rank) + "): ";
  if (established == "none") {
    return Status::PermissionDenied(who +
                                    "the group was created without a job token, but this rank "
                                    "presented one; the rank is refused, the others go on");
  }
  if (request.job_token.empty()) {
    return Status::PermissionDenied(who +
                                    "the group was created with a job token and this rank "
                                    "presented none; the rank is refused, the others go on");
  }
  return Status::PermissionDenied(who +
                                  "the job token presented is not the one the group was "
                                  "created with; the rank is refused, the others go on");
}

StatusOr<GroupRegistry::Formed> GroupRegistry::Form(const JoinRequest& request,
                                                    const GroupKeys& keys,
                                                    const std::vector<int>& members,
                                                    milliseconds timeout, EpochStart start) {
  const std::string& name = request.name;
  // Every caller waited for the membership: a read, not a wait (in a store that moved since, it
  // may never come).
  StatusOr<std::string> record =
      request.store->Get(keys.Membership(), std::min(timeout, kRecordReadBudget));
  if (!record.ok()) return record.status().WithContext("forming group '" + name + "'");
  StatusOr<GroupMembership> membership = DecodeMembership(*record);
  if (!membership.ok()) return membership.status().WithContext("forming group '" + name + "'");
  if (!membership->refusal.ok()) return membership->refusal;
  if (membership->sidecar_of_rank.size() != members.size()) {
    return Status::InvalidArgument("group '" + name + "': the membership lists " +
                                   std::to_string(membership->sidecar_of_rank.size()) +
                                   " ranks, this rank names " + std::to_string(members.size()));
  }
  // Nodes are the membership's sidecars, in its order (that of their first rank, as every
  // sidecar reads it alike).
  StatusOr<GroupTopology> topology = GroupTopology::FromNodeOfRank(
      std::move(membership->sidecar_of_rank), membership->sidecar_ids, sidecar_id_);
  if (!topology.ok()) return topology.status().WithContext("group '" + name + "'");
  topology->node_addresses = std::move(membership->admin_addresses);

  ConnectRequest connect;
  connect.group = name;
  connect.device = request.device;
  connect.device_index = request.device_index;
  connect.topology = *topology;
  connect.store = std::make_shared<PrefixStore>(keys.TransportPrefix(), request.store);
  connect.timeout = timeout;
  connect.cancel = stopping_;
  StatusOr<GroupTransport> transport = transports_->Connect(connect);
  if (!transport.ok()) return transport.status();

  std::shared_ptr<Store> store = request.store;
  Group::Hooks hooks;
  hooks.publish_failure = [store, failed = keys.Failed()](const Status& reason,
                                                          uint64_t completed_through) {
    Executor::Blocking blocking;
    (void)store->Set(failed, EncodeFailure(reason, completed_through));
  };
  hooks.lookup_failure = [store, failed = keys.Failed()]() -> std::optional<Status> {
    Executor::Blocking blocking;
    // A failing sidecar publishes its reason before it closes its connections, and the store
    // answers in order, so a break that a failure caused finds the record already there. A
    // sidecar that died publishes nothing, and a wait for it would only delay the roll call that
    // names it: look, do not wait (the budget covers a record removed between the two calls).
    StatusOr<bool> published = store->Check({failed});
    if (!published.ok() || !*published) return std::nullopt;
    StatusOr<std::string> value = store->Get(failed, kFailureLookupBudget);
    if (!value.ok()) return std::nullopt;
    return DecodeFailure(*value);
  };
  // One roll call per group, however many sidecars see the break at once: the first to claim it
  // calls the roll (one wait on every peer's alive key, then a check of each only when some did
  // not answer) and publishes who did not answer; the others read that. Every sidecar calling
  // the roll on its own made S^2 store calls, and at 256 simulated sidecars live ones were named
  // as lost.
  auto roll_call_once = [store, me = sidecar_id_](
                            const GroupKeys& keys, const std::vector<std::string>& peer_ids,
                            milliseconds budget, const std::function<bool()>& moved,
                            bool can_move) -> std::optional<std::vector<int>> {
    if (!store->Set(keys.Alive(me), "1").ok()) return std::nullopt;
    StatusOr<int64_t> turn = store->Add(keys.RollCallClaim(), 1);
    if (!turn.ok()) return std::nullopt;
    // A movable store's waits go in slices, so that a move meanwhile ends this call at once (it
    // is called again in the new store).
    auto slice = [can_move](milliseconds whole) { return can_move ? milliseconds(50) : whole; };
    std::vector<int> silent;
    if (*turn != 1) {
      // Another sidecar calls the roll: its result lists ids (ours never: we answered first).
      const milliseconds within = budget + kRollCallResultMargin;
      Status published =
          can_move ? WaitInSlices(*store, {keys.RollCallResult()}, within, slice(within), moved)
                   : Status::Ok();
      StatusOr<std::string> result =
          published.ok() ? store->Get(keys.RollCallResult(), can_move ? kRecordReadBudget : within)
                         : StatusOr<std::string>(published);
      if (!result.ok()) return std::nullopt;
      std::map<std::string, int> index_of;
      for (size_t i = 0; i < peer_ids.size(); ++i) index_of[peer_ids[i]] = static_cast<int>(i);
      size_t begin = 0;
      while (begin < result->size()) {
        size_t end = result->find('\n', begin);
        if (end == std::string::npos) end = result->size();
        if (auto it = index_of.find(result->substr(begin, end - begin)); it != index_of.end()) {
          silent.push_back(it->second);
        }
        begin = end + 1;
      }
      std::sort(silent.begin(), silent.end());
      return silent;
    }
    // Every live member sidecar watches the roll-call key and answers with its alive key.
    if (!store->Set(keys.RollCall(), "1").ok()) return std::nullopt;
    std::vector<std::string> alive;
    for (const std::string& peer : peer_ids) alive.push_back(keys.Alive(peer));
    const Status all = WaitInSlices(*store, alive, budget, slice(budget), moved);
    if (moved() || (!all.ok() && !all.IsTimeout())) return std::nullopt;
    std::string published;
    for (size_t i = 0; all.IsTimeout() && i < peer_ids.size(); ++i) {
      StatusOr<bool> answered = store->Check({alive[i]});
      if (!answered.ok()) return std::nullopt;
      if (*answered) continue;
      silent.push_back(static_cast<int>(i));
      published += peer_ids[i] + "\n";
    }
    (void)store->Set(keys.RollCallResult(), published);
    return silent;
  };
  // A roll call the group's store moved during (MovableStore) is called again, whole, in the
  // store it moved to: its answers and its claim were split between two stores.
  hooks.roll_call = [roll_call_once, keys, movable = request.movable_store](
                        const std::vector<std::string>& peer_ids,
                        milliseconds budget) -> std::optional<std::vector<int>> {
    Executor::Blocking blocking;  // store calls, and a wait for the peers' answers
    return AgainIfMoved(movable, [&](int generation, const std::function<bool()>& moved) {
      return roll_call_once(keys.RollCallRound(generation), peer_ids, budget, moved,
                            movable != nullptr);
    });
  };
  if (options_.post_mortems) {
    hooks.on_failed = [post_mortems = options_.post_mortems, me = sidecar_id_](
                          const Group& group, const Status& reason, std::vector<OpRecord> records) {
      PostMortem post_mortem;
      post_mortem.group = group.name();
      post_mortem.sidecar_id = me;
      post_mortem.device = std::string(DeviceKindName(group.spec().device));
      post_mortem.members = group.spec().members;
      const GroupTopology& topology = group.topology();
      for (int rank = 0; rank < topology.group_size; ++rank) {
        const int node = topology.node_of_rank[rank];
        post_mortem.sidecar_of_rank.push_back(topology.node_ids[node]);
        post_mortem.address_of_rank.push_back(static_cast<size_t>(node) <
                                                      topology.node_addresses.size()
                                                  ? topology.node_addresses[node]
                                                  : "");
      }
      post_mortem.local_group_ranks = topology.local_ranks();
      post_mortem.sequence_number = group.SequenceNumber();
      post_mortem.failure = reason;
      post_mortem.failed_at = std::chrono::system_clock::now();
      post_mortem.records = std::move(records);
      post_mortems->Record(std::move(post_mortem));
    };
  }
  if (request.fault_tolerance.mode == FaultToleranceMode::kShrink) {
    hooks.sidecars_lost = WhileAlive(
        [this, name, epoch = start.epoch](const std::vector<int>& lost_nodes, const Status& why) {
          OnSidecarsLost(name, epoch, lost_nodes, why);
        });
  }
  auto parking = std::make_shared<Parking>();
  parking->parked = parked_;
  // The runtime outlives this hook: the registry keeps it until every parked group was released
  // (or forever, when one never finishes), and the release is what the hook posts. No strong
  // reference here: the hook runs on a runtime thread, which must never drop the runtime's last.
  hooks.on_quiescent = [runtime = runtime_.get(), parking] {
    // On whatever thread ended the group's last activity: the release may block, and must not
    // run inside the group's own call.
    runtime->executor().Post([parking] { parking->Release(); });
  };
  std::string token_scope = GroupKeys::TokenScope(request.store_prefix, name);
  std::string token_digest = JobTokenCommitment(request.job_token, token_scope);
  GroupSpec spec{name,
                 members,
                 request.device,
                 timeout,
                 options_.observer,
                 options_.flight_recorder_size,
                 std::move(token_digest),
                 std::move(token_scope),
                 options_.stuck_threshold,
                 options_.max_ops_in_flight,
                 options_.summary_agreement_from_nodes,
                 options_.split_digest_above_ranks,
                 request.fault_tolerance,
                 start.epoch,
                 start.first_sequence_number,
                 std::move(start.group_members)};
  auto group = std::make_shared<Group>(std::move(spec), std::move(*topology), std::move(*transport),
                                       std::move(hooks), *runtime_);
  return Formed{std::move(group), std::move(parking), request.store, request.movable_store};
}

}  // namespace collectived
