// Lifeline: a callback runs with its object whole or not at all; the object's destructor waits
// for the callbacks already inside.
#include "engine/concurrency/lifeline.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <memory>
#include <thread>

namespace collectived {
namespace {

TEST(LifelineTest, RunsWhileAliveAndRefusesOnceRetired) {
  auto line = std::make_shared<Lifeline>();
  int runs = 0;
  EXPECT_TRUE(line->RunIfAlive([&] { ++runs; }));
  EXPECT_FALSE(line->retired());
  line->Retire();  // nothing inside: returns at once
  EXPECT_TRUE(line->retired());
  EXPECT_FALSE(line->RunIfAlive([&] { ++runs; }));
  EXPECT_FALSE(line->Enter());
  EXPECT_EQ(runs, 1);
}

TEST(LifelineTest, RetireWaitsForTheEntryInsideAndRefusesNewOnes) {
  auto line = std::make_shared<Lifeline>();
  std::promise<void> inside;
  std::promise<void> leave;
  std::atomic<bool> left{false};
  std::thread callback([&] {
    line->RunIfAlive([&] {
      inside.set_value();
      leave.get_future().wait();
      left = true;
    });
  });
  inside.get_future().wait();
  auto retiring = std::async(std::launch::async, [&] {
    line->Retire();
    return left.load();  // what the object's destructor would see
  });
  // Retire has begun once a new entry is refused; it is still waiting for the one inside.
  while (line->Enter()) line->Exit();
  EXPECT_EQ(retiring.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  leave.set_value();
  EXPECT_TRUE(retiring.get());
  callback.join();
}

TEST(LifelineTest, AnEntryInsideAnEntryIsRefusedOnceRetireBegan) {
  auto line = std::make_shared<Lifeline>();
  std::promise<void> inside;
  std::promise<void> go_on;
  bool nested = true;
  std::thread callback([&] {
    line->RunIfAlive([&] {
      inside.set_value();
      go_on.get_future().wait();
      // A callback that a hook runs synchronously, after the owner began to retire: refused,
      // not a deadlock.
      nested = line->RunIfAlive([] {});
    });
  });
  inside.get_future().wait();
  auto retiring = std::async(std::launch::async, [&] { line->Retire(); });
  while (line->Enter()) line->Exit();
  go_on.set_value();
  retiring.get();
  callback.join();
  EXPECT_FALSE(nested);
}

}  // namespace
}  // namespace collectived
