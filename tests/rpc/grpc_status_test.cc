#include "rpc/grpc_status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "rpc/limits.h"

namespace collectived {
namespace {

using ::testing::EndsWith;
using ::testing::StartsWith;

TEST(GrpcStatusTest, KindsMapToCodesAndShortMessagesPassUnchanged) {
  grpc::Status status = ToGrpcStatus(Status::Timeout("Timeout: allreduce (seq 3) on group 'g'"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(status.error_message(), "Timeout: allreduce (seq 3) on group 'g'");
  EXPECT_EQ(ToGrpcStatus(Status::InvalidArgument("x")).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(ToGrpcStatus(Status::Ok()).ok());
}

// A rendezvous timeout of a huge group names every missing rank; sent whole it would exceed the
// peer's metadata limit and end the client's call (or session) instead of reporting the error.
TEST(GrpcStatusTest, LongMessagesAreCutToTheBound) {
  std::string ranks;
  for (int r = 0; r < 5000; ++r) ranks += std::to_string(r) + ", ";
  const std::string message =
      "Timeout: creating group 'g': group ranks [" + ranks + "] never joined";
  grpc::Status status = ToGrpcStatus(Status::Timeout(message));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LE(status.error_message().size(), kMaxErrorMessageBytes);
  EXPECT_THAT(status.error_message(), StartsWith("Timeout: creating group 'g': group ranks [0, 1"));
  EXPECT_THAT(status.error_message(),
              EndsWith(" ... (cut: " + std::to_string(message.size()) + " bytes in all)"));
}

TEST(GrpcStatusTest, CutsAtAUtf8CharacterBoundary) {
  std::string message(kMaxErrorMessageBytes - 40, 'a');
  for (int i = 0; i < 100; ++i) message += "\xC3\xA9";  // "é", two bytes each
  const std::string cut = BoundedMessage(message);
  EXPECT_LE(cut.size(), kMaxErrorMessageBytes);
  const size_t text_end = cut.find(" ... (cut: ");
  ASSERT_NE(text_end, std::string::npos);
  // The text before the marker ends with whole characters: a lead byte is never left alone.
  EXPECT_NE(static_cast<unsigned char>(cut[text_end - 1]), 0xC3);
  EXPECT_EQ(BoundedMessage("short"), "short");
}

}  // namespace
}  // namespace collectived
