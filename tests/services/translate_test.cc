// The wire's CUDA VMM tensor reference (CudaVmmRef) read into the engine's DeviceTensorRef:
// bounded, and hostile values refused with a message naming what is wrong (whether the ids are
// the session's and the range fits their allocations is the importer's check,
// tests/engine/ipc_mapping_cache_test.cc). A request's stream signal: a word of the session's
// own sealed buffer, refused naming the op otherwise.
#include "services/collectived/translate.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>

#include "engine/sidecar/resource_ledger.h"

namespace collectived {
namespace {

using ::testing::AllOf;
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

int NewMemfd(size_t bytes, bool sealed) {
  const int fd = memfd_create("translate-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  if (sealed) {
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  }
  return fd;
}

class TranslateStreamSignal : public ::testing::Test {
 protected:
  void SetUp() override {
    auto sealed = session_.RegisterBuffer(NewMemfd(4096, true), 4096, *ledger_);
    auto unsealed = session_.RegisterBuffer(NewMemfd(4096, false), 4096, *ledger_);
    ASSERT_TRUE(sealed.ok() && unsealed.ok());
    sealed_ = *sealed;
    unsealed_ = *unsealed;
  }

  v1::CollectiveRequest Request(uint64_t buffer, uint64_t offset, bool send = false) {
    v1::CollectiveRequest request;
    request.set_group("g");
    v1::Tensor* tensor = send ? request.mutable_send()->mutable_tensor()
                              : request.mutable_allreduce()->mutable_tensor();
    if (send) request.mutable_send()->set_dst(1);
    tensor->set_dtype(v1::FLOAT32);
    tensor->set_count(1);
    tensor->set_inline_(std::string(4, '\0'));
    v1::StreamSignal* signal = request.mutable_stream_signal();
    signal->set_buffer_id(buffer);
    signal->set_offset(offset);
    signal->set_value(9);
    return request;
  }

  std::string Refused(const v1::CollectiveRequest& request) {
    StatusOr<TranslatedRequest> out = TranslateRequest(request, session_);
    EXPECT_FALSE(out.ok());
    return out.status().message();
  }

  std::shared_ptr<ResourceLedger> ledger_ =
      ResourceLedger::Create(ResourceCeilings::Defaults(MachineLimits::OfThisProcess()), nullptr);
  Session session_{"id", "s4", "unix", "trainer", 1};
  uint64_t sealed_ = 0;
  uint64_t unsealed_ = 0;
};

TEST_F(TranslateStreamSignal, AWordOfTheSessionsSealedBufferComesWithTheRequest) {
  StatusOr<TranslatedRequest> out = TranslateRequest(Request(sealed_, 4092), session_);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_TRUE(out->request.stream_signal.has_value());
  const StreamSignal& signal = *out->request.stream_signal;
  EXPECT_EQ(signal.value, 9u);
  EXPECT_EQ(signal.offset, 4092u);
  auto segment = session_.Buffer(sealed_);
  ASSERT_TRUE(segment.ok());
  EXPECT_EQ(signal.segment, *segment);
  EXPECT_FALSE(
      TranslateRequest(Request(sealed_, 0), session_)->request.stream_signal->written_on_stream);
  v1::CollectiveRequest plain = Request(sealed_, 0);
  plain.clear_stream_signal();
  EXPECT_FALSE(TranslateRequest(plain, session_)->request.stream_signal.has_value());
}

TEST_F(TranslateStreamSignal, HostileSignalsAreRefusedNamingTheOpAndWhatIsWrong) {
  EXPECT_THAT(Refused(Request(sealed_ + unsealed_ + 7, 0)),
              AllOf(HasSubstr("allreduce on group 'g'"), HasSubstr("stream signal")));
  EXPECT_THAT(Refused(Request(unsealed_, 0)), HasSubstr("not sealed against shrinking"));
  EXPECT_THAT(Refused(Request(sealed_, 2)), HasSubstr("not a multiple of 4"));
  EXPECT_THAT(Refused(Request(sealed_, 4096)), HasSubstr("outside the buffer's 4096 bytes"));
  EXPECT_THAT(Refused(Request(sealed_, UINT64_MAX - 3)), HasSubstr("outside"));
  EXPECT_THAT(Refused(Request(sealed_, 0, /*send=*/true)),
              AllOf(HasSubstr("send on group 'g'"), HasSubstr("for collectives")));
}

TEST_F(TranslateStreamSignal, ASessionSignalsThroughOneBufferWhileItIsRegistered) {
  ASSERT_TRUE(TranslateRequest(Request(sealed_, 0), session_).ok());
  auto other = session_.RegisterBuffer(NewMemfd(4096, true), 4096, *ledger_);
  ASSERT_TRUE(other.ok());
  EXPECT_THAT(Refused(Request(*other, 0)),
              AllOf(HasSubstr("session s4 signals through buffer " + std::to_string(sealed_)),
                    HasSubstr("not buffer " + std::to_string(*other)),
                    HasSubstr("which the sidecar pins")));
  ASSERT_TRUE(session_.UnregisterBuffer(sealed_).ok());
  StatusOr<TranslatedRequest> moved = TranslateRequest(Request(*other, 0), session_);
  EXPECT_TRUE(moved.ok()) << moved.status().ToString();
}

}  // namespace
}  // namespace collectived
