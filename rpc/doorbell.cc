#include "rpc/doorbell.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>

namespace collectived {
namespace {

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

void RingDoorbell(DoorbellWords* words) {
  // The RMW is a full fence: the caller's earlier stores (a queue's tail) are visible before
  // `sleepers` is read, and a sleeper that announced itself before re-checking is seen.
  std::atomic_ref<uint32_t>(words->bell).fetch_add(1, std::memory_order_seq_cst);
  if (std::atomic_ref<uint32_t>(words->sleepers).load(std::memory_order_seq_cst) != 0) {
    // Shared futex (no FUTEX_PRIVATE_FLAG): the sleeper is another process.
    syscall(SYS_futex, &words->bell, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
  }
}

uint32_t ReadDoorbell(const DoorbellWords* words) {
  return std::atomic_ref<const uint32_t>(words->bell).load(std::memory_order_seq_cst);
}

namespace {

void FutexSleep(DoorbellWords* words, uint32_t seen, std::chrono::microseconds timeout) {
  const auto micros = std::max<int64_t>(timeout.count(), 0);
  timespec relative{static_cast<time_t>(micros / 1000000),
                    static_cast<long>((micros % 1000000) * 1000)};
  // Returns at once if the bell moved since `seen`.
  syscall(SYS_futex, &words->bell, FUTEX_WAIT, seen, &relative, nullptr, 0);
}

}  // namespace

void SleepOnDoorbell(DoorbellWords* words, uint32_t seen, std::chrono::microseconds timeout) {
  std::atomic_ref<uint32_t> sleepers(words->sleepers);
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (ReadDoorbell(words) == seen) FutexSleep(words, seen, timeout);
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
}

bool WaitForDoorbell(DoorbellWords* words, const std::function<bool()>& ready,
                     std::chrono::microseconds timeout, std::chrono::microseconds spin) {
  if (ready()) return true;
  const auto spin_until = std::chrono::steady_clock::now() + spin;
  for (unsigned i = 1; std::chrono::steady_clock::now() < spin_until; ++i) {
    CpuRelax();
    if (ready()) return true;
    if (i % 64 == 0) sched_yield();  // another thread on this core may be the one we wait for
  }
  if (timeout.count() <= 0) return false;
  std::atomic_ref<uint32_t> sleepers(words->sleepers);
  const uint32_t seen = ReadDoorbell(words);
  sleepers.fetch_add(1, std::memory_order_seq_cst);
  if (ready()) {
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
    return true;
  }
  FutexSleep(words, seen, timeout);
  sleepers.fetch_sub(1, std::memory_order_seq_cst);
  return ready();
}

}  // namespace collectived
