#include "engine/group/group_registry.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <functional>
#include <thread>

#include "engine/logging.h"
#include "engine/group/gloo/gloo_rendezvous_store.h"
#include "engine/store/prefix_store.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kDefaultGroupTimeout = std::chrono::minutes(30);

std::string EncodeFailure(const Status& status) {
  return std::to_string(static_cast<int>(status.kind())) + "|" + status.message();
}

Status DecodeFailure(const std::string& value) {
  auto bar = value.find('|');
  int kind = bar == std::string::npos ? 0 : std::atoi(value.substr(0, bar).c_str());
  if (kind <= 0 || kind > static_cast<int>(ErrorKind::kNotFound))
    kind = static_cast<int>(ErrorKind::kPeerLost);
  return Status(static_cast<ErrorKind>(kind),
                bar == std::string::npos ? value : value.substr(bar + 1));
}

// What every rank announces: its sidecar, and what it believes the group is (so ranks that
// disagree about members or the job token are caught at creation).
std::string Announcement(const std::string& sidecar_id, const JoinRequest& request,
                         const std::vector<int>& members) {
  std::string text = sidecar_id + "\n" + std::to_string(request.world_size) + ":" +
                     FormatRanks(members) + "\n" +
                     std::to_string(std::hash<std::string>{}(request.job_token));
  return text;
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

GroupRegistry::GroupRegistry(GroupRegistryOptions options) : options_(std::move(options)) {
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
  }
  for (auto& [name, entry] : live) {
    for (WaitId watch : {entry.failure_watch, entry.roll_call_watch}) {
      if (watch != kInvalidWaitId) entry.store->CancelWait(watch);
    }
    entry.group->Stop();
    stopped_.push_back(entry.group);
  }
  ReapStopped();
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

void GroupRegistry::ReapStopped() {
  std::vector<std::shared_ptr<Group>> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = stopped_.begin(); it != stopped_.end();) {
      if ((*it)->Finished() && it->use_count() == 1) {
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
  if (request.timeout.count() < 0) {
    return Status::InvalidArgument("group '" + name + "': negative timeout");
  }
  const int group_rank = static_cast<int>(position - members.begin());
  const int group_size = static_cast<int>(members.size());
  const milliseconds timeout = request.timeout.count() > 0 ? request.timeout : kDefaultGroupTimeout;
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

  const std::string prefix = (request.store_prefix.empty() ? "" : request.store_prefix + "/") +
                             "collectived/groups/" + name;
  StatusOr<int64_t> incarnation =
      request.store->Add(prefix + "/incarnation/" + std::to_string(group_rank), 1);
  if (!incarnation.ok()) return incarnation.status().WithContext("joining group '" + name + "'");
  const std::string base = prefix + "/" + std::to_string(*incarnation);
  std::vector<std::string> keys;
  for (int r = 0; r < group_size; ++r) keys.push_back(base + "/rank/" + std::to_string(r));
  COLLECTIVED_RETURN_IF_ERROR(
      request.store->Set(keys[group_rank], Announcement(sidecar_id_, request, members))
          .WithContext("joining group '" + name + "'"));
  Status all_here = request.store->Wait(keys, timeout);
  if (!all_here.ok()) {
    if (!all_here.IsTimeout()) return all_here.WithContext("joining group '" + name + "'");
    std::vector<int> missing;
    for (int r = 0; r < group_size; ++r) {
      StatusOr<bool> present = request.store->Check({keys[r]});
      if (present.ok() && !*present) missing.push_back(r);
    }
    std::vector<int> missing_global;
    for (int r : missing) missing_global.push_back(members[r]);
    return Status::Timeout("Timeout: creating group '" + name + "' (rank " +
                           std::to_string(request.rank) + "): group ranks " + FormatRanks(missing) +
                           " (global ranks " + FormatRanks(missing_global) +
                           ") never joined within " + std::to_string(timeout.count()) + " ms");
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
    StatusOr<std::shared_ptr<Group>> group = Form(request, base, members, timeout);
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
      live.roll_call_watch = request.store->WaitAsync(
          {base + "/rollcall"}, kNoTimeout,
          [store = request.store, key = base + "/alive/" + sidecar_id_](Status s) {
            if (!s.ok()) return;  // cancelled: the group is gone
            // Not on the store's completion thread (see below).
            std::thread([store, key] { (void)store->Set(key, "1"); }).detach();
          });
      live.failure_watch = request.store->WaitAsync(
          {base + "/failed"}, kNoTimeout,
          [weak = std::weak_ptr<Group>(group), store = request.store, base](Status s) {
            if (!s.ok()) return;  // cancelled: the group is gone
            // This runs on the store's completion thread (a gRPC callback thread for a remote
            // store), which must not block on another call to the store: read the reason on a
            // thread of its own.
            std::thread([weak, store, base] {
              auto group = weak.lock();
              if (!group) return;
              StatusOr<std::string> value = store->Get(base + "/failed", milliseconds(2000));
              group->Fail(value.ok() ? DecodeFailure(*value)
                                     : Status::PeerLost("a peer sidecar of group '" +
                                                        group->name() + "' reported a failure"),
                          /*from_peer=*/true);
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

StatusOr<std::shared_ptr<Group>> GroupRegistry::Form(const JoinRequest& request,
                                                     const std::string& base,
                                                     const std::vector<int>& members,
                                                     milliseconds timeout) {
  const std::string& name = request.name;
  const int group_size = static_cast<int>(members.size());
  std::vector<std::string> keys;
  for (int r = 0; r < group_size; ++r) keys.push_back(base + "/rank/" + std::to_string(r));
  StatusOr<std::vector<std::string>> announced = request.store->MultiGet(keys, timeout);
  if (!announced.ok()) return announced.status().WithContext("forming group '" + name + "'");
  std::vector<std::string> sidecar_of_rank;
  const std::string mine = Announcement(sidecar_id_, request, members);
  const std::string my_view = mine.substr(mine.find('\n'));
  for (int r = 0; r < group_size; ++r) {
    const std::string& value = (*announced)[r];
    auto newline = value.find('\n');
    sidecar_of_rank.push_back(value.substr(0, newline));
    std::string view = newline == std::string::npos ? "" : value.substr(newline);
    if (view != my_view) {
      bool token_differs = view.substr(view.rfind('\n')) != my_view.substr(my_view.rfind('\n'));
      return Status::InvalidArgument(
          "group '" + name + "': group rank " + std::to_string(r) + " " +
          (token_differs ? "presented a different job token"
                         : "named different members or world size") +
          " than group rank " +
          std::to_string(std::find(members.begin(), members.end(), request.rank) -
                         members.begin()));
    }
  }
  StatusOr<GroupTopology> topology = GroupTopology::FromSidecarIds(sidecar_of_rank, sidecar_id_);
  if (!topology.ok()) return topology.status();

  std::shared_ptr<gloo::Context> context;
  if (topology->node_count() > 1) {
    try {
      std::shared_ptr<gloo::transport::Device> device;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!device_) {
          gloo::transport::tcp::attr attr;
          attr.hostname = advertise_host_;
          device_ = gloo::transport::tcp::CreateDevice(attr);
        }
        device = device_;
      }
      auto rendezvous =
          std::make_shared<gloo::rendezvous::Context>(topology->my_node, topology->node_count());
      rendezvous->setTimeout(timeout);
      GlooRendezvousStore gloo_store(std::make_shared<PrefixStore>(base + "/gloo", request.store),
                                     timeout);
      rendezvous->connectFullMesh(gloo_store, device);
      context = rendezvous;
    } catch (const std::exception& error) {
      return Status::Unavailable("cannot connect the sidecars of group '" + name +
                                 "': " + error.what());
    }
  }
  auto comm = std::make_unique<NodeComm>(context, topology->my_node, topology->node_count());
  std::shared_ptr<Store> store = request.store;
  Group::Hooks hooks;
  hooks.publish_failure = [store, base](const Status& reason) {
    (void)store->Set(base + "/failed", EncodeFailure(reason));
  };
  hooks.lookup_failure = [store, base]() -> std::optional<Status> {
    StatusOr<std::string> value = store->Get(base + "/failed", milliseconds(500));
    if (!value.ok()) return std::nullopt;
    return DecodeFailure(*value);
  };
  hooks.roll_call = [store, base, me = sidecar_id_](
                        const std::vector<std::string>& peer_ids,
                        milliseconds budget) -> std::optional<std::vector<int>> {
    // Every live member sidecar watches the roll-call key and answers with its alive key.
    if (!store->Set(base + "/alive/" + me, "1").ok() || !store->Set(base + "/rollcall", "1").ok())
      return std::nullopt;
    const auto deadline = std::chrono::steady_clock::now() + budget;
    std::vector<int> silent;
    for (size_t i = 0; i < peer_ids.size(); ++i) {
      auto left =
          std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
      Status answered =
          store->Wait({base + "/alive/" + peer_ids[i]}, std::max(left, milliseconds(1)));
      if (answered.IsTimeout()) {
        silent.push_back(static_cast<int>(i));
      } else if (!answered.ok()) {
        return std::nullopt;
      }
    }
    return silent;
  };
  GroupSpec spec{name, members, timeout, options_.observer, options_.flight_recorder_size};
  return std::make_shared<Group>(std::move(spec), std::move(*topology), std::move(comm),
                                 std::move(hooks));
}

Status GroupRegistry::Leave(const std::string& name, int group_rank) {
  std::shared_ptr<Group> doomed;
  std::shared_ptr<Store> store;
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
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_.push_back(std::move(doomed));
  }
  ReapStopped();
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
