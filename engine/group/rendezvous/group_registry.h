// GroupRegistry: the groups this sidecar takes part in. Joining a group is a rendezvous in a
// store: every rank announces which sidecar hosts it, the sidecars learn the topology from the
// store and connect among themselves through the TransportFactory (a control channel and a data
// backend for the group's device kind). Each (re)creation of a name is a new incarnation with
// its own keys (GroupKeys), so a destroyed group can be created again.
//
// Thread-safety: every method may be called from any thread; Join blocks for the rendezvous.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "engine/concurrency/activity_count.h"
#include "engine/concurrency/cancel_token.h"
#include "engine/concurrency/lifeline.h"
#include "engine/concurrency/runtime.h"
#include "engine/group/core/group.h"
#include "engine/group/core/post_mortems.h"
#include "engine/group/rendezvous/group_keys.h"
#include "engine/group/rendezvous/group_records.h"
#include "engine/group/transport/transport_factory.h"
#include "engine/store/movable_store.h"
#include "engine/store/store.h"

namespace collectived {

// The largest world size a group may name. Every rank of a group gets state and a store key on
// each of its sidecars, so a request must not make the sidecar build them for absurd sizes;
// this is beyond the largest jobs run today.
inline constexpr int kMaxWorldSize = 1 << 17;

struct JoinRequest {
  std::string name;
  int rank = 0;  // global rank
  int world_size = 0;
  std::vector<int> members;      // global ranks; empty = all; any order
  std::shared_ptr<Store> store;  // where the ranks meet
  std::string store_prefix;
  // The other stores of the group's address list (store_addresses.h), in order: where the
  // group's store moves, when it is lost, before its own sidecars'.
  std::vector<std::string> store_fallbacks;
  DeviceKind device = DeviceKind::kCpu;  // the memory the group's tensors live in
  int device_index = 0;                  // kCuda: the GPU; the local ranks of a group share one
  // How long the rendezvous and, by default, each op may take (kUseDefaultJoinTimeout: what a
  // client that names none gets).
  std::chrono::milliseconds timeout = kUseDefaultJoinTimeout;
  std::string job_token;
  // Cancelled when the joiner goes away (its session ended, its call was cancelled): the join
  // stops at once with the token's reason. Null: never abandoned.
  std::shared_ptr<CancelToken> abandoned;
  // What the group does when it loses a rank; every rank must ask for the same.
  FaultTolerance fault_tolerance;
  // Set by the registry, not by callers: a shrinking group's `store` seen through the store that
  // moves to a surviving sidecar's when it is lost (GroupRegistryOptions::store_at).
  std::shared_ptr<MovableStore> movable_store;
};

struct Membership {
  std::shared_ptr<Group> group;
  int group_rank = 0;
  // The rank joined a running shrinking group as the replacement of a lost rank: its first op
  // is the group's next one (Group::SequenceNumber), and its state comes from a live rank.
  bool replacement = false;
  uint64_t sequence_number = 0;  // the ops the rank issued before (a replacement: the group's)
};

struct GroupRegistryOptions {
  // Identifies this sidecar uniquely among its peers.
  std::string sidecar_id;
  // The address the data transports listen on and announce to peers.
  std::string advertise_host;
  // Builds each group's connections; null = SidecarTransportFactory(advertise_host).
  std::shared_ptr<TransportFactory> transports;
  // Told about every finished and every stuck op; may be null.
  std::shared_ptr<OpObserver> observer;
  // Finished ops kept per group by the flight recorder.
  size_t flight_recorder_size = 256;
  // An op in flight longer than this is logged once (with the ranks that have not arrived) and
  // reported to the observer.
  std::chrono::milliseconds stuck_threshold{std::chrono::seconds(60)};
  // Ops of a device group enqueued and not yet complete, at most (GroupSpec).
  size_t max_ops_in_flight = 16;
  // Groups of at least this many sidecars agree on ops through combined summaries (GroupSpec).
  int summary_agreement_from_nodes = 64;
  // Groups of more ranks than this check alltoall split sizes through digests (GroupSpec).
  int split_digest_above_ranks = 2048;
  // The sidecar's threads and clock, shared by every group. Null: the registry starts its own
  // (default options, the real clock).
  std::shared_ptr<Runtime> runtime;
  // The address of this sidecar's gRPC listener (host:port), announced with every rank so that
  // tools can ask each sidecar of a group; may be null (announced as "").
  std::function<std::string()> admin_address;
  // Where the final state of groups that fail goes (kept, logged, written); may be null.
  std::shared_ptr<PostMortems> post_mortems;
  // The rendezvous store of the sidecar at `address` (a peer's admin address; "" for this
  // sidecar's own). A shrinking group whose store is lost moves to the store of the lowest
  // sidecar of its epoch that answers (MovableStore). Null: such a group fails with its store.
  std::function<StatusOr<std::shared_ptr<Store>>(const std::string& address)> store_at;
};

class GroupRegistry {
 public:
  explicit GroupRegistry(GroupRegistryOptions options);
  ~GroupRegistry();

  // Joins the calling rank to a group (blocking until every member has joined through its own
  // sidecar, or the timeout passes). Returns InvalidArgument for bad arguments (rank not a
  // member: "rank 3 is not part of group 'g'"), Timeout naming the ranks that never arrived,
  // Unavailable when the sidecars of the group cannot connect.
  StatusOr<Membership> Join(const JoinRequest& request);

  // The rank leaves the group; the group is torn down when its last local rank leaves.
  // Returns NotFound for an unknown group or rank.
  Status Leave(const std::string& name, int group_rank);

  // Fails the pending ops of one local rank with `reason`. NotFound if unknown.
  Status AbortRank(const std::string& name, int group_rank, const Status& reason);

  // Fails the group with `reason` (a lost rank, an operator's abort). NotFound if unknown.
  Status FailGroup(const std::string& name, const Status& reason);

  // Submits an op of local rank `group_rank` (the group's own numbering, as Join returned it) to
  // the group's current epoch: as it is, or translated for a shrinking group that lost ranks
  // (EpochView), and queued while such a group changes epochs. A failed work (InvalidArgument)
  // for an unknown group or rank.
  std::shared_ptr<Work> Submit(const std::string& name, int group_rank, OpRequest request);
  // The collectives `group_rank` issued so far in the group, across its epochs (0 when unknown),
  // and the most any local rank issued.
  uint64_t SequenceNumber(const std::string& name, int group_rank) const;
  uint64_t SequenceNumber(const std::string& name) const;

  // Whether the group shrinks when it loses a rank (JoinRequest::fault_tolerance).
  bool Shrinks(const std::string& name) const;
  // A local rank of a shrinking group is lost (its session ended): instead of failing, the group
  // cuts its epoch after the rank's last op and goes on among the live ranks
  // (docs/fault-tolerance.md); the rank's ops up to the cut still run. The rank then leaves
  // (Leave) as usual. NotFound for an unknown group or rank, InvalidArgument for a group that
  // does not shrink.
  Status LoseRank(const std::string& name, int group_rank, const Status& reason);

  // ---- replacements: a shrinking group grows back (docs/fault-tolerance.md) ----
  // The job admits replacements (it marks step boundaries and hands a replacement its state):
  // until some rank says so, a process that joins as a lost rank is refused at once.
  Status AcceptReplacements(const std::string& name, int group_rank);
  // The lost group ranks whose replacement waits to be admitted, as this sidecar saw them.
  StatusOr<std::vector<int>> Replacements(const std::string& name, int group_rank) const;
  // Local rank `group_rank` admits the replacements for lost group ranks `joiners` after its op
  // `after_sequence` (its last one: every live rank calls this at the same step boundary). The
  // epoch retires at that cut and the next one takes the replacements in; a change already
  // under way (a loss) takes precedence, and the replacements wait for a later admission.
  // InvalidArgument for a joiner that is not a lost rank or a cut that is not the rank's last op.
  Status Admit(const std::string& name, int group_rank, uint64_t after_sequence,
               std::vector<int> joiners);
  // The group's current membership epoch as this sidecar follows it (0: none or fail-fast).
  int Epoch(const std::string& name) const;

  std::shared_ptr<Group> Find(const std::string& name) const;
  std::vector<std::shared_ptr<Group>> List() const;

  // Fails every group with `reason` (the sidecar is stopping) and refuses new joins.
  void Shutdown(const Status& reason);

  // The runtime the groups run on.
  Runtime& runtime() const { return *runtime_; }
  // The final state of the last groups that failed here; null when none are kept.
  const PostMortems* post_mortems() const { return options_.post_mortems.get(); }

 private:
  // options_.admin_address's answer, or "".
  std::string AdminAddress() const;
  struct Forming;
  struct Parking;
  struct Elastic;
  struct Live {
    std::shared_ptr<Group> group;
    // Where the group waits, once destroyed, until it is quiescent; then a task of the executor
    // destroys it and removes its keys.
    std::shared_ptr<Parking> parking;
    std::set<int> local_ranks;  // group ranks that have not left
    std::shared_ptr<Store> store;
    // A shrinking group's: what `store` moves with when its sidecar is lost; null otherwise.
    std::shared_ptr<MovableStore> movable_store;
    std::string keys_base;  // GroupKeys::base() of the incarnation
    WaitId failure_watch = kInvalidWaitId;
    WaitId roll_call_watch = kInvalidWaitId;  // answers a peer's roll call (Group::Hooks)
    // A shrinking group's chain of epochs (group_epochs.cc); null for a fail-fast group.
    std::shared_ptr<Elastic> elastic;
  };

  // Join once the request is checked and its token accepted: the rendezvous proper.
  // `unsigned_store`: the store beneath request.store's signatures (the same store without a job
  // token), for the arrivals list, which an Append cannot sign.
  StatusOr<Membership> JoinChecked(const JoinRequest& request, const std::vector<int>& members,
                                   int group_rank, const std::string& members_digest,
                                   std::chrono::milliseconds timeout, Store& unsigned_store);
  // Join of a process as lost group rank `group_rank` of the running incarnation `running`
  // (group_epochs.cc): claims the rank, asks the live ranks to admit it and waits until an epoch
  // takes it in.
  StatusOr<Membership> JoinAsReplacement(const JoinRequest& request,
                                         const std::vector<int>& members, int group_rank,
                                         const GroupKeys& running,
                                         std::chrono::milliseconds timeout);
  // The replacement's epoch `epoch` formed (its members include it): it takes part here, in the
  // Group this sidecar formed for its other ranks or in one of its own.
  StatusOr<Membership> EnterAsReplacement(const JoinRequest& request,
                                          const std::vector<int>& members, int group_rank,
                                          const GroupKeys& running, int epoch,
                                          std::chrono::steady_clock::time_point deadline);
  // MembersDigest of `members`; that of the whole world is kept for the next rank, as every
  // rank of a large default group would compute the same O(R) digest.
  std::string DigestOf(const std::vector<int>& members, bool whole_world);

  // Refuses a joiner whose job token is not the one the group was first created with
  // (PermissionDenied; InvalidArgument for an oversized token), before it takes part: rank 0
  // fixes the token, the other ranks wait for it (Timeout if rank 0 never comes).
  Status CheckJobToken(const JoinRequest& request, int group_rank, int first_member,
                       std::chrono::milliseconds timeout);

  // The last rank to be counted in: reads every announcement once and publishes the group's
  // membership (or why it cannot form) for every rank to read. Best effort: when it cannot,
  // the ranks time out naming who is missing.
  void PublishMembership(const JoinRequest& request, const GroupKeys& keys, int group_size,
                         std::chrono::milliseconds timeout);
  // The Timeout of a join whose membership never came: the group ranks that never joined (the
  // first few, then how many more), read from the arrivals list in `unsigned_store`.
  Status NeverFormed(const JoinRequest& request, const GroupKeys& keys,
                     const std::vector<int>& members, std::chrono::milliseconds timeout,
                     Store& unsigned_store);

  struct Formed {
    std::shared_ptr<Group> group;
    std::shared_ptr<Parking> parking;
    // The store its hooks use (the forming rank's request's), which every local rank's use of
    // the group must share: a shrinking group's moves with one MovableStore.
    std::shared_ptr<Store> store;
    std::shared_ptr<MovableStore> movable_store;
  };
  // Where a shrinking group's epoch starts (GroupSpec's fields of the same names).
  struct EpochStart {
    int epoch = 0;
    uint64_t first_sequence_number = 1;
    std::vector<int> group_members;
  };
  // The Group of an incarnation's first epoch, or of a later epoch of a shrinking group, once
  // its membership is published.
  StatusOr<Formed> Form(const JoinRequest& request, const GroupKeys& keys,
                        const std::vector<int>& members, std::chrono::milliseconds timeout,
                        EpochStart start);
  // Watches the keys a live group's peers write (a published failure, a roll call).
  void WatchPeers(Live& live, const GroupKeys& keys);
  // What a group's store moves to, the same list on every sidecar: the stores of `fallbacks`
  // (JoinRequest::store_fallbacks), then those of the sidecars of its epoch `group` in its node
  // order (null: none yet, a join).
  std::vector<MovableStore::Successor> StoreSuccessors(const std::vector<std::string>& fallbacks,
                                                       const Group* group) const;
  // A watch of `movable` (generation `generation`) failed with `status`: when the store is
  // unreachable, moves it (on `runtime`'s executor; OnStoreMoved re-arms the watches). Static:
  // a watch's callback may run while the registry goes.
  static void MoveStoreIfLost(const std::weak_ptr<Runtime>& runtime,
                              const std::shared_ptr<MovableStore>& movable, int generation,
                              const Status& status);
  // The group's store moved to `to` (generation `generation`): the watches are armed again in
  // it, and the change records of the epoch are read from its first (on the executor).
  void OnStoreMoved(const std::string& name, const std::weak_ptr<MovableStore>& movable,
                    int generation, const std::string& to);
  // What a moved store lacks and a replacement reads (GroupKeys: the token commitment, the
  // incarnation counters of `local_ranks` and of the lost ranks, the lost ranks, whether the job
  // admits replacements, the current epoch and its membership), written in it by every
  // survivor, each value the same on all of them.
  Status CarryIntoMovedStore(const Elastic& elastic, const Group& group,
                             const std::vector<int>& local_ranks, bool accepts) const;

  // ---- a shrinking group's epochs (group_epochs.cc) ----
  // Sets up the chain of epochs of a shrinking group that just formed here (requires mutex_).
  void StartElasticLocked(Live& live, const JoinRequest& request, const GroupKeys& keys);
  // Runs `task` on the executor, counted so that the registry outlives it.
  void PostEpochTask(std::function<void()> task);
  // `fn` (which may use this registry) made safe to call on another thread at any time: it runs
  // only while the registry lives, and the destructor waits for a call in progress.
  template <typename Fn>
  auto WhileAlive(Fn fn) {
    return [life = life_, fn = std::move(fn)](auto&&... args) {
      life->RunIfAlive([&] { fn(std::forward<decltype(args)>(args)...); });
    };
  }
  bool Stopping() const { return !stopping_->reason().ok(); }
  // Watches the current epoch's next loss record (requires mutex_).
  void WatchLossesLocked(const std::string& name, const std::shared_ptr<Elastic>& elastic);
  // What the current epoch calls once it retired here (Group::Retire).
  Group::RetiredCallback OnRetired(const std::string& name,
                                   const std::shared_ptr<Elastic>& elastic);
  // Appends `change` to epoch `epoch`'s list (blocks on the store).
  Status PublishChange(const Elastic& elastic, int epoch, const ChangeRecord& change);
  // Publishes that `group_rank` was lost in `epoch` after its op `cut` (blocks on the store).
  Status PublishLoss(const Elastic& elastic, int epoch, int group_rank, uint64_t cut,
                     const std::string& cause);
  // Nothing of this sidecar's is in the next epoch: the group fails here and goes once its ranks
  // left. `keys_stay`: the group goes on elsewhere, or its keys went with it already, so this
  // sidecar leaves them to others instead of counting itself out.
  void DropOut(const std::string& name, const std::shared_ptr<Elastic>& elastic, bool keys_stay);
  // The last sidecar to announce its part in epoch `next` publishes its members and membership.
  void PublishEpoch(const Elastic& elastic, int next, int nodes);
  // Makes the formed epoch the group's current one and stops the retired one.
  void Install(const std::string& name, const std::shared_ptr<Elastic>& elastic,
               const GroupKeys& keys, Formed formed);
  // The group leaves this sidecar: its watches cancelled, its group parked (Leave).
  void TearDown(const std::string& name, Live& doomed);
  // A loss record of the epoch arrived in the store of generation `store_generation`: retire at
  // the cut (on the executor).
  void OnLossRecord(const std::string& name, std::shared_ptr<Elastic> elastic, int epoch,
                    int64_t record, int store_generation);
  // Peer sidecars of epoch `epoch` were lost (Group::Hooks::sidecars_lost, on the executor):
  // tells the other survivors (a kSidecarsLost record) and starts the cut here.
  void OnSidecarsLost(const std::string& name, int epoch, const std::vector<int>& lost_nodes,
                      const Status& why);
  // Freezes the current epoch after the loss of `lost_nodes` (learned here or from a record);
  // once frozen, AgreeSidecarCut runs on the executor.
  void StartSidecarCut(const std::string& name, const std::shared_ptr<Elastic>& elastic, int epoch,
                       const std::vector<int>& lost_nodes, const std::string& cause);
  // The frozen epoch's survivors publish how far their data phases got and retire it at the
  // lowest (blocks on the store); the lowest survivor announces the lost sidecars' part in the
  // next epoch (none) in their place.
  void AgreeSidecarCut(const std::string& name, const std::shared_ptr<Elastic>& elastic, int epoch,
                       const std::vector<int>& lost_nodes, uint64_t finished_through);
  // The lowest survivor's part after losing `lost_nodes` of epoch `epoch` retired at `cut`:
  // their ranks are marked lost and their part in the next epoch (none) announced in their
  // place (blocks on the store).
  Status AnnounceLostSidecars(const Elastic& elastic, const Group& group, int epoch,
                              const std::vector<int>& lost_nodes, uint64_t cut);
  // The next epoch is slow to form: the sidecars of epoch `epoch` that did not announce their
  // part and do not answer a roll call are lost (they died after it retired); the lowest
  // sidecar that answered announces their part in their place (blocks on the store).
  void ReplaceSilentSidecars(const std::string& name, const std::shared_ptr<Elastic>& elastic,
                             int epoch, uint64_t cut);
  // The epoch retired here: forms the next one and submits the ops taken back to it (on the
  // executor; blocks on the store).
  void NextEpoch(const std::string& name, std::shared_ptr<Elastic> elastic,
                 std::vector<Group::TakenBack> taken);
  // Submits what the transition queued, in order, to the epoch just installed.
  void DrainQueued(const std::string& name, const std::shared_ptr<Elastic>& elastic);
  // Fails everything a transition queued with `reason` and fails the group.
  void FailTransition(const std::string& name, const std::shared_ptr<Elastic>& elastic,
                      const Status& reason);
  // Parks a destroyed group (stopping it) until it is quiescent.
  void Park(Live& live);

  // Counts this sidecar out of the incarnation at `keys_base`; the last of its `sidecars` to
  // leave deletes the incarnation's keys (announcements, transport, failure, roll call).
  static void RemoveKeysOnceAllLeft(Store& store, const std::string& keys_base, int sidecars);

  const GroupRegistryOptions options_;
  const std::string& sidecar_id_ = options_.sidecar_id;
  const std::shared_ptr<Runtime> runtime_;
  const std::shared_ptr<TransportFactory> transports_;

  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Forming>> forming_;  // by incarnation key base
  std::map<std::string, Live> live_;                         // by group name
  // Counts the parked groups, shared with their Parkings (which outlive the registry when a
  // group never becomes quiescent).
  const std::shared_ptr<ActivityCount> parked_;
  Status shutdown_;  // guarded by mutex_
  // Notified (with mutex_) whenever a shrinking group installs an epoch or fails: a replacement
  // on a sidecar that already follows the group waits on it.
  std::condition_variable epoch_changed_;
  // What callbacks on other threads (store watches, groups' hooks, the epoch tasks of shrinking
  // groups) hold instead of the registry: its destructor retires it before anything they use
  // goes, and waits for the ones running.
  const std::shared_ptr<Lifeline> life_ = std::make_shared<Lifeline>();
  // Cancelled when the sidecar stops: the connects and waits of an epoch in progress end at once.
  const std::shared_ptr<CancelToken> stopping_ = std::make_shared<CancelToken>();

  std::mutex digest_mutex_;
  int world_digest_size_ = -1;  // guarded by digest_mutex_
  std::string world_digest_;    // guarded by digest_mutex_
};

}  // namespace collectived
