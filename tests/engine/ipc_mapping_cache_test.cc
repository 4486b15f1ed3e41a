// IpcMappingCache's logic with an opener over host memory (the CUDA opener needs a GPU; the
// GPU checks exercise it): each allocation opened once, never aliased after the client frees
// and re-allocates, ranges checked against the real size, bounded, closed when unused.
#include "engine/memory/ipc_mapping_cache.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <list>
#include <map>
#include <set>
#include <vector>

namespace collectived {
namespace {

// "Allocations" are host buffers named by their handle; the test frees and re-creates them.
// VMM "allocations" are memfds whose size is the allocation's real size; a mapping is a fresh
// host buffer of the parts' total size.
class HostOpener final : public IpcOpener {
 public:
  struct State {
    std::map<std::string, std::vector<std::byte>> allocations;
    std::multiset<std::string> open;  // handles open right now
    int closes = 0;
    int event_opens = 0;
    std::set<uint64_t> vmm_imported;  // handles imported and not released
    int vmm_maps = 0;
    int vmm_unmaps = 0;
    uint64_t next_vmm_handle = 100;
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
  StatusOr<VmmImport> ImportVmm(int, int fd, uint64_t bytes) override {
    struct stat info {};
    const bool known = fstat(fd, &info) == 0;
    close(fd);
    if (!known) return Status::InvalidArgument("not a descriptor");
    if (bytes > static_cast<uint64_t>(info.st_size)) {
      return Status::InvalidArgument("the allocation does not hold the " + std::to_string(bytes) +
                                     " bytes the client gave as its size");
    }
    const uint64_t handle = state_->next_vmm_handle++;
    state_->vmm_imported.insert(handle);
    return VmmImport{handle, static_cast<size_t>(bytes)};
  }
  void ReleaseVmm(int, const VmmImport& import) override {
    state_->vmm_imported.erase(import.handle);
  }
  StatusOr<Allocation> MapVmm(int, const std::vector<VmmImport>& parts) override {
    size_t total = 0;
    for (const VmmImport& part : parts) total += part.bytes;
    auto& buffer = vmm_buffers_.emplace_back(total);
    ++state_->vmm_maps;
    return Allocation{buffer.data(), total};
  }
  void UnmapVmm(int, const Allocation&) override { ++state_->vmm_unmaps; }

 private:
  std::shared_ptr<State> state_;
  std::map<std::byte*, std::string> handles_;
  std::list<std::vector<std::byte>> vmm_buffers_;
};

// An IpcOpener that knows nothing of VMM (the base class's refusals).
class IpcOnlyOpener final : public IpcOpener {
 public:
  DeviceKind kind() const override { return DeviceKind::kCuda; }
  StatusOr<Allocation> OpenMemory(int, std::string_view) override {
    return Status::InvalidArgument("no");
  }
  void CloseMemory(int, const Allocation&) override {}
  StatusOr<std::shared_ptr<DeviceEvent>> OpenEvent(int, std::string_view) override {
    return Status::InvalidArgument("no");
  }
};

// A descriptor of a file of `bytes` bytes (the stand-in for an exported VMM allocation).
int FileOf(size_t bytes) {
  const int fd = memfd_create("vmm-test", MFD_CLOEXEC);
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether `fd` is open in this process.
bool IsOpen(int fd) {
  return fcntl(fd, F_GETFD) != -1;
}

struct IpcMappingCacheTest : ::testing::Test {
  std::shared_ptr<HostOpener::State> state = std::make_shared<HostOpener::State>();
  DeviceTensorRef Ref(std::string handle, uint64_t offset, uint64_t length,
                      std::string event = "") {
    return DeviceTensorRef{0, std::move(handle), offset, length, std::move(event), {}};
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

namespace collectived {
namespace {

DeviceTensorRef VmmRef(std::vector<uint64_t> ids, uint64_t offset, uint64_t length,
                       int device = 0) {
  DeviceTensorRef ref;
  ref.device = device;
  ref.offset = offset;
  ref.length = length;
  ref.vmm_registrations = std::move(ids);
  return ref;
}

TEST_F(IpcMappingCacheTest, VmmAllocationsAreRegisteredOnceAndMappedTogetherOncePerSequence) {
  IpcMappingCache cache(std::make_shared<HostOpener>(state));
  StatusOr<uint64_t> a = cache.RegisterVmm(FileOf(4096), 4096, 0);
  StatusOr<uint64_t> b = cache.RegisterVmm(FileOf(4096), 4096, 0);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_NE(*a, *b);
  EXPECT_EQ(cache.VmmRegistrations(), 2u);
  // A tensor across both allocations: one mapping of 8192 bytes, reused by the next op.
  StatusOr<TensorView> across = cache.Import(VmmRef({*a, *b}, 4000, 192), DType::kFloat32, 48);
  ASSERT_TRUE(across.ok()) << across.status().ToString();
  StatusOr<TensorView> again = cache.Import(VmmRef({*a, *b}, 0, 8192), DType::kUInt8, 8192);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(state->vmm_maps, 1);
  EXPECT_EQ(again->data + 4000, across->data);
  EXPECT_EQ(across->device, (Device{DeviceKind::kCuda, 0}));
  // Another sequence is another mapping.
  ASSERT_TRUE(cache.Import(VmmRef({*b}, 0, 4096), DType::kUInt8, 4096).ok());
  EXPECT_EQ(state->vmm_maps, 2);
  EXPECT_EQ(cache.OpenMappings(), 2u);
}

TEST_F(IpcMappingCacheTest, HostileVmmReferencesAreRefusedNamingWhatIsWrong) {
  IpcMappingCache cache(std::make_shared<HostOpener>(state));
  StatusOr<uint64_t> a = cache.RegisterVmm(FileOf(4096), 4096, 0);
  ASSERT_TRUE(a.ok());
  auto refused = [&](const DeviceTensorRef& ref, size_t count, const std::string& words) {
    StatusOr<TensorView> view = cache.Import(ref, DType::kUInt8, count);
    ASSERT_FALSE(view.ok());
    EXPECT_TRUE(view.status().IsInvalidArgument()) << view.status().ToString();
    EXPECT_NE(view.status().message().find(words), std::string::npos) << view.status().message();
  };
  refused(VmmRef({*a, 999}, 0, 8), 8, "VMM registration 999 is not one of this session's");
  refused(VmmRef({*a}, 0, 8, /*device=*/1), 8, "is memory of device 0, not of device 1");
  refused(VmmRef(std::vector<uint64_t>(kMaxVmmAllocationsPerTensor + 1, *a), 0, 8), 8,
          "at most 64 are accepted");
  refused(VmmRef({*a}, 4090, 8), 8, "lie outside its 1 VMM allocations of 4096 bytes in all");
  refused(VmmRef({*a}, ~uint64_t{0} - 3, 8), 8, "lie outside");
  refused(VmmRef({*a}, 0, 4097), 4097, "lie outside");
  EXPECT_EQ(state->vmm_maps, 1);  // the unknown id, device and bound were refused before mapping
}

TEST_F(IpcMappingCacheTest, AVmmRegistrationWithALyingSizeOrPastTheBoundIsRefusedAndItsFdClosed) {
  IpcMappingCache cache(std::make_shared<HostOpener>(state), 256, 64, /*max_vmm_registrations=*/1);
  const int lying = FileOf(4096);
  StatusOr<uint64_t> refused = cache.RegisterVmm(lying, 8192, 0);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().IsInvalidArgument());
  EXPECT_NE(refused.status().message().find("does not hold the 8192 bytes"), std::string::npos)
      << refused.status().message();
  EXPECT_FALSE(IsOpen(lying));
  for (auto [bytes, device, words] :
       {std::tuple{uint64_t{0}, 0, "size 0"}, std::tuple{uint64_t{4096}, -1, "negative device"}}) {
    const int fd = FileOf(4096);
    StatusOr<uint64_t> bad = cache.RegisterVmm(fd, bytes, device);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.status().message().find(words), std::string::npos) << bad.status().message();
    EXPECT_FALSE(IsOpen(fd));
  }
  ASSERT_TRUE(cache.RegisterVmm(FileOf(4096), 4096, 0).ok());
  const int over = FileOf(4096);
  StatusOr<uint64_t> full = cache.RegisterVmm(over, 4096, 0);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.status().kind(), ErrorKind::kResourceExhausted) << full.status().ToString();
  EXPECT_FALSE(IsOpen(over));
  EXPECT_EQ(state->vmm_imported.size(), 1u);
}

TEST_F(IpcMappingCacheTest, VmmMappingsAndImportsAreReleasedWhenTheSessionAndItsOpsAreGone) {
  StatusOr<TensorView> in_flight = Status::Internal("unset");
  {
    IpcMappingCache cache(std::make_shared<HostOpener>(state), /*max_mappings=*/1);
    StatusOr<uint64_t> a = cache.RegisterVmm(FileOf(4096), 4096, 0);
    StatusOr<uint64_t> b = cache.RegisterVmm(FileOf(4096), 4096, 0);
    ASSERT_TRUE(a.ok() && b.ok());
    in_flight = cache.Import(VmmRef({*a}, 0, 16), DType::kUInt8, 16);
    ASSERT_TRUE(in_flight.ok());
    ASSERT_TRUE(cache.Import(VmmRef({*b}, 0, 16), DType::kUInt8, 16).ok());  // evicts {a}
    EXPECT_EQ(state->vmm_unmaps, 0);  // {a} is still used by the op in flight
    EXPECT_EQ(state->vmm_imported.size(), 2u);
  }
  EXPECT_EQ(state->vmm_unmaps, 1);            // {b}: the cache is gone
  EXPECT_EQ(state->vmm_imported.size(), 1u);  // a: its mapping is still in use
  in_flight = Status::Internal("done");
  EXPECT_EQ(state->vmm_unmaps, 2);
  EXPECT_TRUE(state->vmm_imported.empty());
}

TEST_F(IpcMappingCacheTest, AnUnregisteredVmmAllocationGoesOnceNoOpUsesIt) {
  IpcMappingCache cache(std::make_shared<HostOpener>(state));
  StatusOr<uint64_t> a = cache.RegisterVmm(FileOf(4096), 4096, 0);
  StatusOr<uint64_t> b = cache.RegisterVmm(FileOf(4096), 4096, 0);
  ASSERT_TRUE(a.ok() && b.ok());
  StatusOr<TensorView> in_flight = cache.Import(VmmRef({*a, *b}, 0, 16), DType::kUInt8, 16);
  ASSERT_TRUE(in_flight.ok());
  ASSERT_TRUE(cache.Import(VmmRef({*b}, 0, 16), DType::kUInt8, 16).ok());
  ASSERT_TRUE(cache.UnregisterVmm(*a).ok());
  EXPECT_EQ(cache.VmmRegistrations(), 1u);
  EXPECT_EQ(state->vmm_imported.size(), 2u);  // the op in flight still maps a
  in_flight = Status::Internal("done");
  EXPECT_EQ(state->vmm_unmaps, 1);
  EXPECT_EQ(state->vmm_imported.size(), 1u);
  EXPECT_EQ(cache.OpenMappings(), 1u);  // {b} stays cached
  EXPECT_TRUE(cache.UnregisterVmm(*a).IsNotFound());
  StatusOr<TensorView> stale = cache.Import(VmmRef({*a}, 0, 16), DType::kUInt8, 16);
  ASSERT_FALSE(stale.ok());
  EXPECT_NE(stale.status().message().find("is not one of this session's"), std::string::npos);
}

TEST_F(IpcMappingCacheTest, AnOpenerWithoutVmmRefusesRegistrationsAndClosesTheFd) {
  IpcMappingCache cache(std::make_shared<IpcOnlyOpener>());
  const int fd = FileOf(4096);
  StatusOr<uint64_t> refused = cache.RegisterVmm(fd, 4096, 0);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("cannot import VMM memory"), std::string::npos)
      << refused.status().message();
  EXPECT_FALSE(IsOpen(fd));
}

}  // namespace
}  // namespace collectived
