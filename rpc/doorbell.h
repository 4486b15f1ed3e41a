// Doorbell: how one process wakes another that sleeps on shared memory (a futex word, not a
// private one: both processes map the same file). A sleeper spins a bounded number of times,
// then announces itself and sleeps in the kernel; a ringer pays for a system call only when
// someone sleeps. Every sleep has a timeout, so a peer that never rings (it died, or it is
// hostile and scribbles on the word) costs at most one timeout, never a hang.
//
// Thread-safety: any number of ringers and sleepers, in any processes that map the word.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

namespace collectived {

// The shared words of one doorbell; lives in shared memory, 64-byte aligned by its container.
struct DoorbellWords {
  uint32_t bell = 0;      // bumped by every ring; the futex word
  uint32_t sleepers = 0;  // how many are asleep (or about to be) on `bell`
};

// Rings: bumps the bell and wakes the sleepers, if any.
void RingDoorbell(DoorbellWords* words);

// The bell's current value, for SleepOnDoorbell.
uint32_t ReadDoorbell(const DoorbellWords* words);

// Sleeps until the bell moves away from `seen` (at once if it already has), or `timeout`.
// Reading the bell, then checking for work, then sleeping since that value loses no ring.
void SleepOnDoorbell(DoorbellWords* words, uint32_t seen, std::chrono::microseconds timeout);

// Returns as soon as `ready()` is true (checked first, then while spinning for `spin`, yielding
// the core now and then), or after sleeping until a ring or `timeout` (no sleep for a zero
// timeout). Returns the last value of `ready()`.
bool WaitForDoorbell(DoorbellWords* words, const std::function<bool()>& ready,
                     std::chrono::microseconds timeout, std::chrono::microseconds spin);

}  // namespace collectived
