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

// Store errors quote values, which are raw bytes. A status message that is not UTF-8 is refused
// by clients (grpcio logs "Invalid encoding" and garbles it), so bytes that are not part of a
// well-formed character are escaped.
TEST(GrpcStatusTest, MessagesAreMadeValidUtf8) {
  EXPECT_EQ(ValidUtf8("plain, caf\xC3\xA9, \xE2\x82\xAC, \xF0\x9F\x98\x80"),
            "plain, caf\xC3\xA9, \xE2\x82\xAC, \xF0\x9F\x98\x80");
  EXPECT_EQ(ValidUtf8(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_EQ(ValidUtf8("value '16\xE4\x0B\x0B'"), "value '16\\xe4\x0B\x0B'");
  EXPECT_EQ(ValidUtf8("\xFF\xC0\x80"), "\\xff\\xc0\\x80");           // invalid, overlong
  EXPECT_EQ(ValidUtf8("\xED\xA0\x80"), "\\xed\\xa0\\x80");           // a surrogate
  EXPECT_EQ(ValidUtf8("\xF4\x90\x80\x80"), "\\xf4\\x90\\x80\\x80");  // above U+10FFFF
  EXPECT_EQ(ValidUtf8("cut \xE2\x82"), "cut \\xe2\\x82");            // truncated
  grpc::Status status = ToGrpcStatus(Status::InvalidArgument("bad value '\xAB\xAB'"));
  EXPECT_EQ(status.error_message(), "bad value '\\xab\\xab'");
}

TEST(GrpcStatusTest, LongInvalidMessagesAreEscapedThenCut) {
  const std::string message = "value '" + std::string(1 << 20, '\xAB') + "'";
  const std::string cut = BoundedMessage(message);
  EXPECT_LE(cut.size(), kMaxErrorMessageBytes);
  EXPECT_EQ(ValidUtf8(cut), cut);
  EXPECT_THAT(cut, StartsWith("value '\\xab\\xab"));
}

}  // namespace
}  // namespace collectived
