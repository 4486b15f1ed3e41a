// IpcMappingCache's logic with an opener over host memory (the CUDA opener needs a GPU; the
// GPU checks exercise it): each allocation opened once, never aliased after the client frees
// and re-allocates, ranges checked against the real size, bounded, closed when unused.
#include "engine/ipc_mapping_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

namespace collectived {
namespace {

// "Allocations" are host buffers named by their handle; the test frees and re-creates them.
class HostOpener final : public IpcOpener {
 public:
  struct State {
    std::map<std::string, std::vector<std::byte>> allocations;
    std::multiset<std::string> open;  // handles open right now
    int closes = 0;
    int event_opens = 0;
  };
  explicit HostOpener(std::shared_ptr<State> state) : state_(std::move(state)) {}

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  StatusOr<Allocation> OpenMemory(int, std::string_view handle) override {
    auto found = state_->allocations.find(std::string(handle));
    if (found == state_->allocations.end()) return Status::InvalidArgument("unknown handle");
    state_->open.insert(std::string(handle));
    handles_[found->second.data()] = std::string(handle);
    return Allocation{found->second.data(), found->second.size()};
  }
  void CloseMemory(int, const Allocation& allocation) override {
    state_->open.erase(state_->open.find(handles_.at(allocation.base)));
    ++state_->closes;
  }
  StatusOr<std::shared_ptr<DeviceEvent>> OpenEvent(int, std::string_view handle) override {
    if (handle == "bad") return Status::InvalidArgument("bad event handle");
    ++state_->event_opens;
    return std::make_shared<DeviceEvent>();
  }

 private:
  std::shared_ptr<State> state_;
  std::map<std::byte*, std::string> handles_;
};

struct IpcMappingCacheTest : ::testing::Test {
  std::shared_ptr<HostOpener::State> state = std::make_shared<HostOpener::State>();
  DeviceTensorRef Ref(std::string handle, uint64_t offset, uint64_t length,
                      std::string event = "") {
    return DeviceTensorRef{0, std::move(handle), offset, length, std::move(event)};
  }
};

TEST_F(IpcMappingCacheTest, EachAllocationIsOpenedOnceAndViewsPointIntoIt) {
  state->allocations["A"] = std::vector<std::byte>(4096);
  IpcMappingCache cache(std::make_shared<HostOpener>(state));
  StatusOr<TensorView> first = cache.Import(Ref("A", 0, 1024), DType::kFloat32, 256);
  StatusOr<TensorView> second = cache.Import(Ref("A", 1024, 2048), DType::kFloat32, 512);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  EXPECT_EQ(cache.opens(), 1u);
  EXPECT_EQ(cache.OpenMappings(), 1u);
  EXPECT_EQ(first->data, state->allocations["A"].data());
  EXPECT_EQ(second->data, state->allocations["A"].data() + 1024);
  EXPECT_EQ(second->device, (Device{DeviceKind::kCuda, 0}));
  EXPECT_EQ(second->count, 512u);
  EXPECT_EQ(second->ready, nullptr);
}

TEST_F(IpcMappingCacheTest, AReallocatedAllocationNeverAliasesTheStaleMapping) {
  // The client frees allocation A and allocates B; B has a handle of its own.
  state->allocations["A"] = std::vector<std::byte>(256);
  IpcMappingCache cache(std::make_shared<HostOpener>(state));
  ASSERT_TRUE(cache.Import(Ref("A", 0, 256), DType::kUInt8, 256).ok());
  state->allocations["B"] = std::vector<std::byte>(512);
  StatusOr<TensorView> b = cache.Import(Ref("B", 0, 512), DType::kUInt8, 512);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->data, state->allocations["B"].data());
  EXPECT_EQ(cache.opens(), 2u);
}

TEST_F(IpcMappingCacheTest, RangesOutsideTheAllocationAndBadShapesAreRefusedWithReasons) {
  state->allocations["A"] = std::vector<std::byte>(1000);
  IpcMappingCache cache(std::make_shared<HostOpener>(state));
  StatusOr<TensorView> past = cache.Import(Ref("A", 800, 400), DType::kFloat32, 100);
  ASSERT_FALSE(past.ok());
  EXPECT_TRUE(past.status().IsInvalidArgument());
  EXPECT_NE(past.status().message().find("outside its allocation of 1000 bytes"), std::string::npos)
      << past.status().message();
  // An offset that would wrap around.
  StatusOr<TensorView> wrap = cache.Import(Ref("A", ~uint64_t{0} - 3, 4), DType::kFloat32, 1);
  ASSERT_FALSE(wrap.ok());
  EXPECT_TRUE(wrap.status().IsInvalidArgument());
  StatusOr<TensorView> count = cache.Import(Ref("A", 0, 400), DType::kFloat32, 99);
  ASSERT_FALSE(count.ok());
  EXPECT_NE(count.status().message().find("are not 400 bytes"), std::string::npos);
  StatusOr<TensorView> aligned = cache.Import(Ref("A", 2, 4), DType::kFloat32, 1);
  ASSERT_FALSE(aligned.ok());
  EXPECT_NE(aligned.status().message().find("not aligned"), std::string::npos);
  StatusOr<TensorView> unknown = cache.Import(Ref("Z", 0, 4), DType::kFloat32, 1);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("cuda:0 tensor"), std::string::npos);
  DeviceTensorRef negative = Ref("A", 0, 4);
  negative.device = -1;
  EXPECT_TRUE(cache.Import(negative, DType::kFloat32, 1).status().IsInvalidArgument());
}

TEST_F(IpcMappingCacheTest, EvictedMappingsCloseOnlyWhenNoViewUsesThem) {
  for (const char* name : {"A", "B", "C"}) state->allocations[name] = std::vector<std::byte>(64);
  IpcMappingCache cache(std::make_shared<HostOpener>(state), /*max_mappings=*/2);
  StatusOr<TensorView> a = cache.Import(Ref("A", 0, 64), DType::kUInt8, 64);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(cache.Import(Ref("B", 0, 64), DType::kUInt8, 64).ok());
  ASSERT_TRUE(cache.Import(Ref("C", 0, 64), DType::kUInt8, 64).ok());  // evicts A
  // A is out of the cache but an op still uses it: open until the view goes.
  EXPECT_EQ(state->open.count("A"), 1u);
  EXPECT_EQ(cache.OpenMappings(), 3u);
  a = Status::Internal("dropped");
  EXPECT_EQ(state->open.count("A"), 0u);
  EXPECT_EQ(cache.OpenMappings(), 2u);
  // Using A again opens it again.
  ASSERT_TRUE(cache.Import(Ref("A", 0, 64), DType::kUInt8, 64).ok());
  EXPECT_EQ(cache.opens(), 4u);
}

TEST_F(IpcMappingCacheTest, EverythingClosesWhenTheSessionsCacheAndItsOpsAreGone) {
  state->allocations["A"] = std::vector<std::byte>(64);
  state->allocations["B"] = std::vector<std::byte>(64);
  StatusOr<TensorView> in_flight = Status::Internal("unset");
  {
    IpcMappingCache cache(std::make_shared<HostOpener>(state));
    in_flight = cache.Import(Ref("A", 0, 64), DType::kUInt8, 64);
    ASSERT_TRUE(cache.Import(Ref("B", 0, 64), DType::kUInt8, 64).ok());
  }
  EXPECT_EQ(state->open.size(), 1u);  // the op in flight holds A
  in_flight = Status::Internal("done");
  EXPECT_TRUE(state->open.empty());
  EXPECT_EQ(state->closes, 2);
}

TEST_F(IpcMappingCacheTest, EventsAreOpenedOnceAndAttachedToTheView) {
  state->allocations["A"] = std::vector<std::byte>(64);
  IpcMappingCache cache(std::make_shared<HostOpener>(state));
  StatusOr<TensorView> first = cache.Import(Ref("A", 0, 64, "E"), DType::kUInt8, 64);
  StatusOr<TensorView> second = cache.Import(Ref("A", 0, 64, "E"), DType::kUInt8, 64);
  ASSERT_TRUE(first.ok() && second.ok());
  ASSERT_NE(first->ready, nullptr);
  EXPECT_EQ(first->ready, second->ready);
  EXPECT_EQ(state->event_opens, 1);
  EXPECT_EQ(first->Slice(1, 2).ready, first->ready);
  StatusOr<TensorView> bad = cache.Import(Ref("A", 0, 64, "bad"), DType::kUInt8, 64);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad event handle"), std::string::npos);
}

}  // namespace
}  // namespace collectived
