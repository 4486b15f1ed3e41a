// IpcHandleCache, the trainer's cache of CUDA IPC handles by allocation (no GPU needed): a
// handle is reused only for the same device, base, size and driver buffer id, so memory freed and
// allocated again at the same address gets a handle of its own; an allocation without a buffer
// id is never cached; past its capacity the least recently used entry goes.
#include "clients/cpp/ipc_handle_cache.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace collectived {
namespace {

constexpr uint64_t kBase = 0x7f0000000000;
constexpr uint64_t kBytes = 2 << 20;

TEST(IpcHandleCacheTest, TheSameAllocationFindsItsHandle) {
  IpcHandleCache cache;
  EXPECT_FALSE(cache.Find(0, kBase, kBytes, 7).has_value());
  cache.Put(0, kBase, kBytes, 7, "handle-7");
  std::optional<std::string> found = cache.Find(0, kBase, kBytes, 7);
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(*found, "handle-7");
  EXPECT_EQ(cache.size(), 1u);
}

TEST(IpcHandleCacheTest, NewMemoryAtTheSameAddressIsAMissAndReplacesTheOldHandle) {
  IpcHandleCache cache;
  cache.Put(0, kBase, kBytes, 7, "handle-7");
  // Freed and allocated again at the same base: another buffer id, or another size.
  EXPECT_FALSE(cache.Find(0, kBase, kBytes, 8).has_value());
  EXPECT_FALSE(cache.Find(0, kBase, kBytes * 2, 7).has_value());
  cache.Put(0, kBase, kBytes, 8, "handle-8");
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_FALSE(cache.Find(0, kBase, kBytes, 7).has_value()) << "the old handle came back";
  EXPECT_EQ(cache.Find(0, kBase, kBytes, 8).value_or(""), "handle-8");
}

TEST(IpcHandleCacheTest, DevicesAreKeptApart) {
  IpcHandleCache cache;
  cache.Put(0, kBase, kBytes, 7, "gpu0");
  EXPECT_FALSE(cache.Find(1, kBase, kBytes, 7).has_value());
  cache.Put(1, kBase, kBytes, 7, "gpu1");
  EXPECT_EQ(cache.Find(0, kBase, kBytes, 7).value_or(""), "gpu0");
  EXPECT_EQ(cache.Find(1, kBase, kBytes, 7).value_or(""), "gpu1");
}

TEST(IpcHandleCacheTest, AnAllocationWithoutABufferIdIsNeverCached) {
  IpcHandleCache cache;
  cache.Put(0, kBase, kBytes, IpcHandleCache::kNoBufferId, "unnamed");
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(cache.Find(0, kBase, kBytes, IpcHandleCache::kNoBufferId).has_value());
}

TEST(IpcHandleCacheTest, PastItsCapacityTheLeastRecentlyUsedEntryGoes) {
  IpcHandleCache cache(3);
  for (uint64_t i = 0; i < 3; ++i)
    cache.Put(0, kBase + i * kBytes, kBytes, i + 1, "h" + std::to_string(i));
  ASSERT_TRUE(cache.Find(0, kBase, kBytes, 1).has_value());  // entry 0 used: entry 1 is oldest
  cache.Put(0, kBase + 3 * kBytes, kBytes, 4, "h3");
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_TRUE(cache.Find(0, kBase, kBytes, 1).has_value());
  EXPECT_FALSE(cache.Find(0, kBase + kBytes, kBytes, 2).has_value()) << "not the oldest went";
  EXPECT_TRUE(cache.Find(0, kBase + 2 * kBytes, kBytes, 3).has_value());
  EXPECT_TRUE(cache.Find(0, kBase + 3 * kBytes, kBytes, 4).has_value());
}

TEST(IpcHandleCacheTest, ThreadsShareItSafely) {
  IpcHandleCache cache(64);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (uint64_t i = 0; i < 2000; ++i) {
        const uint64_t slot = (i + t) % 100;  // more allocations than the capacity
        const std::string handle = "h" + std::to_string(slot);
        std::optional<std::string> found = cache.Find(0, kBase + slot * kBytes, kBytes, slot + 1);
        if (found) {
          EXPECT_EQ(*found, handle);
        } else {
          cache.Put(0, kBase + slot * kBytes, kBytes, slot + 1, handle);
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_LE(cache.size(), 64u);
}

}  // namespace
}  // namespace collectived
