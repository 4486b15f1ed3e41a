#include "engine/group/gloo/gloo_rendezvous_store.h"

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <memory>
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

}  // namespace
}  // namespace collectived
