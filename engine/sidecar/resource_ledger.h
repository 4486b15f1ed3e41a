// ResourceLedger: the sidecar-wide ceilings on what clients can make the sidecar hold, and each
// client's share of them, so that one client cannot starve the others on its node. A client is
// a process (or a remote identity, see Sidecar::OpenSession): all its sessions draw on one
// share, so opening more sessions does not multiply it. Every resource has a per-client share
// and a total for the whole sidecar; a request that would pass
// either is refused with ResourceExhausted naming the resource, the limit and the flag that
// raises it, and the refusal is reported to the observer (a metric). What is held is given back
// when its holder goes (ResourceClaim), so the sidecar serves again as soon as an attacker
// leaves.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "engine/vocabulary/status.h"

namespace collectived {

enum class Resource : int {
  kSessions = 0,  // attached sessions
  kGroups,        // group ranks joined (a group with k local ranks on a session counts k)
  kBuffers,       // registered buffers: each is a mapping (a VMA of the sidecar)
  kDescriptors,   // file descriptors kept open for clients (unsealed buffers, rings)
  kMappedBytes,   // declared sizes of registered buffers, sparse or not
  kPendingOps,    // asynchronous ops submitted and not yet completed
  kPendingBytes,  // inline tensor bytes those ops hold
  kRings,         // submission rings (each has a thread and a shared mapping)
  kCount,
};
inline constexpr size_t kResourceCount = static_cast<size_t>(Resource::kCount);

// "sessions", "groups", ...: the metric label and the name in messages.
std::string_view ResourceName(Resource resource);
// The flags that set the ceilings: "--client-max-groups" and "--max-groups".
std::string ClientShareFlag(Resource resource);
std::string TotalFlag(Resource resource);

struct ResourceCeiling {
  uint64_t per_client = 0;  // 0: no per-client share (only the total applies)
  uint64_t total = 0;
};

// What the defaults are derived from: the machine's memory and the process's limits.
struct MachineLimits {
  uint64_t physical_memory_bytes = 0;  // MemTotal
  uint64_t address_space_bytes = 0;    // RLIMIT_AS (or the user address space when unlimited)
  uint64_t open_files = 0;             // RLIMIT_NOFILE's soft limit, after raising it
  uint64_t max_map_count = 0;          // vm.max_map_count: mappings a process may have

  // Reads them from the running system.
  static MachineLimits OfThisProcess();
};

struct ResourceCeilings {
  std::array<ResourceCeiling, kResourceCount> of{};

  ResourceCeiling& operator[](Resource r) { return of[static_cast<size_t>(r)]; }
  const ResourceCeiling& operator[](Resource r) const { return of[static_cast<size_t>(r)]; }

  // Defaults that a real node (8 GPUs, a few trainers each, dozens of groups per trainer) never
  // reaches, bounded by what the machine and the process can give: descriptors leave a reserve
  // for accepting connections and the sidecar's own files, mappings stay well under
  // max_map_count, mapped bytes under the physical memory and the address space.
  static ResourceCeilings Defaults(const MachineLimits& machine);
};

// The counters of one client: what all its sessions hold together.
class ResourceShare {
 public:
  // `label` names the holder in refusals: "client pid 42 uid 1000", "session s4".
  explicit ResourceShare(std::string label) : label_(std::move(label)) {}
  const std::string& label() const { return label_; }

 private:
  friend class ResourceLedger;
  const std::string label_;
  std::array<uint64_t, kResourceCount> used_{};  // guarded by the ledger's mutex
};

class ResourceLedger;

// What a holder took: given back when it is destroyed (or Release). Move-only.
class ResourceClaim {
 public:
  ResourceClaim() = default;
  ResourceClaim(ResourceClaim&& other) noexcept { *this = std::move(other); }
  ResourceClaim& operator=(ResourceClaim&& other) noexcept;
  ~ResourceClaim() { Release(); }
  ResourceClaim(const ResourceClaim&) = delete;
  ResourceClaim& operator=(const ResourceClaim&) = delete;

  void Release();

 private:
  friend class ResourceLedger;
  std::shared_ptr<ResourceLedger> ledger_;
  std::shared_ptr<ResourceShare> share_;
  Resource resource_ = Resource::kCount;
  uint64_t amount_ = 0;
};

class ResourceLedger : public std::enable_shared_from_this<ResourceLedger> {
 public:
  // `on_refused` (may be null) is told of every refusal, with the resource refused.
  static std::shared_ptr<ResourceLedger> Create(ResourceCeilings ceilings,
                                                std::function<void(Resource)> on_refused);

  // Takes `amount` of `resource` for `share`. ResourceExhausted when the share's part or the
  // sidecar's total would pass its ceiling: the message names the resource, the holder, what
  // is held, the limit and the flag that raises it. The claim gives it back.
  StatusOr<ResourceClaim> Claim(const std::shared_ptr<ResourceShare>& share, Resource resource,
                                uint64_t amount);

  // Take and give back without a claim object (for holders that count on their own). TakeAll
  // takes every amount or none (the first resource past its ceiling is refused), in one lock:
  // a submission takes its op and its bytes together.
  Status Take(ResourceShare& share, Resource resource, uint64_t amount);
  Status TakeAll(ResourceShare& share,
                 std::initializer_list<std::pair<Resource, uint64_t>> amounts);
  void Give(ResourceShare& share, Resource resource, uint64_t amount);
  void GiveAll(ResourceShare& share, std::initializer_list<std::pair<Resource, uint64_t>> amounts);

  const ResourceCeilings& ceilings() const { return ceilings_; }
  // What all clients hold of `resource` now.
  uint64_t InUse(Resource resource) const;
  // What `share` holds of `resource` now.
  uint64_t HeldBy(const ResourceShare& share, Resource resource) const;

 private:
  ResourceLedger(ResourceCeilings ceilings, std::function<void(Resource)> on_refused)
      : ceilings_(ceilings), on_refused_(std::move(on_refused)) {}

  // The refusal of taking `amount` of `resource` for `share`, or OK. Requires mutex_.
  Status RefusalLocked(const ResourceShare& share, Resource resource, uint64_t amount) const;

  const ResourceCeilings ceilings_;
  const std::function<void(Resource)> on_refused_;
  mutable std::mutex mutex_;
  std::array<uint64_t, kResourceCount> in_use_{};  // guarded by mutex_
};

}  // namespace collectived
