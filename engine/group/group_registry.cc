#include "engine/group/group_registry.h"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "engine/group/group_records.h"
#include "engine/group/job_token.h"
#include "engine/group/sidecar_transport_factory.h"
#include "engine/group/signed_store.h"
#include "engine/logging.h"
#include "engine/store/prefix_store.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

// How long the registry's destructor waits for stopped groups' threads before leaving the rest
// to the process exit.
constexpr milliseconds kShutdownReapBudget{1000};
// How often a join waiting for other ranks asks whether its joiner went away.
constexpr milliseconds kAbandonedPollPeriod{100};

RankAnnouncement AnnouncementOf(const std::string& sidecar_id, const JoinRequest& request,
                                const std::vector<int>& members) {
  return RankAnnouncement{
      sidecar_id, request.world_size, MembersDigest(members),
      JobTokenCommitment(request.job_token,
                         GroupKeys::TokenScope(request.store_prefix, request.name)),
      request.device == DeviceKind::kCuda ? "cuda:" + std::to_string(request.device_index)
                                          : std::string("cpu")};
}

std::shared_ptr<TransportFactory> TransportsOf(const GroupRegistryOptions& options) {
  if (options.transports) return options.transports;
  return std::make_shared<SidecarTransportFactory>(options.advertise_host);
}

// Waits for `keys` like Store::Wait, but gives up as soon as `abandoned` returns an error (the
// joiner went away; `*gave_up` is then true): a join nobody waits for must not hold a server
// thread until its timeout.
Status WaitUnlessAbandoned(Store& store, const std::vector<std::string>& keys, milliseconds timeout,
                           const std::function<Status()>& abandoned, bool* gave_up) {
  *gave_up = false;
  if (!abandoned) return store.Wait(keys, timeout);
  struct Outcome {
    std::mutex mutex;
    std::condition_variable done;
    std::optional<Status> status;
  };
  auto outcome = std::make_shared<Outcome>();
  const WaitId id = store.WaitAsync(keys, timeout, [outcome](Status status) {
    std::lock_guard<std::mutex> lock(outcome->mutex);
    outcome->status = std::move(status);
    outcome->done.notify_all();
  });
  std::unique_lock<std::mutex> lock(outcome->mutex);
  while (!outcome->done.wait_for(lock, kAbandonedPollPeriod,
                                 [&] { return outcome->status.has_value(); })) {
    if (Status gone = abandoned(); !gone.ok()) {
      lock.unlock();
      store.CancelWait(id);
      *gave_up = true;
      return gone;
    }
  }
  return *outcome->status;
}

}  // namespace

struct GroupRegistry::Forming {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool started = false;
  bool done = false;
  Status status;
  std::shared_ptr<Group> group;
};

GroupRegistry::GroupRegistry(GroupRegistryOptions options)
    : options_(std::move(options)), transports_(TransportsOf(options_)) {
  watchdog_ = std::thread([this] { WatchdogLoop(); });
}

void GroupRegistry::WatchdogLoop() {
  const milliseconds period =
      std::clamp(options_.stuck_threshold / 4, milliseconds(50), milliseconds(1000));
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    watchdog_wakeup_.wait_for(lock, period);
    if (stopping_) break;
    lock.unlock();
    ReapStopped();  // queues the key removals of destroyed groups whose threads have exited
    std::vector<KeyRemoval> removals;
    {
      std::lock_guard<std::mutex> removals_lock(mutex_);
      removals.swap(key_removals_);
    }
    for (const KeyRemoval& removal : removals) {
      RemoveKeysOnceAllLeft(*removal.store, removal.keys_base, removal.sidecars);
    }
    for (const auto& group : List()) {
      for (const OpRecord& record : group->TakeNewlyStuck(options_.stuck_threshold)) {
        LogWarning(
            "collective stuck",
            {{"group", record.group},
             {"seq", std::to_string(record.sequence_number)},
             {"op", std::string(OpKindName(record.kind))},
             {"state", std::string(OpStateName(record.state))},
             {"age_ms", std::to_string(record.duration.count() / 1000)},
             {"missing_local_ranks", FormatRanks(record.missing_ranks)},
             {"hint", record.missing_ranks.empty()
                          ? "waiting for ranks on other sidecars: run collectivectl describe there"
                          : "these ranks of this sidecar have not issued the op"}});
        if (options_.observer) options_.observer->OnOpStuck(record);
      }
    }
    lock.lock();
  }
}

GroupRegistry::~GroupRegistry() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  watchdog_wakeup_.notify_all();
  watchdog_.join();
  std::map<std::string, Live> live;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    live.swap(live_);
    forming_.clear();  // its entries hold the groups too
  }
  for (auto& [name, entry] : live) {
    for (WaitId watch : {entry.failure_watch, entry.roll_call_watch}) {
      if (watch != kInvalidWaitId) entry.store->CancelWait(watch);
    }
    entry.group->Stop();
    stopped_.push_back(entry.group);
  }
  live.clear();
  // Executors exit within milliseconds of Stop; only a transfer blocked in the transport until
  // its own timeout takes longer. Give the quick ones their moment, bounded.
  const auto deadline = std::chrono::steady_clock::now() + kShutdownReapBudget;
  for (ReapStopped(); HasStopped() && std::chrono::steady_clock::now() < deadline; ReapStopped()) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  if (!stopped_.empty()) {
    // Threads still blocked in Gloo until their timeout: leave them to the process exit rather
    // than hang the shutdown.
    LogWarning("groups still finishing at shutdown", {{"count", std::to_string(stopped_.size())}});
    // Reachable from a static, so that leak checkers do not report what is left on purpose.
    static std::mutex unfinished_mutex;
    static auto* unfinished = new std::vector<std::shared_ptr<Group>>();
    std::lock_guard<std::mutex> lock(unfinished_mutex);
    unfinished->insert(unfinished->end(), stopped_.begin(), stopped_.end());
  }
}

bool GroupRegistry::HasStopped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !stopped_.empty();
}

void GroupRegistry::ReapStopped() {
  std::vector<std::shared_ptr<Group>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = stopped_.begin(); it != stopped_.end();) {
      if ((*it)->ThreadsExited() && it->use_count() == 1) {
        // Only now may the group's keys go: its threads no longer read them (a failure's roll
        // call waits for the peers' alive keys).
        if (auto removal = pending_removals_.find(it->get()); removal != pending_removals_.end()) {
          if (!stopping_) key_removals_.push_back(std::move(removal->second));
          pending_removals_.erase(removal);
        }
        finished.push_back(std::move(*it));
        it = stopped_.erase(it);
      } else {
        ++it;
      }
    }
  }
  finished.clear();  // joins their (already exited) threads
}

StatusOr<Membership> GroupRegistry::Join(const JoinRequest& request) {
  ReapStopped();
  const std::string& name = request.name;
  if (name.empty()) return Status::InvalidArgument("group name is empty");
  if (request.world_size < 1) {
    return Status::InvalidArgument("group '" + name + "': world size " +
                                   std::to_string(request.world_size) + " is not positive");
  }
  if (request.world_size > kMaxWorldSize) {
    return Status::InvalidArgument(
        "group '" + name + "': world size " + std::to_string(request.world_size) +
        " is larger than " + std::to_string(kMaxWorldSize) + ", the most this sidecar accepts");
  }
  if (request.members.size() > static_cast<size_t>(request.world_size)) {
    return Status::InvalidArgument(
        "group '" + name + "': " + std::to_string(request.members.size()) +
        " members listed for world size " + std::to_string(request.world_size));
  }
  if (request.rank < 0 || request.rank >= request.world_size) {
    return Status::InvalidArgument("group '" + name + "': rank " + std::to_string(request.rank) +
                                   " is out of range for world size " +
                                   std::to_string(request.world_size));
  }
  std::vector<int> members = request.members;
  if (members.empty()) {
    for (int r = 0; r < request.world_size; ++r) members.push_back(r);
  }
  std::sort(members.begin(), members.end());
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] < 0 || members[i] >= request.world_size) {
      return Status::InvalidArgument(
          "group '" + name + "': member rank " + std::to_string(members[i]) +
          " is out of range for world size " + std::to_string(request.world_size));
    }
    if (i > 0 && members[i] == members[i - 1]) {
      return Status::InvalidArgument("group '" + name + "': member rank " +
                                     std::to_string(members[i]) + " is listed twice");
    }
  }
  auto position = std::find(members.begin(), members.end(), request.rank);
  if (position == members.end()) {
    return Status::InvalidArgument("rank " + std::to_string(request.rank) +
                                   " is not part of group '" + name + "' (members " +
                                   FormatRanks(members) + ")");
  }
  if (!request.store) return Status::InvalidArgument("group '" + name + "': no rendezvous store");
  COLLECTIVED_RETURN_IF_ERROR(transports_->CheckDevice(name, request.device));
  if (request.timeout.count() < 0) {
    return Status::InvalidArgument("group '" + name + "': negative timeout");
  }
  if (request.timeout > kMaxTimeout) {
    return Status::InvalidArgument("group '" + name + "': timeout " +
                                   std::to_string(request.timeout.count()) +
                                   " ms is longer than the longest accepted, " +
                                   std::to_string(kMaxTimeout.count()) + " ms (7 days)");
  }
  const int group_rank = static_cast<int>(position - members.begin());
  const milliseconds timeout =
      request.timeout == kUseDefaultJoinTimeout ? kDefaultGroupTimeout : request.timeout;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!shutdown_.ok()) return shutdown_;
    auto it = live_.find(name);
    if (it != live_.end() && it->second.local_ranks.count(group_rank)) {
      return Status::InvalidArgument("rank " + std::to_string(request.rank) +
                                     " already belongs to group '" + name +
                                     "'; destroy it before creating it again");
    }
  }

  // A joiner whose job token is not the group's is refused here, before it takes an incarnation
  // or announces itself: the rightful ranks form the group without it.
  COLLECTIVED_RETURN_IF_ERROR(CheckJobToken(request, group_rank, members[0], timeout));
  if (request.job_token.empty()) return JoinChecked(request, members, timeout);
  // From here on the group's records are authenticated with its token: not even another
  // sidecar can forge them.
  JoinRequest authenticated = request;
  authenticated.store = std::make_shared<SignedStore>(
      request.store,
      JobRecordKey(request.job_token, GroupKeys::TokenScope(request.store_prefix, name)));
  return JoinChecked(authenticated, members, timeout);
}

StatusOr<Membership> GroupRegistry::JoinChecked(const JoinRequest& request,
                                                const std::vector<int>& members,
                                                milliseconds timeout) {
  const std::string& name = request.name;
  const int group_rank =
      static_cast<int>(std::find(members.begin(), members.end(), request.rank) - members.begin());
  const int group_size = static_cast<int>(members.size());
  StatusOr<int64_t> incarnation =
      request.store->Add(GroupKeys::IncarnationCounter(request.store_prefix, name, group_rank), 1);
  if (!incarnation.ok()) return incarnation.status().WithContext("joining group '" + name + "'");
  const GroupKeys group_keys(request.store_prefix, name, *incarnation);
  const std::string& base = group_keys.base();
  const std::vector<std::string> keys = group_keys.Ranks(group_size);
  COLLECTIVED_RETURN_IF_ERROR(
      request.store
          ->Set(keys[group_rank], EncodeAnnouncement(AnnouncementOf(sidecar_id_, request, members)))
          .WithContext("joining group '" + name + "'"));
  bool gave_up = false;
  Status all_here = WaitUnlessAbandoned(*request.store, keys, timeout, request.abandoned, &gave_up);
  if (gave_up) {
    LogInfo("join abandoned",
            {{"group", name}, {"rank", std::to_string(request.rank)}, {"why", all_here.message()}});
    // Withdraw the announcement and the incarnation this join took (best effort), so that the
    // rank's next join meets the other ranks' first one under the same keys.
    (void)request.store->DeleteKey(keys[group_rank]);
    (void)request.store->Add(GroupKeys::IncarnationCounter(request.store_prefix, name, group_rank),
                             -1);
    return all_here.WithContext("creating group '" + name + "' (rank " +
                                std::to_string(request.rank) + ") was abandoned");
  }
  if (!all_here.ok()) {
    if (!all_here.IsTimeout()) return all_here.WithContext("joining group '" + name + "'");
    std::vector<int> missing;
    for (int r = 0; r < group_size; ++r) {
      StatusOr<bool> present = request.store->Check({keys[r]});
      if (present.ok() && !*present) missing.push_back(r);
    }
    std::vector<int> missing_global;
    for (int r : missing) missing_global.push_back(members[r]);
    return Status::Timeout(
        "Timeout: creating group '" + name + "' (rank " + std::to_string(request.rank) +
        ") Timed out after " + std::to_string(timeout.count()) + " ms: group ranks " +
        FormatRanks(missing) + " (global ranks " + FormatRanks(missing_global) + ") never joined");
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
    StatusOr<std::shared_ptr<Group>> group = Form(request, group_keys, members, timeout);
    std::lock_guard<std::mutex> lock(forming->mutex);
    forming->done = true;
    forming->status = group.status();
    if (group.ok()) forming->group = *group;
    forming->done_cv.notify_all();
  }
  if (!forming->status.ok()) return forming->status;

  std::shared_ptr<Group> group = forming->group;
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
      live.store = request.store;
      live.keys_base = group_keys.base();
      live.roll_call_watch = request.store->WaitAsync(
          {group_keys.RollCall()}, kNoTimeout,
          [store = request.store, key = group_keys.Alive(sidecar_id_)](Status s) {
            if (!s.ok()) return;  // cancelled: the group is gone
            // Not on the store's completion thread (see below).
            std::thread([store, key] { (void)store->Set(key, "1"); }).detach();
          });
      live.failure_watch = request.store->WaitAsync(
          {group_keys.Failed()}, kNoTimeout,
          [weak = std::weak_ptr<Group>(group), store = request.store,
           failed = group_keys.Failed()](Status s) {
            if (!s.ok()) return;  // cancelled: the group is gone
            // This runs on the store's completion thread (a gRPC callback thread for a remote
            // store), which must not block on another call to the store: read the reason on a
            // thread of its own.
            std::thread([weak, store, failed] {
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
            }).detach();
          });
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
    Status fixed = WaitUnlessAbandoned(*request.store, {key}, timeout, request.abandoned, &gave_up);
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

StatusOr<std::shared_ptr<Group>> GroupRegistry::Form(const JoinRequest& request,
                                                     const GroupKeys& keys,
                                                     const std::vector<int>& members,
                                                     milliseconds timeout) {
  const std::string& name = request.name;
  const int group_size = static_cast<int>(members.size());
  StatusOr<std::vector<std::string>> announced =
      request.store->MultiGet(keys.Ranks(group_size), timeout);
  if (!announced.ok()) return announced.status().WithContext("forming group '" + name + "'");
  const RankAnnouncement mine = AnnouncementOf(sidecar_id_, request, members);
  const int my_group_rank =
      static_cast<int>(std::find(members.begin(), members.end(), request.rank) - members.begin());
  std::vector<std::string> sidecar_of_rank;
  for (int r = 0; r < group_size; ++r) {
    StatusOr<RankAnnouncement> theirs = DecodeAnnouncement((*announced)[r]);
    if (!theirs.ok()) {
      return theirs.status().WithContext("group '" + name + "': group rank " + std::to_string(r));
    }
    if (!theirs->SameGroupAs(mine)) {
      const bool token_differs = theirs->token_digest != mine.token_digest;
      return Status::InvalidArgument("group '" + name + "': group rank " + std::to_string(r) + " " +
                                     (token_differs ? "presented a different job token"
                                                    : "named different members or world size") +
                                     " than group rank " + std::to_string(my_group_rank));
    }
    // One device kind per group; on a sidecar, its ranks share one GPU (one NCCL rank each).
    const bool same_kind = theirs->device.substr(0, 3) == mine.device.substr(0, 3);
    if (!same_kind || (theirs->sidecar_id == mine.sidecar_id && theirs->device != mine.device)) {
      return Status::InvalidArgument(
          "group '" + name + "': group rank " + std::to_string(r) + " has its tensors on " +
          theirs->device + " and group rank " + std::to_string(my_group_rank) + " on " +
          mine.device +
          (same_kind ? ": the ranks of a group on one sidecar must share one GPU"
                     : ": a group's tensors must all live on one kind of device"));
    }
    sidecar_of_rank.push_back(theirs->sidecar_id);
  }
  StatusOr<GroupTopology> topology = GroupTopology::FromSidecarIds(sidecar_of_rank, sidecar_id_);
  if (!topology.ok()) return topology.status();

  ConnectRequest connect;
  connect.group = name;
  connect.device = request.device;
  connect.device_index = request.device_index;
  connect.topology = *topology;
  connect.store = std::make_shared<PrefixStore>(keys.TransportPrefix(), request.store);
  connect.timeout = timeout;
  StatusOr<GroupTransport> transport = transports_->Connect(connect);
  if (!transport.ok()) return transport.status();

  std::shared_ptr<Store> store = request.store;
  Group::Hooks hooks;
  hooks.publish_failure = [store, failed = keys.Failed()](const Status& reason,
                                                          uint64_t completed_through) {
    (void)store->Set(failed, EncodeFailure(reason, completed_through));
  };
  hooks.lookup_failure = [store, failed = keys.Failed()]() -> std::optional<Status> {
    StatusOr<std::string> value = store->Get(failed, milliseconds(500));
    if (!value.ok()) return std::nullopt;
    return DecodeFailure(*value);
  };
  hooks.roll_call = [store, keys, me = sidecar_id_](
                        const std::vector<std::string>& peer_ids,
                        milliseconds budget) -> std::optional<std::vector<int>> {
    // Every live member sidecar watches the roll-call key and answers with its alive key.
    if (!store->Set(keys.Alive(me), "1").ok() || !store->Set(keys.RollCall(), "1").ok())
      return std::nullopt;
    const auto deadline = std::chrono::steady_clock::now() + budget;
    std::vector<int> silent;
    for (size_t i = 0; i < peer_ids.size(); ++i) {
      auto left =
          std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      Status answered = store->Wait({keys.Alive(peer_ids[i])}, std::max(left, milliseconds(1)));
      if (answered.IsTimeout()) {
        silent.push_back(static_cast<int>(i));
      } else if (!answered.ok()) {
        return std::nullopt;
      }
    }
    return silent;
  };
  GroupSpec spec{name,
                 members,
                 request.device,
                 timeout,
                 options_.observer,
                 options_.flight_recorder_size,
                 mine.token_digest,
                 GroupKeys::TokenScope(request.store_prefix, name)};
  return std::make_shared<Group>(std::move(spec), std::move(*topology), std::move(*transport),
                                 std::move(hooks));
}

void GroupRegistry::RemoveKeysOnceAllLeft(Store& store, const std::string& keys_base,
                                          int sidecars) {
  // Best effort: a store that cannot be reached keeps the keys, and the sidecar goes on.
  StatusOr<int64_t> left = store.Add(keys_base + "/left", 1);
  if (!left.ok() || *left != sidecars) return;
  StatusOr<int64_t> deleted = store.DeletePrefix(keys_base + "/");
  if (!deleted.ok()) {
    LogWarning("cannot remove the keys of a destroyed group",
               {{"keys", keys_base}, {"error", deleted.status().message()}});
  }
}

Status GroupRegistry::Leave(const std::string& name, int group_rank) {
  std::shared_ptr<Group> doomed;
  std::shared_ptr<Store> store;
  std::string keys_base;
  std::vector<WaitId> watches;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || !it->second.local_ranks.count(group_rank)) {
      return Status::NotFound("group '" + name + "' has no rank " + std::to_string(group_rank) +
                              " on this sidecar");
    }
    it->second.local_ranks.erase(group_rank);
    if (!it->second.local_ranks.empty()) return Status::Ok();
    doomed = it->second.group;
    store = it->second.store;
    keys_base = it->second.keys_base;
    watches = {it->second.failure_watch, it->second.roll_call_watch};
    live_.erase(it);
    for (auto f = forming_.begin(); f != forming_.end();) {
      f = f->second->group == doomed ? forming_.erase(f) : std::next(f);
    }
  }
  for (WaitId watch : watches) {
    if (watch != kInvalidWaitId) store->CancelWait(watch);
  }
  LogInfo("group torn down", {{"group", name}});
  if (options_.observer) options_.observer->OnGroupGone(name);
  doomed->Stop();  // pending ops fail with "destroyed"; never blocks
  {
    // The keys are removed once the group's threads have exited, on the watchdog's thread: the
    // store may be remote, slow or gone, and a destroy must not wait for it.
    std::lock_guard<std::mutex> lock(mutex_);
    pending_removals_[doomed.get()] = {store, keys_base, doomed->topology().node_count()};
    stopped_.push_back(std::move(doomed));
  }
  ReapStopped();
  watchdog_wakeup_.notify_all();
  return Status::Ok();
}

Status GroupRegistry::AbortRank(const std::string& name, int group_rank, const Status& reason) {
  std::shared_ptr<Group> group = Find(name);
  if (!group) return Status::NotFound("unknown group '" + name + "'");
  group->AbortRank(group_rank, reason);
  return Status::Ok();
}

Status GroupRegistry::FailGroup(const std::string& name, const Status& reason) {
  std::shared_ptr<Group> group = Find(name);
  if (!group) return Status::NotFound("unknown group '" + name + "'");
  group->Fail(reason);
  return Status::Ok();
}

std::shared_ptr<Group> GroupRegistry::Find(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(name);
  return it == live_.end() ? nullptr : it->second.group;
}

std::vector<std::shared_ptr<Group>> GroupRegistry::List() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::shared_ptr<Group>> groups;
  for (const auto& [name, live] : live_) groups.push_back(live.group);
  return groups;
}

void GroupRegistry::Shutdown(const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = reason;
  }
  for (auto& group : List()) group->Fail(reason);
}

}  // namespace collectived
