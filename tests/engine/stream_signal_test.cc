// StreamSignal's checks of a client's word (sealed buffer, aligned, inside it) and the segment
// attachment a device registration of the word's pages lives in.
#include "engine/vocabulary/stream_signal.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <memory>

namespace collectived {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<ShmSegment> Segment(size_t bytes, bool sealed) {
  const int fd = memfd_create("stream-signal-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  if (sealed) {
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  }
  auto segment = ShmSegment::Adopt(fd, 0, "buffer 4 of session s2");
  EXPECT_TRUE(segment.ok()) << segment.status().ToString();
  return *segment;
}

TEST(StreamSignalTest, AWordOfASealedBufferIsSetWithItsValue) {
  auto segment = Segment(4096, /*sealed=*/true);
  StatusOr<StreamSignal> signal = MakeStreamSignal(segment, 4092, 77);
  ASSERT_TRUE(signal.ok()) << signal.status().ToString();
  EXPECT_EQ(reinterpret_cast<std::byte*>(signal->word()), segment->data() + 4092);
  EXPECT_FALSE(signal->written_on_stream);
  StoreSignal(*signal);
  EXPECT_EQ(*reinterpret_cast<uint32_t*>(segment->data() + 4092), 77u);
}

TEST(StreamSignalTest, AnUnsealedOrLargeBufferAMisalignedOffsetOrOneOutsideIsRefusedNamingIt) {
  StatusOr<StreamSignal> unsealed = MakeStreamSignal(Segment(4096, false), 0, 1);
  EXPECT_TRUE(unsealed.status().IsInvalidArgument());
  EXPECT_THAT(unsealed.status().message(), HasSubstr("buffer 4 of session s2"));
  EXPECT_THAT(unsealed.status().message(), HasSubstr("F_SEAL_SHRINK"));

  StatusOr<StreamSignal> large =
      MakeStreamSignal(Segment(kMaxStreamSignalBufferBytes + 4096, true), 0, 1);
  EXPECT_TRUE(large.status().IsInvalidArgument());
  EXPECT_THAT(large.status().message(), HasSubstr("at most 1048576 (the sidecar pins it)"));
  EXPECT_TRUE(MakeStreamSignal(Segment(kMaxStreamSignalBufferBytes, true), 0, 1).ok());

  auto segment = Segment(4096, true);
  StatusOr<StreamSignal> misaligned = MakeStreamSignal(segment, 6, 1);
  EXPECT_TRUE(misaligned.status().IsInvalidArgument());
  EXPECT_THAT(misaligned.status().message(), HasSubstr("offset 6 is not a multiple of 4"));
  for (uint64_t offset : {uint64_t{4096}, uint64_t{4100}, ~uint64_t{3}}) {
    StatusOr<StreamSignal> outside = MakeStreamSignal(segment, offset, 1);
    EXPECT_TRUE(outside.status().IsInvalidArgument()) << offset;
    EXPECT_THAT(outside.status().message(), HasSubstr("outside the buffer's 4096 bytes"));
  }
}

TEST(StreamSignalTest, TheSegmentsAttachmentIsMadeOnceRetriedAfterAFailureAndGoesWithIt) {
  auto segment = Segment(8192, true);
  int made = 0;
  auto fail = [&](std::byte*, size_t) -> StatusOr<ShmSegment::Attachment> {
    ++made;
    return Status::Internal("cudaHostRegister: no device");
  };
  EXPECT_EQ(segment->Attach(fail).status().message(), "cudaHostRegister: no device");
  auto dropped = std::make_shared<std::atomic<bool>>(false);
  auto make = [&](std::byte* data, size_t size) -> StatusOr<ShmSegment::Attachment> {
    ++made;
    EXPECT_EQ(data, segment->data());
    EXPECT_EQ(size, 8192u);
    return ShmSegment::Attachment(new int(7), [dropped](int* p) {
      dropped->store(true);
      delete p;
    });
  };
  StatusOr<ShmSegment::Attachment> first = segment->Attach(make);
  StatusOr<ShmSegment::Attachment> second = segment->Attach(make);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ(first->get(), second->get());
  EXPECT_EQ(made, 2) << "one failure, then one registration";
  first = Status::Internal("released");
  second = Status::Internal("released");
  EXPECT_FALSE(dropped->load()) << "the segment holds it";
  segment.reset();
  EXPECT_TRUE(dropped->load());
}

}  // namespace
}  // namespace collectived
