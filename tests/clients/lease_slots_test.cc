// LeaseSlots, which numbers the trainer's leased ready events (no GPU needed): the lowest free
// slot is taken first, new slots are made only while none is free and up to the bound, a taker
// past the bound waits for a slot to come back (or gives up after its timeout), and a slot given
// back twice or never taken changes nothing.
#include "clients/cpp/lease_slots.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <set>
#include <thread>
#include <vector>

namespace collectived {
namespace {

using std::chrono::milliseconds;

TEST(LeaseSlotsTest, SlotsAreMadeOnlyWhileNoneIsFreeAndTheLowestFreeIsTakenFirst) {
  LeaseSlots slots(8);
  EXPECT_EQ(slots.Acquire(milliseconds(0)), 0u);
  EXPECT_EQ(slots.Acquire(milliseconds(0)), 1u);
  EXPECT_EQ(slots.Acquire(milliseconds(0)), 2u);
  slots.Release(1);
  slots.Release(0);
  EXPECT_EQ(slots.Acquire(milliseconds(0)), 0u) << "not the lowest free slot";
  EXPECT_EQ(slots.Acquire(milliseconds(0)), 1u);
  EXPECT_EQ(slots.Acquire(milliseconds(0)), 3u);
  EXPECT_EQ(slots.made(), 4u) << "a slot was made while one was free";
  EXPECT_EQ(slots.taken(), 4u);
}

TEST(LeaseSlotsTest, PastTheBoundATakerWaitsForASlotToComeBack) {
  LeaseSlots slots(2);
  ASSERT_EQ(slots.Acquire(milliseconds(0)), 0u);
  ASSERT_EQ(slots.Acquire(milliseconds(0)), 1u);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(slots.Acquire(milliseconds(50)).has_value()) << "a third slot past the bound";
  EXPECT_GE(std::chrono::steady_clock::now() - start, milliseconds(50));
  EXPECT_EQ(slots.made(), 2u);

  std::thread giver([&] {
    std::this_thread::sleep_for(milliseconds(20));
    slots.Release(1);
  });
  EXPECT_EQ(slots.Acquire(milliseconds(10000)), 1u);
  giver.join();
  EXPECT_EQ(slots.taken(), 2u);
}

TEST(LeaseSlotsTest, ASlotGivenBackTwiceOrNeverMadeChangesNothing) {
  LeaseSlots slots(4);
  ASSERT_EQ(slots.Acquire(milliseconds(0)), 0u);
  slots.Release(0);
  slots.Release(0);
  slots.Release(7);
  EXPECT_EQ(slots.taken(), 0u);
  EXPECT_EQ(slots.made(), 1u);
  EXPECT_EQ(slots.Acquire(milliseconds(0)), 0u);
  EXPECT_EQ(slots.Acquire(milliseconds(0)), 1u) << "slot 0 was handed out twice";
}

TEST(LeaseSlotsTest, ThreadsNeverHoldTheSameSlot) {
  constexpr size_t kSlots = 4;
  LeaseSlots slots(kSlots);
  std::vector<std::atomic<int>> holders(kSlots);
  std::atomic<bool> shared{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        std::optional<size_t> slot = slots.Acquire(milliseconds(10000));
        ASSERT_TRUE(slot.has_value());
        ASSERT_LT(*slot, kSlots);
        if (holders[*slot].fetch_add(1) != 0) shared = true;
        std::this_thread::yield();
        holders[*slot].fetch_sub(1);
        slots.Release(*slot);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_FALSE(shared) << "two threads held one slot";
  EXPECT_EQ(slots.taken(), 0u);
  EXPECT_LE(slots.made(), kSlots);
}

}  // namespace
}  // namespace collectived
