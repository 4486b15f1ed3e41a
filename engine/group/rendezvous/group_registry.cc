// GroupRegistry: the groups of this sidecar, by name: joins checked and handed to the rendezvous
// (group_rendezvous.cc), groups destroyed and parked until quiescent, lookups and shutdown.
#include "engine/group/rendezvous/group_registry.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <numeric>

#include "engine/group/rendezvous/group_records.h"
#include "engine/group/rendezvous/group_registry_internal.h"
#include "engine/group/rendezvous/job_token.h"
#include "engine/group/rendezvous/signed_store.h"
#include "engine/group/transport/sidecar_transport_factory.h"
#include "engine/vocabulary/logging.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

// How long the registry's destructor waits for destroyed groups to become quiescent before
// leaving the rest to the process exit.
constexpr milliseconds kShutdownReapBudget{1000};

std::shared_ptr<Runtime> RuntimeOf(const GroupRegistryOptions& options) {
  if (options.runtime) return options.runtime;
  StatusOr<std::shared_ptr<Runtime>> runtime = Runtime::Create();
  if (!runtime.ok()) {
    // Without its socket thread a sidecar can serve nothing: a broken machine, not bad input.
    LogError("cannot start the sidecar's threads", {{"error", runtime.status().message()}});
    std::abort();
  }
  return *runtime;
}

}  // namespace

GroupRegistry::GroupRegistry(GroupRegistryOptions options)
    : options_(std::move(options)),
      runtime_(RuntimeOf(options_)),
      transports_(options_.transports ? options_.transports
                                      : std::make_shared<SidecarTransportFactory>(
                                            options_.advertise_host, *runtime_)),
      parked_(std::make_shared<ActivityCount>()) {}

GroupRegistry::~GroupRegistry() {
  stopping_->Cancel(Status::Aborted("the sidecar is stopping"));
  std::map<std::string, Live> live;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (shutdown_.ok()) shutdown_ = Status::Aborted("the sidecar is stopping");  // ends epoch waits
    live.swap(live_);
    forming_.clear();  // its entries hold the groups too
  }
  for (auto& [name, entry] : live) {
    for (WaitId watch : {entry.failure_watch, entry.roll_call_watch,
                         entry.elastic ? entry.elastic->loss_watch : kInvalidWaitId}) {
      if (watch != kInvalidWaitId) entry.store->CancelWait(watch);
    }
    entry.store = nullptr;  // the sidecar is going: its groups' keys stay
    Park(entry);
  }
  live.clear();
  // No callback uses the registry from now on; a shrinking group's epoch change in progress ends
  // within its store calls' budgets (its connects and waits at once: stopping_).
  life_->Retire();
  // Groups become quiescent within milliseconds of Stop; only a transfer blocked in the
  // transport until its own timeout takes longer. Give the quick ones their moment, bounded.
  if (!parked_->WaitUntil(runtime_->clock(), runtime_->clock().After(kShutdownReapBudget))) {
    // Still blocked in a transport until its timeout: leave them, and the threads they run on,
    // to the process exit rather than hang the shutdown. Reachable from a static, so that leak
    // checkers do not report what is left on purpose.
    LogWarning("groups still finishing at shutdown", {{"count", std::to_string(parked_->count())}});
    static std::mutex unfinished_mutex;
    static auto* unfinished = new std::vector<std::shared_ptr<Runtime>>();
    std::lock_guard<std::mutex> keep(unfinished_mutex);
    unfinished->push_back(runtime_);
  }
}

void GroupRegistry::Park(Live& live) {
  parked_->Enter();
  {
    std::lock_guard<std::mutex> lock(live.parking->mutex);
    live.parking->group = live.group;
    live.parking->store = live.store;
    live.parking->keys_base = live.keys_base;
    live.parking->sidecars = live.group->topology().node_count();
  }
  // Pending ops fail with "destroyed"; never blocks. Once quiescent, the group's hook hands the
  // parking to the executor.
  live.group->Stop();
}

StatusOr<Membership> GroupRegistry::Join(const JoinRequest& request) {
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
  // No members listed: the whole world (a default group), valid by construction. Every rank of a
  // large group passes here, so the checks below (each O(R)) run only for a listed subset.
  const bool whole_world = request.members.empty();
  std::vector<int> members;
  int group_rank = request.rank;
  if (whole_world) {
    members.resize(request.world_size);
    std::iota(members.begin(), members.end(), 0);
  } else {
    members = request.members;
    // Usually sorted already (torch sends them so): checked in one pass, sorted only if not.
    if (!std::is_sorted(members.begin(), members.end())) std::sort(members.begin(), members.end());
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
    auto position = std::lower_bound(members.begin(), members.end(), request.rank);
    if (position == members.end() || *position != request.rank) {
      return Status::InvalidArgument("rank " + std::to_string(request.rank) +
                                     " is not part of group '" + name + "' (members " +
                                     FormatRanks(members) + ")");
    }
    group_rank = static_cast<int>(position - members.begin());
  }
  if (!request.store) return Status::InvalidArgument("group '" + name + "': no rendezvous store");
  COLLECTIVED_RETURN_IF_ERROR(
      CheckFaultTolerance(request.fault_tolerance, name, static_cast<int>(members.size())));
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

  JoinRequest joining = request;
  if ((request.fault_tolerance.shrinks() || !request.store_fallbacks.empty()) &&
      options_.store_at) {
    // A shrinking group outlives the sidecar whose store it meets in: its store moves on. A
    // join, of any group, whose first store is gone moves along the address list as the group's
    // sidecars did: a replacement finds the group where the survivors went.
    joining.movable_store = std::make_shared<MovableStore>(
        request.store, "the store the group met in",
        GroupKeys::TokenCommitment(request.store_prefix, name), runtime_->clock());
    joining.movable_store->SetSuccessors(StoreSuccessors(request.store_fallbacks, nullptr));
    joining.store = joining.movable_store;
  }
  // A joiner whose job token is not the group's is refused here, before it takes an incarnation
  // or announces itself: the rightful ranks form the group without it.
  COLLECTIVED_RETURN_IF_ERROR(CheckJobToken(joining, group_rank, members[0], timeout));
  const std::string digest = DigestOf(members, whole_world);
  if (request.job_token.empty()) {
    return JoinChecked(joining, members, group_rank, digest, timeout, *joining.store);
  }
  // From here on the group's records are authenticated with its token: not even another
  // sidecar can forge them.
  JoinRequest authenticated = joining;
  authenticated.store = std::make_shared<SignedStore>(
      joining.store,
      JobRecordKey(request.job_token, GroupKeys::TokenScope(request.store_prefix, name)));
  return JoinChecked(authenticated, members, group_rank, digest, timeout, *joining.store);
}

std::string GroupRegistry::DigestOf(const std::vector<int>& members, bool whole_world) {
  if (!whole_world) return MembersDigest(members);
  std::lock_guard<std::mutex> lock(digest_mutex_);
  const int world_size = static_cast<int>(members.size());
  if (world_digest_size_ != world_size) {
    world_digest_ = MembersDigest(members);
    world_digest_size_ = world_size;
  }
  return world_digest_;
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

std::string GroupRegistry::AdminAddress() const {
  return options_.admin_address ? options_.admin_address() : std::string();
}

Status GroupRegistry::Leave(const std::string& name, int group_rank) {
  Live doomed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || !it->second.local_ranks.count(group_rank)) {
      return Status::NotFound("group '" + name + "' has no rank " + std::to_string(group_rank) +
                              " on this sidecar");
    }
    it->second.local_ranks.erase(group_rank);
    if (!it->second.local_ranks.empty()) return Status::Ok();
    const std::shared_ptr<Elastic>& elastic = it->second.elastic;
    if (elastic && (elastic->phase == Elastic::Phase::kRetiring ||
                    elastic->phase == Elastic::Phase::kForming ||
                    elastic->phase == Elastic::Phase::kDraining)) {
      // The epoch still needs this sidecar (its lost ranks' ops up to the cut, its part in the
      // next epoch's rendezvous): the change takes the group down once done (group_epochs.cc).
      return Status::Ok();
    }
    doomed = std::move(it->second);
    live_.erase(it);
  }
  TearDown(name, doomed);
  return Status::Ok();
}

void GroupRegistry::TearDown(const std::string& name, Live& doomed) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto f = forming_.begin(); f != forming_.end();) {
      f = f->second->formed.group == doomed.group ? forming_.erase(f) : std::next(f);
    }
  }
  for (WaitId watch : {doomed.failure_watch, doomed.roll_call_watch,
                       doomed.elastic ? doomed.elastic->loss_watch : kInvalidWaitId}) {
    if (watch != kInvalidWaitId) doomed.store->CancelWait(watch);
  }
  LogInfo("group torn down", {{"group", name}});
  if (options_.observer) options_.observer->OnGroupGone(name);
  // A sidecar that dropped out of a shrinking group's epochs leaves the keys to the sidecars of
  // its last epoch.
  if (doomed.elastic && doomed.elastic->dropped_out) doomed.store = nullptr;
  // The keys are removed once the group is quiescent, on the executor: the store may be remote,
  // slow or gone, and a destroy must not wait for it.
  Park(doomed);
}

Status GroupRegistry::AbortRank(const std::string& name, int group_rank, const Status& reason) {
  std::shared_ptr<Group> group;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end()) return Status::NotFound("unknown group '" + name + "'");
    group = it->second.group;
    if (const auto& elastic = it->second.elastic) {
      const EpochView& view = elastic->view;
      if (group_rank < 0 || group_rank >= view.group_size() || view.lost(group_rank)) {
        return Status::Ok();
      }
      group_rank = view.epoch_rank[group_rank];
    }
  }
  group->AbortRank(group_rank, reason);
  return Status::Ok();
}

Status GroupRegistry::FailGroup(const std::string& name, const Status& reason) {
  std::shared_ptr<Group> group;
  std::shared_ptr<Elastic> elastic;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end()) return Status::NotFound("unknown group '" + name + "'");
    group = it->second.group;
    elastic = it->second.elastic;
  }
  // A shrinking group fails whatever epoch it is in, and stays failed through a change.
  if (elastic) {
    FailTransition(name, elastic, reason);
  } else {
    group->Fail(reason);
  }
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
  stopping_->Cancel(reason);
  for (auto& group : List()) group->Fail(reason);
}

}  // namespace collectived
