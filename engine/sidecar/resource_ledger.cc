#include "engine/sidecar/resource_ledger.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

namespace collectived {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
// The user half of x86-64's and AArch64's 48-bit address space.
constexpr uint64_t kUserAddressSpace = uint64_t{1} << 47;

uint64_t ReadNumberFile(const char* path, uint64_t fallback) {
  std::ifstream in(path);
  uint64_t value = 0;
  return (in >> value) ? value : fallback;
}

uint64_t PhysicalMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page_size <= 0) return 16 * kGiB;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page_size);
}

}  // namespace

std::string_view ResourceName(Resource resource) {
  switch (resource) {
    case Resource::kSessions:
      return "sessions";
    case Resource::kGroups:
      return "groups";
    case Resource::kBuffers:
      return "buffers";
    case Resource::kDescriptors:
      return "descriptors";
    case Resource::kMappedBytes:
      return "mapped_bytes";
    case Resource::kPendingOps:
      return "pending_ops";
    case Resource::kPendingBytes:
      return "pending_bytes";
    case Resource::kRings:
      return "rings";
    case Resource::kCount:
      break;
  }
  return "unknown";
}

static std::string FlagName(Resource resource) {
  std::string name(ResourceName(resource));
  std::replace(name.begin(), name.end(), '_', '-');
  return name;
}

std::string ClientShareFlag(Resource resource) {
  return "--client-max-" + FlagName(resource);
}

std::string TotalFlag(Resource resource) {
  return "--max-" + FlagName(resource);
}

MachineLimits MachineLimits::OfThisProcess() {
  MachineLimits machine;
  machine.physical_memory_bytes = PhysicalMemory();
  rlimit limit{};
  machine.address_space_bytes = getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                                    ? std::min<uint64_t>(limit.rlim_cur, kUserAddressSpace)
                                    : kUserAddressSpace;
  machine.open_files = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                           ? limit.rlim_cur
                           : 1 << 20;
  machine.max_map_count = ReadNumberFile("/proc/sys/vm/max_map_count", 65530);
  return machine;
}

ResourceCeilings ResourceCeilings::Defaults(const MachineLimits& machine) {
  ResourceCeilings c;
  // A trainer process needs one session; a share of many leaves room for tools and tests.
  c[Resource::kSessions] = {512, 4096};
  c[Resource::kGroups] = {1024, 16384};
  // Every mapping is a VMA, and so is every thread's stack: past max_map_count neither a buffer
  // nor a thread can be had, so buffers take at most a quarter of it.
  c[Resource::kBuffers] = {
      1024, std::max<uint64_t>(64, std::min<uint64_t>(65536, machine.max_map_count / 4))};
  // A quarter of the descriptors (at least half of a small limit, up to 1,024) stays for
  // accepting connections, peers' sockets and the sidecar's own files.
  const uint64_t reserve =
      std::max(machine.open_files / 4, std::min<uint64_t>(1024, machine.open_files / 2));
  const uint64_t descriptors = machine.open_files > reserve ? machine.open_files - reserve : 0;
  c[Resource::kDescriptors] = {std::min<uint64_t>(1024, descriptors), descriptors};
  // Registered memory is the clients' own shared memory: more than the machine has is a lie
  // (sparse files cost the client nothing but cost the sidecar address space).
  const uint64_t mapped = std::min(machine.physical_memory_bytes, machine.address_space_bytes / 4);
  c[Resource::kMappedBytes] = {mapped / 2, mapped};
  c[Resource::kPendingOps] = {16384, 65536};
  const uint64_t pending_bytes = std::min(4 * kGiB, machine.physical_memory_bytes / 4);
  c[Resource::kPendingBytes] = {std::min(kGiB, pending_bytes / 2), pending_bytes};
  // One ring per session (the fd channel allows no second).
  c[Resource::kRings] = {128, 512};
  return c;
}

ResourceClaim& ResourceClaim::operator=(ResourceClaim&& other) noexcept {
  if (this == &other) return *this;
  Release();
  ledger_ = std::move(other.ledger_);
  share_ = std::move(other.share_);
  resource_ = other.resource_;
  amount_ = other.amount_;
  other.amount_ = 0;
  return *this;
}

void ResourceClaim::Release() {
  if (ledger_ && share_ && amount_ > 0) ledger_->Give(*share_, resource_, amount_);
  ledger_.reset();
  share_.reset();
  amount_ = 0;
}

std::shared_ptr<ResourceLedger> ResourceLedger::Create(ResourceCeilings ceilings,
                                                       std::function<void(Resource)> on_refused) {
  return std::shared_ptr<ResourceLedger>(new ResourceLedger(ceilings, std::move(on_refused)));
}

StatusOr<ResourceClaim> ResourceLedger::Claim(const std::shared_ptr<ResourceShare>& share,
                                              Resource resource, uint64_t amount) {
  COLLECTIVED_RETURN_IF_ERROR(Take(*share, resource, amount));
  ResourceClaim claim;
  claim.ledger_ = shared_from_this();
  claim.share_ = share;
  claim.resource_ = resource;
  claim.amount_ = amount;
  return claim;
}

Status ResourceLedger::Take(ResourceShare& share, Resource resource, uint64_t amount) {
  return TakeAll(share, {{resource, amount}});
}

Status ResourceLedger::TakeAll(ResourceShare& share,
                               std::initializer_list<std::pair<Resource, uint64_t>> amounts) {
  Status refused;
  Resource refused_resource = Resource::kCount;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [resource, amount] : amounts) {
      refused = RefusalLocked(share, resource, amount);
      if (!refused.ok()) {
        refused_resource = resource;
        break;
      }
    }
    if (refused.ok()) {
      for (const auto& [resource, amount] : amounts) {
        share.used_[static_cast<size_t>(resource)] += amount;
        in_use_[static_cast<size_t>(resource)] += amount;
      }
      return Status::Ok();
    }
  }
  if (on_refused_) on_refused_(refused_resource);
  return refused;
}

Status ResourceLedger::RefusalLocked(const ResourceShare& share, Resource resource,
                                     uint64_t amount) const {
  const size_t i = static_cast<size_t>(resource);
  const ResourceCeiling& ceiling = ceilings_.of[i];
  const uint64_t held = share.used_[i];
  if (ceiling.per_client > 0 && amount > ceiling.per_client - std::min(held, ceiling.per_client)) {
    return Status::ResourceExhausted(
        std::string(ResourceName(resource)) + ": " + share.label() + " holds " +
        std::to_string(held) +
        (amount == 1 ? "" : " and asks " + std::to_string(amount) + " more") + ", its share is " +
        std::to_string(ceiling.per_client) + " (" + ClientShareFlag(resource) + " raises it): " +
        (resource == Resource::kPendingBytes
             ? "wait for some ops first, or use shared memory for large tensors"
             : "give some back first"));
  }
  if (amount > ceiling.total - std::min(in_use_[i], ceiling.total)) {
    return Status::ResourceExhausted(
        std::string(ResourceName(resource)) + ": the sidecar holds " + std::to_string(in_use_[i]) +
        " for all clients" +
        (amount == 1 ? "" : " and " + share.label() + " asks " + std::to_string(amount) + " more") +
        ", its total is " + std::to_string(ceiling.total) + " (" + TotalFlag(resource) +
        " raises it): retry when other clients give some back");
  }
  return Status::Ok();
}

void ResourceLedger::GiveAll(ResourceShare& share,
                             std::initializer_list<std::pair<Resource, uint64_t>> amounts) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [resource, amount] : amounts) {
    const size_t i = static_cast<size_t>(resource);
    share.used_[i] -= std::min(amount, share.used_[i]);
    in_use_[i] -= std::min(amount, in_use_[i]);
  }
}

void ResourceLedger::Give(ResourceShare& share, Resource resource, uint64_t amount) {
  GiveAll(share, {{resource, amount}});
}

uint64_t ResourceLedger::InUse(Resource resource) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return in_use_[static_cast<size_t>(resource)];
}

uint64_t ResourceLedger::HeldBy(const ResourceShare& share, Resource resource) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return share.used_[static_cast<size_t>(resource)];
}

}  // namespace collectived
