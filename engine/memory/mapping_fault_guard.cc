#include "engine/memory/mapping_fault_guard.h"

#include <signal.h>
#include <sys/mman.h>

#include <array>
#include <atomic>
#include <mutex>
#include <vector>

namespace collectived {
namespace {

// One guarded mapping. `size` is written last on Guard and first on Release, so the handler
// never sees a half-written slot as live (size 0 = free).
struct Slot {
  std::atomic<uintptr_t> base{0};
  std::atomic<size_t> size{0};
  std::atomic<bool> faulted{false};
};

std::array<Slot, MappingFaultGuard::kCapacity> slots;
std::atomic<size_t> slots_in_use_limit{0};  // slots at or past this index were never used
std::atomic<uint64_t> faults_handled{0};
struct sigaction previous_action {};

std::mutex allocation_mutex;
std::vector<size_t> free_slots;  // guarded by allocation_mutex
bool installed = false;          // guarded by allocation_mutex

void OnSigbus(int signal, siginfo_t* info, void* context) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  const size_t limit = slots_in_use_limit.load(std::memory_order_acquire);
  for (size_t i = 0; i < limit; ++i) {
    Slot& slot = slots[i];
    const size_t size = slot.size.load(std::memory_order_acquire);
    if (size == 0) continue;
    const uintptr_t base = slot.base.load(std::memory_order_relaxed);
    if (address < base || address - base >= size) continue;
    // The client's file no longer backs this page: swap the whole mapping for zero pages at the
    // same address. The instruction that faulted is retried and completes; the op fails later.
    void* replaced = mmap(reinterpret_cast<void*>(base), size, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (replaced == MAP_FAILED) break;  // cannot contain it: fall through to the old action
    slot.faulted.store(true, std::memory_order_release);
    faults_handled.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Not a guarded mapping: whatever would have happened without us happens.
  if (previous_action.sa_flags & SA_SIGINFO) {
    if (previous_action.sa_sigaction != nullptr) {
      previous_action.sa_sigaction(signal, info, context);
      return;
    }
  } else if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(signal);
    return;
  }
  // The default action: restore it and return, so the faulting access is retried and kills
  // the process with SIGBUS as it would have.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(SIGBUS, &default_action, nullptr);
}

Status InstallLocked() {
  if (installed) return Status::Ok();
  struct sigaction action {};
  action.sa_sigaction = OnSigbus;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  if (sigaction(SIGBUS, &action, &previous_action) != 0) {
    return Status::Internal("cannot install the SIGBUS handler that guards client memory");
  }
  installed = true;
  return Status::Ok();
}

}  // namespace

StatusOr<size_t> MappingFaultGuard::Guard(void* base, size_t size) {
  if (base == nullptr || size == 0) {
    return Status::InvalidArgument("cannot guard an empty mapping");
  }
  std::lock_guard<std::mutex> lock(allocation_mutex);
  COLLECTIVED_RETURN_IF_ERROR(InstallLocked());
  size_t index;
  if (!free_slots.empty()) {
    index = free_slots.back();
    free_slots.pop_back();
  } else {
    index = slots_in_use_limit.load(std::memory_order_relaxed);
    if (index >= kCapacity) {
      return Status::ResourceExhausted("the sidecar already guards " + std::to_string(kCapacity) +
                                       " client mappings, the most it can: unregister buffers "
                                       "or seal them (memfd with F_SEAL_SHRINK)");
    }
    slots_in_use_limit.store(index + 1, std::memory_order_release);
  }
  Slot& slot = slots[index];
  slot.faulted.store(false, std::memory_order_relaxed);
  slot.base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_relaxed);
  slot.size.store(size, std::memory_order_release);
  return index;
}

bool MappingFaultGuard::Faulted(size_t slot) {
  return slot < kCapacity && slots[slot].faulted.load(std::memory_order_acquire);
}

void MappingFaultGuard::Release(size_t slot) {
  if (slot >= kCapacity) return;
  slots[slot].size.store(0, std::memory_order_release);
  std::lock_guard<std::mutex> lock(allocation_mutex);
  free_slots.push_back(slot);
}

uint64_t MappingFaultGuard::FaultsHandled() {
  return faults_handled.load(std::memory_order_relaxed);
}

}  // namespace collectived
