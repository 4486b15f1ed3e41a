// The wire's CUDA VMM tensor reference (CudaVmmRef) read into the engine's DeviceTensorRef:
// bounded, and hostile values refused with a message naming what is wrong (whether the ids are
// the session's and the range fits their allocations is the importer's check,
// tests/engine/ipc_mapping_cache_test.cc).
#include "services/collectived/translate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>

namespace collectived {
namespace {

using ::testing::HasSubstr;

v1::CudaVmmRef Ref(int ids, uint64_t offset, uint64_t length, int32_t device = 0) {
  v1::CudaVmmRef ref;
  for (int i = 0; i < ids; ++i) ref.add_registration_ids(100 + i);
  ref.set_offset(offset);
  ref.set_length(length);
  ref.set_device(device);
  ref.set_event_handle(std::string(64, 'e'));
  return ref;
}

TEST(TranslateCudaVmmRef, AValidReferenceKeepsItsIdsInOrder) {
  StatusOr<DeviceTensorRef> ref = TranslateCudaVmmRef(Ref(3, 4096, 1 << 20, 1));
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  EXPECT_EQ(ref->vmm_registrations, (std::vector<uint64_t>{100, 101, 102}));
  EXPECT_EQ(ref->offset, 4096u);
  EXPECT_EQ(ref->length, 1u << 20);
  EXPECT_EQ(ref->device, 1);
  EXPECT_EQ(ref->event_handle, std::string(64, 'e'));
  EXPECT_TRUE(ref->memory_handle.empty());
  EXPECT_TRUE(TranslateCudaVmmRef(Ref(64, 0, 8)).ok());  // the bound itself
}

TEST(TranslateCudaVmmRef, HostileReferencesAreRefusedNamingWhatIsWrong) {
  auto refused = [](const v1::CudaVmmRef& ref) {
    StatusOr<DeviceTensorRef> out = TranslateCudaVmmRef(ref);
    EXPECT_FALSE(out.ok());
    EXPECT_TRUE(out.status().IsInvalidArgument()) << out.status().ToString();
    return out.status().message();
  };
  EXPECT_THAT(refused(Ref(0, 0, 8)), HasSubstr("without registration ids"));
  EXPECT_THAT(refused(Ref(65, 0, 8)), HasSubstr("spans 65 allocations; at most 64"));
  EXPECT_THAT(refused(Ref(100000, 0, 8)), HasSubstr("at most 64"));
  EXPECT_THAT(refused(Ref(1, 0, 8, -2)), HasSubstr("negative device -2"));
  EXPECT_THAT(refused(Ref(1, UINT64_MAX - 3, 8)), HasSubstr("overflows"));
  EXPECT_THAT(refused(Ref(1, 8, UINT64_MAX)), HasSubstr("overflows"));
}

}  // namespace
}  // namespace collectived
