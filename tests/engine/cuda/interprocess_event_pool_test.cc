// InterprocessEventPool's rings, with made-up events (no GPU needed): an event is recorded again
// only on the stream it was recorded on, rings of streams that end serve new streams, and the
// pool stays bounded.
#include "engine/cuda/interprocess_event_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>

namespace collectived {
namespace {

// Events numbered 1, 2, 3, ... in the order made (the pointer is the number; never used as one).
struct FakeMaker {
  uintptr_t made = 0;
  InterprocessEventPool::Maker maker() {
    return [this]() -> StatusOr<InterprocessEvent> {
      InterprocessEvent event;
      event.event = reinterpret_cast<cudaEvent_t>(++made);
      event.handle = "handle-" + std::to_string(made);
      return event;
    };
  }
};

const void* Stream(uintptr_t n) {
  return reinterpret_cast<const void*>(n);
}

TEST(InterprocessEventPoolTest, AStreamCyclesThroughARingNoOtherStreamShares) {
  FakeMaker fake;
  InterprocessEventPool pool(4, 8, fake.maker());
  std::map<cudaEvent_t, const void*> recorded_on;
  for (int round = 0; round < 3; ++round) {
    for (uintptr_t s = 1; s <= 3; ++s) {
      for (int i = 0; i < 4; ++i) {
        StatusOr<InterprocessEvent> event = pool.Next(0, Stream(s));
        ASSERT_TRUE(event.ok()) << event.status().ToString();
        auto [where, fresh] = recorded_on.emplace(event->event, Stream(s));
        EXPECT_EQ(where->second, Stream(s)) << "an event came to another stream's ring";
        EXPECT_EQ(event->handle,
                  "handle-" + std::to_string(reinterpret_cast<uintptr_t>(event->event)));
      }
    }
  }
  EXPECT_EQ(fake.made, 12u) << "4 events per stream, reused round-robin";
  // Round-robin: the fifth recording of a stream is its first event again.
  const cudaEvent_t first = pool.Next(0, Stream(9))->event;
  for (int i = 0; i < 3; ++i) EXPECT_NE(pool.Next(0, Stream(9))->event, first);
  EXPECT_EQ(pool.Next(0, Stream(9))->event, first);
}

TEST(InterprocessEventPoolTest, DevicesKeepRingsApartForTheSameStreamValue) {
  FakeMaker fake;
  InterprocessEventPool pool(2, 8, fake.maker());
  const cudaEvent_t on0 = pool.Next(0, Stream(1))->event;
  const cudaEvent_t on1 = pool.Next(1, Stream(1))->event;
  EXPECT_NE(on0, on1);
  EXPECT_EQ(pool.EventsOf(0), 1u);
  EXPECT_EQ(pool.EventsOf(1), 1u);
}

TEST(InterprocessEventPoolTest, AReleasedRingServesTheNextStreamWithoutNewEvents) {
  FakeMaker fake;
  InterprocessEventPool pool(3, 8, fake.maker());
  std::set<cudaEvent_t> of_first;
  for (int i = 0; i < 3; ++i) of_first.insert(pool.Next(0, Stream(1))->event);
  pool.Release(0, Stream(1));
  pool.Release(0, Stream(42));  // a stream with no ring: nothing happens
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(of_first.count(pool.Next(0, Stream(2))->event), 1u) << "taken from the free list";
  }
  EXPECT_EQ(fake.made, 3u);
  // The same stream value again after its release starts a ring of its own, made anew.
  const cudaEvent_t again = pool.Next(0, Stream(1))->event;
  EXPECT_EQ(of_first.count(again), 0u);
  EXPECT_EQ(fake.made, 4u);
  EXPECT_EQ(pool.EventsOf(0), 4u);
}

// The next event of `stream` on device 0, which the fake maker always makes.
uintptr_t Take(InterprocessEventPool& pool, uintptr_t stream) {
  StatusOr<InterprocessEvent> event = pool.Next(0, Stream(stream));
  EXPECT_TRUE(event.ok()) << event.status().ToString();
  return event.ok() ? reinterpret_cast<uintptr_t>(event->event) : 0;
}

TEST(InterprocessEventPoolTest, PastItsStreamsADeviceGivesTheLeastRecentlyUsedRingAway) {
  FakeMaker fake;
  InterprocessEventPool pool(2, 3, fake.maker());
  for (uintptr_t s = 1; s <= 3; ++s) {
    EXPECT_EQ(Take(pool, s), 2 * s - 1);
    EXPECT_EQ(Take(pool, s), 2 * s);
  }
  Take(pool, 1);
  Take(pool, 3);
  Take(pool, 2);
  Take(pool, 3);  // stream 1 is now the one used least recently
  const std::set<uintptr_t> of_one = {1, 2}, of_two = {3, 4};
  EXPECT_EQ(of_one.count(Take(pool, 4)), 1u) << "stream 1's ring went to stream 4";
  EXPECT_EQ(of_one.count(Take(pool, 4)), 1u);
  EXPECT_EQ(of_two.count(Take(pool, 2)), 1u) << "stream 2 keeps its ring";
  EXPECT_EQ(fake.made, 6u);
  // Many more streams, one after the other: the pool never grows past its bound.
  for (uintptr_t s = 10; s < 200; ++s) {
    Take(pool, s);
    Take(pool, s);
  }
  EXPECT_EQ(pool.EventsOf(0), 6u) << "bounded by streams x events per stream";
  EXPECT_EQ(fake.made, 6u);
}

TEST(InterprocessEventPoolTest, AnEventTheDriverRefusesIsAnErrorAndTheSlotStaysEmpty) {
  int calls = 0;
  InterprocessEventPool pool(2, 4, [&calls]() -> StatusOr<InterprocessEvent> {
    if (++calls == 1) return Status::InvalidArgument("no interprocess events here");
    InterprocessEvent event;
    event.event = reinterpret_cast<cudaEvent_t>(static_cast<uintptr_t>(calls));
    event.handle = "h";
    return event;
  });
  StatusOr<InterprocessEvent> refused = pool.Next(0, Stream(1));
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().IsInvalidArgument());
  EXPECT_NE(refused.status().message().find("no interprocess events"), std::string::npos);
  EXPECT_EQ(pool.EventsOf(0), 0u);
  StatusOr<InterprocessEvent> made = pool.Next(0, Stream(1));
  ASSERT_TRUE(made.ok());
  EXPECT_EQ(pool.EventsOf(0), 1u);
}

}  // namespace
}  // namespace collectived
