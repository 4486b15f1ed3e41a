#include "engine/group/gloo/gloo_rendezvous_store.h"

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/address.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/store/memory_store.h"
#include "engine/store/prefix_store.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

constexpr milliseconds kShort{200};
constexpr milliseconds kLong{std::chrono::seconds(20)};

std::shared_ptr<gloo::transport::Device> LoopbackDevice() {
  gloo::transport::tcp::attr attr;
  attr.hostname = "127.0.0.1";
  return gloo::transport::tcp::CreateDevice(attr);
}

// Forwards to another store and counts the calls made through it, by kind.
class CountingStore final : public Store {
 public:
  explicit CountingStore(std::shared_ptr<Store> inner = std::make_shared<MemoryStore>())
      : inner_(std::move(inner)) {}

  std::atomic<int> gets{0}, waits{0}, multi_gets{0}, sets{0};

 protected:
  Status DoSet(const std::string& key, std::string value) override {
    ++sets;
    return inner_->Set(key, std::move(value));
  }
  StatusOr<std::string> DoGet(const std::string& key, milliseconds timeout) override {
    ++gets;
    return inner_->Get(key, timeout);
  }
  StatusOr<int64_t> DoAdd(const std::string& key, int64_t delta) override {
    return inner_->Add(key, delta);
  }
  StatusOr<std::string> DoCompareSet(const std::string& key, const std::string& expected,
                                     std::string desired) override {
    return inner_->CompareSet(key, expected, std::move(desired));
  }
  Status DoWait(const std::vector<std::string>& keys, milliseconds timeout) override {
    ++waits;
    return inner_->Wait(keys, timeout);
  }
  StatusOr<bool> DoCheck(const std::vector<std::string>& keys) override {
    return inner_->Check(keys);
  }
  StatusOr<bool> DoDeleteKey(const std::string& key) override { return inner_->DeleteKey(key); }
  StatusOr<std::int64_t> DoDeletePrefix(const std::string& prefix) override {
    return inner_->DeletePrefix(prefix);
  }
  StatusOr<int64_t> DoNumKeys() override { return inner_->NumKeys(); }
  StatusOr<std::vector<std::string>> DoMultiGet(const std::vector<std::string>& keys,
                                                milliseconds timeout) override {
    ++multi_gets;
    return inner_->MultiGet(keys, timeout);
  }
  Status DoMultiSet(const std::vector<std::string>& keys,
                    std::vector<std::string> values) override {
    return inner_->MultiSet(keys, std::move(values));
  }
  Status DoAppend(const std::string& key, std::string_view value) override {
    return inner_->Append(key, value);
  }
  WaitId DoWaitAsync(std::vector<std::string> keys, milliseconds timeout,
                     WaitCallback done) override {
    return inner_->WaitAsync(std::move(keys), timeout, std::move(done));
  }
  bool DoCancelWait(WaitId id) override { return inner_->CancelWait(id); }

 private:
  const std::shared_ptr<Store> inner_;
};

TEST(GlooRendezvousStoreTest, SetGetRoundTripsBytes) {
  auto memory = std::make_shared<MemoryStore>();
  GlooRendezvousStore adapter(memory, kShort);
  const std::vector<char> data = {'a', '\0', 'b', static_cast<char>(0xff)};
  adapter.set("key", data);
  EXPECT_EQ(adapter.get("key"), data);
  EXPECT_EQ(memory->Get("key").value(), std::string("a\0b\xff", 4));
  EXPECT_EQ(adapter.store(), memory);
}

TEST(GlooRendezvousStoreTest, GetOfMissingKeyThrowsIoExceptionWithTimeout) {
  GlooRendezvousStore adapter(std::make_shared<MemoryStore>(), kShort);
  try {
    adapter.get("absent");
    FAIL() << "get of a missing key returned";
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("Timeout after 200 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("'absent'"), std::string::npos) << what;
  }
}

TEST(GlooRendezvousStoreTest, WaitUsesTheGivenOrDefaultTimeout) {
  auto memory = std::make_shared<MemoryStore>();
  ASSERT_TRUE(memory->SetDefaultTimeout(milliseconds(150)).ok());
  GlooRendezvousStore adapter(memory);  // the store's default timeout
  EXPECT_THROW(adapter.wait({"absent"}), gloo::IoException);
  try {
    adapter.wait({"x", "y"}, milliseconds(50));
    FAIL() << "wait returned";
  } catch (const gloo::IoException& e) {
    EXPECT_NE(std::string(e.what()).find("Timeout after 50 ms"), std::string::npos) << e.what();
  }
  EXPECT_THROW(adapter.wait({"absent"}, milliseconds(-1)), gloo::InvalidOperationException);
  // "Practically forever" is accepted (shortened to the store's limit), as is kNoTimeout.
  EXPECT_TRUE(memory->Set("there", "1").ok());
  EXPECT_NO_THROW(adapter.wait({"there"}, milliseconds::max()));
  EXPECT_NO_THROW(adapter.wait({"there"}, gloo::kNoTimeout));
}

TEST(GlooRendezvousStoreTest, WaitIsReleasedBySetFromAnotherThread) {
  auto memory = std::make_shared<MemoryStore>();
  GlooRendezvousStore adapter(memory, kLong);
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    adapter.set("a", {'1'});
    adapter.set("b", {'2'});
  });
  EXPECT_NO_THROW(adapter.wait({"a", "b"}));
  setter.join();
}

TEST(GlooRendezvousStoreTest, InvalidKeyThrowsInvalidOperation) {
  GlooRendezvousStore adapter(std::make_shared<MemoryStore>(), kShort);
  EXPECT_THROW(adapter.set("", {'x'}), gloo::InvalidOperationException);
  EXPECT_THROW(adapter.get(""), gloo::InvalidOperationException);
  EXPECT_THROW(adapter.set(std::string(kMaxKeyBytes + 1, 'k'), {'x'}),
               gloo::InvalidOperationException);
}

// Three Gloo ranks (threads) rendezvous through one MemoryStore, under a PrefixStore, over a
// real TCP device on loopback, then run option-style allreduces and check the sums.
TEST(GlooRendezvousStoreTest, ThreeRanksConnectFullMeshAndAllreduce) {
  constexpr int kWorld = 3;
  constexpr size_t kCount = 4096;
  auto memory = std::make_shared<MemoryStore>();
  auto group = std::make_shared<PrefixStore>("gloo/group0", memory);
  GlooRendezvousStore adapter(group, kLong);

  std::vector<std::string> errors(kWorld);
  std::vector<std::vector<float>> outputs(kWorld);
  std::vector<std::vector<double>> in_place(kWorld);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto device = LoopbackDevice();
        auto context = std::make_shared<gloo::rendezvous::Context>(rank, kWorld);
        context->setTimeout(kLong);
        context->connectFullMesh(adapter, device);

        std::vector<float> input(kCount);
        for (size_t i = 0; i < kCount; ++i) input[i] = static_cast<float>((rank + 1) * i);
        outputs[rank].assign(kCount, -1.0f);
        gloo::AllreduceOptions opts(context);
        opts.setInput(input.data(), input.size());
        opts.setOutput(outputs[rank].data(), outputs[rank].size());
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        opts.setTag(1);
        opts.setTimeout(kLong);
        gloo::allreduce(opts);

        // A second collective on the same context: in place, another dtype and tag.
        in_place[rank].assign(7, static_cast<double>(rank) + 0.5);
        gloo::AllreduceOptions opts2(context);
        opts2.setOutput(in_place[rank].data(), in_place[rank].size());
        opts2.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<double>));
        opts2.setTag(2);
        opts2.setTimeout(kLong);
        gloo::allreduce(opts2);
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();

  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(errors[rank], "") << "rank " << rank;
    for (size_t i = 0; i < kCount; ++i) {
      // (1 + 2 + 3) * i
      ASSERT_EQ(outputs[rank][i], static_cast<float>(6 * i)) << "rank " << rank << " i " << i;
    }
    for (double v : in_place[rank]) EXPECT_EQ(v, 0.5 + 1.5 + 2.5);
  }
  // The rendezvous really went through the prefix into the shared store.
  EXPECT_GE(memory->NumKeys().value(), kWorld);
}

// A rank that never shows up makes connectFullMesh throw our timeout instead of hanging.
TEST(GlooRendezvousStoreTest, ConnectFullMeshWithAMissingRankThrowsTimeout) {
  constexpr int kWorld = 3;
  auto group = std::make_shared<PrefixStore>("gloo/missing", std::make_shared<MemoryStore>());
  GlooRendezvousStore adapter(group, milliseconds(500));
  std::vector<std::string> errors(kWorld - 1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld - 1; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        auto device = LoopbackDevice();
        auto context = std::make_shared<gloo::rendezvous::Context>(rank, kWorld);
        context->setTimeout(milliseconds(500));
        context->connectFullMesh(adapter, device);
      } catch (const gloo::IoException& e) {
        errors[rank] = e.what();
      } catch (const std::exception& e) {
        errors[rank] = std::string("unexpected exception type: ") + e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < kWorld - 1; ++rank) {
    EXPECT_NE(errors[rank].find("Timeout after 500 ms"), std::string::npos)
        << "rank " << rank << ": " << errors[rank];
  }
}

TEST(GlooRendezvousStoreTest, BatchKeysAreReadWithOneMultiGetAndEqualTheStoredValues) {
  auto store = std::make_shared<CountingStore>();
  const std::vector<char> binary = {'x', '\0', static_cast<char>(0xff)};
  ASSERT_TRUE(store->Set("a", "1").ok());
  ASSERT_TRUE(store->Set("b", std::string(binary.begin(), binary.end())).ok());
  ASSERT_TRUE(store->Set("c", "").ok());
  ASSERT_TRUE(store->Set("other", "o").ok());
  GlooRendezvousStore adapter(store, kShort, {{"a", "b", "c"}});

  EXPECT_NO_THROW(adapter.wait({"b"}, kShort));  // fetches the whole batch
  EXPECT_EQ(store->multi_gets.load(), 1);
  EXPECT_EQ(adapter.get("a"), std::vector<char>({'1'}));
  EXPECT_EQ(adapter.get("b"), binary);
  EXPECT_EQ(adapter.get("c"), std::vector<char>());
  EXPECT_NO_THROW(adapter.wait({"a", "c"}));
  EXPECT_EQ(store->multi_gets.load(), 1);  // answered from the batch
  EXPECT_EQ(store->gets.load(), 0);
  EXPECT_EQ(store->waits.load(), 0);

  // Keys outside every batch still go to the store, one call each.
  EXPECT_EQ(adapter.get("other"), std::vector<char>({'o'}));
  EXPECT_EQ(store->gets.load(), 1);
  EXPECT_NO_THROW(adapter.wait({"other", "a"}, kShort));
  EXPECT_EQ(store->waits.load(), 1);
  EXPECT_EQ(store->multi_gets.load(), 1);
}

TEST(GlooRendezvousStoreTest, BatchWithAMissingKeyTimesOutNamingItAndIsFetchedLaterWhenComplete) {
  auto store = std::make_shared<CountingStore>();
  ASSERT_TRUE(store->Set("p/0", "zero").ok());
  GlooRendezvousStore adapter(store, kShort, {{"p/0", "p/1"}});
  // The key asked for exists, but its batch waits for every key of the batch.
  try {
    adapter.get("p/0");
    FAIL() << "get of a batch with a missing key returned";
  } catch (const gloo::IoException& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("Timeout after 200 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("'p/1'"), std::string::npos) << what;
    EXPECT_NE(what.find("1 of 2 keys missing"), std::string::npos) << what;
  }
  try {
    adapter.wait({"p/1"}, milliseconds(50));
    FAIL() << "wait for a missing batch key returned";
  } catch (const gloo::IoException& e) {
    EXPECT_NE(std::string(e.what()).find("Timeout after 50 ms"), std::string::npos) << e.what();
  }
  EXPECT_THROW(adapter.wait({"p/1"}, milliseconds(-1)), gloo::InvalidOperationException);
  // A failed fetch is not remembered: once the key exists, the batch is read.
  ASSERT_TRUE(store->Set("p/1", "one").ok());
  EXPECT_EQ(adapter.get("p/1"), std::vector<char>({'o', 'n', 'e'}));
  EXPECT_EQ(adapter.get("p/0"), std::vector<char>({'z', 'e', 'r', 'o'}));
}

TEST(GlooRendezvousStoreTest, BatchWaitIsReleasedBySetsFromAnotherThread) {
  auto store = std::make_shared<CountingStore>();
  GlooRendezvousStore adapter(store, kLong, {{"a", "b"}});
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_TRUE(store->Set("a", "1").ok());
    EXPECT_TRUE(store->Set("b", "2").ok());
  });
  EXPECT_EQ(adapter.get("b"), std::vector<char>({'2'}));
  setter.join();
  EXPECT_EQ(store->multi_gets.load(), 1);
}

TEST(GlooRendezvousStoreTest, ConnectFullMeshReadsNamesEveryPeerOnceInBoundedBatches) {
  EXPECT_TRUE(GlooRendezvousStore::ConnectFullMeshReads(0, 1).empty());
  // Rank 0 has no lower ranks: only the addresses of ranks 1 and 2.
  EXPECT_EQ(GlooRendezvousStore::ConnectFullMeshReads(0, 3),
            (std::vector<std::vector<std::string>>{{"1", "2"}}));
  EXPECT_EQ(GlooRendezvousStore::ConnectFullMeshReads(2, 3),
            (std::vector<std::vector<std::string>>{{"rank_0", "rank_1"}, {"0", "1"}}));
  // A large mesh: each peer's address record is (size - 1) addresses long, so the address
  // batches get smaller; every key still appears exactly once.
  constexpr int kSize = 2000;
  constexpr int kRank = 1234;
  std::set<std::string> seen;
  size_t keys = 0;
  for (const auto& batch : GlooRendezvousStore::ConnectFullMeshReads(kRank, kSize)) {
    ASSERT_FALSE(batch.empty());
    const bool addresses = batch.front().rfind("rank_", 0) != 0;
    if (addresses) {
      EXPECT_LE(batch.size() * (kSize - 1) * gloo::transport::Address::kMaxByteSize, 4u << 20);
    }
    for (const std::string& key : batch) seen.insert(key);
    keys += batch.size();
  }
  EXPECT_EQ(keys, seen.size());
  EXPECT_EQ(seen.size(), static_cast<size_t>(kRank + kSize - 1));
  EXPECT_EQ(seen.count(std::to_string(kRank)), 0u);
  EXPECT_EQ(seen.count("rank_" + std::to_string(kRank)), 0u);
  EXPECT_EQ(seen.count("rank_" + std::to_string(kRank - 1)), 1u);
}

// With the read batches of connectFullMesh, a real Gloo rendezvous (four ranks over TCP on
// loopback) reads peers' records with one MultiGet per batch and no single-key reads. This also
// checks that the batches name the keys this Gloo version reads: a key it read outside them
// would show up as a get or a wait.
TEST(GlooRendezvousStoreTest, ConnectFullMeshWithReadBatchesNeedsNoSingleKeyReads) {
  constexpr int kWorld = 4;
  auto shared = std::make_shared<PrefixStore>("gloo/batched", std::make_shared<MemoryStore>());
  std::vector<std::shared_ptr<CountingStore>> stores;
  for (int rank = 0; rank < kWorld; ++rank) {
    stores.push_back(std::make_shared<CountingStore>(shared));
  }
  std::vector<std::string> errors(kWorld);
  std::vector<float> sums(kWorld, -1.0f);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        GlooRendezvousStore adapter(stores[rank], kLong,
                                    GlooRendezvousStore::ConnectFullMeshReads(rank, kWorld));
        auto device = LoopbackDevice();
        auto context = std::make_shared<gloo::rendezvous::Context>(rank, kWorld);
        context->setTimeout(kLong);
        context->connectFullMesh(adapter, device);
        float value = static_cast<float>(rank + 1);
        gloo::AllreduceOptions opts(context);
        opts.setOutput(&value, 1);
        opts.setReduceFunction(
            static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
        opts.setTag(1);
        opts.setTimeout(kLong);
        gloo::allreduce(opts);
        sums[rank] = value;
      } catch (const std::exception& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_EQ(errors[rank], "") << "rank " << rank;
    EXPECT_EQ(sums[rank], 1.0f + 2.0f + 3.0f + 4.0f) << "rank " << rank;
    EXPECT_EQ(stores[rank]->gets.load(), 0) << "rank " << rank;
    EXPECT_EQ(stores[rank]->waits.load(), 0) << "rank " << rank;
    // The host names of the lower ranks (none for rank 0), then the peers' addresses.
    EXPECT_EQ(stores[rank]->multi_gets.load(), rank == 0 ? 1 : 2) << "rank " << rank;
  }
}

// Batched or not, a rank that never shows up is our timeout, naming its key.
TEST(GlooRendezvousStoreTest, ConnectFullMeshWithReadBatchesAndAMissingRankThrowsTimeout) {
  constexpr int kWorld = 3;
  auto group = std::make_shared<PrefixStore>("gloo/missing", std::make_shared<MemoryStore>());
  std::vector<std::string> errors(kWorld - 1);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld - 1; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        GlooRendezvousStore adapter(group, milliseconds(500),
                                    GlooRendezvousStore::ConnectFullMeshReads(rank, kWorld));
        auto device = LoopbackDevice();
        auto context = std::make_shared<gloo::rendezvous::Context>(rank, kWorld);
        context->setTimeout(milliseconds(500));
        context->connectFullMesh(adapter, device);
      } catch (const gloo::IoException& e) {
        errors[rank] = e.what();
      } catch (const std::exception& e) {
        errors[rank] = std::string("unexpected exception type: ") + e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < kWorld - 1; ++rank) {
    EXPECT_NE(errors[rank].find("Timeout after 500 ms"), std::string::npos)
        << "rank " << rank << ": " << errors[rank];
    EXPECT_NE(errors[rank].find("'gloo/missing/2'"), std::string::npos)
        << "rank " << rank << ": " << errors[rank];
  }
}

}  // namespace
}  // namespace collectived
