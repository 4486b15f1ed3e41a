// RegistryCluster: groups formed through GroupRegistry over the in-process fabric, one registry
// per sidecar and one shared store (or one sidecar's own, MeetIn), for the registry's tests
// (group_registry_test.cc, group_epochs_test.cc, group_sidecar_loss_test.cc).
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/core/group.h"
#include "engine/group/rendezvous/group_registry.h"
#include "engine/group/transport/in_process/in_process_fabric.h"
#include "engine/store/counting_store.h"
#include "engine/store/memory_store.h"
#include "tests/engine/group/group_cluster.h"
#include "tests/engine/store/severable_store.h"

namespace collectived {
namespace group_testing {

class RegistryCluster {
 public:
  explicit RegistryCluster(std::vector<std::string> sidecar_of_rank)
      : sidecar_of_rank_(std::move(sidecar_of_rank)) {
    for (const auto& id : sidecar_of_rank_) {
      if (registries_.count(id)) continue;
      GroupRegistryOptions options;
      options.sidecar_id = id;
      options.transports = fabric_;
      // Each sidecar serves a store of its own at its id, as a sidecar does at its address.
      sidecar_stores_[id] = std::make_shared<store_testing::SeverableStore>();
      options.admin_address = [id] { return id; };
      options.store_at = [this,
                          id](const std::string& address) -> StatusOr<std::shared_ptr<Store>> {
        auto it = sidecar_stores_.find(address.empty() ? id : address);
        if (it == sidecar_stores_.end()) return Status::Unavailable("no sidecar at " + address);
        return std::shared_ptr<Store>(it->second);
      };
      registries_[id] = std::make_unique<GroupRegistry>(options);
    }
  }
  // The registries reap the groups that left only once their threads have exited: wait for
  // that, so none is left running at the registry's destruction.
  ~RegistryCluster() {
    const auto deadline = SteadyClock::now() + std::chrono::seconds(2);
    for (const auto& weak : joined_) {
      while (SteadyClock::now() < deadline) {
        std::shared_ptr<Group> group = weak.lock();
        if (!group || group->Quiescent()) break;
        group.reset();
        std::this_thread::sleep_for(milliseconds(1));
      }
    }
    registries_.clear();
  }

  StatusOr<Membership> Join(const std::string& name, int rank, milliseconds timeout,
                            FaultTolerance fault_tolerance = {},
                            DeviceKind device = DeviceKind::kCpu) {
    return JoinOn(sidecar_of_rank_[rank], name, rank, timeout, fault_tolerance, device);
  }
  // Join through sidecar `id`, whichever hosts the rank in the cluster's layout.
  StatusOr<Membership> JoinOn(const std::string& id, const std::string& name, int rank,
                              milliseconds timeout, FaultTolerance fault_tolerance = {},
                              DeviceKind device = DeviceKind::kCpu) {
    JoinRequest request;
    request.fault_tolerance = fault_tolerance;
    request.device = device;
    request.name = name;
    request.rank = rank;
    request.world_size = static_cast<int>(sidecar_of_rank_.size());
    request.store = meeting_store_ ? meeting_store_ : store_;
    request.store_fallbacks = store_fallbacks_;
    request.store_prefix = "test";
    request.timeout = timeout;
    StatusOr<Membership> membership = registries_[id]->Join(request);
    if (membership.ok()) {
      std::lock_guard<std::mutex> lock(mutex_);
      joined_.push_back(membership->group);
    }
    return membership;
  }
  GroupRegistry& registry(const std::string& id) { return *registries_[id]; }
  // Sidecar `id` dies: its registry goes (its groups stop without publishing a reason, and it
  // answers no roll call), and so does its store, as a killed process's do. The caller makes
  // sure nothing calls it.
  void Kill(const std::string& id) {
    registries_.erase(id);
    sidecar_stores_[id]->Sever();  // after: a dead sidecar does not follow its store's moves
  }
  // Sidecar `id` stops: its registry goes, its store stays (a sidecar's store outlives its
  // groups while it shuts down).
  void Stop(const std::string& id) { registries_.erase(id); }
  // Groups joined from now on meet in sidecar `id`'s own store instead of the shared one, with
  // the stores of sidecars `fallbacks` after it in their address list (store_addresses.h).
  void MeetIn(const std::string& id, std::vector<std::string> fallbacks = {}) {
    meeting_store_ = sidecar_stores_[id];
    store_fallbacks_ = std::move(fallbacks);
  }
  // Each of `survivors` waits until its sidecar saw a replacement for `lost` waiting, then
  // admits it after its last op, as the training wrapper does at a step boundary. Another rank
  // of its sidecar may have admitted it, and the epoch formed, before this one looks: it admits
  // all the same, as the wrapper does once its ranks agreed.
  void AdmitOnEachSurvivor(const std::vector<int>& survivors, int lost) {
    ForEachRank(static_cast<int>(survivors.size()), [&](int i) {
      GroupRegistry& admitting = registry(sidecar_of_rank_[survivors[i]]);
      const auto deadline = SteadyClock::now() + std::chrono::seconds(10);
      while (SteadyClock::now() < deadline) {
        StatusOr<std::vector<int>> waiting = admitting.Replacements("g", survivors[i]);
        ASSERT_TRUE(waiting.ok()) << waiting.status().ToString();
        if (*waiting == std::vector<int>{lost}) break;
        std::shared_ptr<Group> group = admitting.Find("g");
        const std::vector<int> lost_ranks =
            group ? group->spec().LostGroupRanks() : std::vector<int>{};
        if (group && std::find(lost_ranks.begin(), lost_ranks.end(), lost) == lost_ranks.end()) {
          break;
        }
        std::this_thread::sleep_for(milliseconds(2));
      }
      const uint64_t last = admitting.SequenceNumber("g", survivors[i]);
      Status admitted = admitting.Admit("g", survivors[i], last, {lost});
      ASSERT_TRUE(admitted.ok()) << admitted.ToString();
    });
  }
  InProcessFabric& fabric() { return *fabric_; }
  CountingStore& store() { return *store_; }

 private:
  std::vector<std::string> sidecar_of_rank_;
  std::shared_ptr<InProcessFabric> fabric_ = InProcessFabric::Create();
  std::shared_ptr<CountingStore> store_ =
      std::make_shared<CountingStore>(std::make_shared<MemoryStore>());
  std::map<std::string, std::shared_ptr<store_testing::SeverableStore>> sidecar_stores_;
  std::shared_ptr<Store> meeting_store_;  // null: the shared store
  std::vector<std::string> store_fallbacks_;
  std::map<std::string, std::unique_ptr<GroupRegistry>> registries_;
  std::mutex mutex_;
  std::vector<std::weak_ptr<Group>> joined_;  // guarded by mutex_
};

}  // namespace group_testing
}  // namespace collectived
