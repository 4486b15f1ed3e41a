#include "engine/group/rendezvous/signed_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/group/rendezvous/job_token.h"
#include "engine/store/memory_store.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

class SignedStoreTest : public ::testing::Test {
 protected:
  std::shared_ptr<MemoryStore> inner_ = std::make_shared<MemoryStore>();
  SignedStore member_{inner_, JobRecordKey("job-token", "collectived/groups/g")};
};

TEST_F(SignedStoreTest, MembersReadWhatMembersWrite) {
  ASSERT_TRUE(member_.Set("a", "announcement").ok());
  EXPECT_EQ(member_.Get("a", milliseconds(100)).value(), "announcement");
  ASSERT_TRUE(member_.MultiSet({"b", "c"}, {"", "x"}).ok());
  EXPECT_EQ(member_.MultiGet({"a", "b", "c"}, milliseconds(100)).value(),
            (std::vector<std::string>{"announcement", "", "x"}));
  // Another member sidecar (same token and scope) reads them too.
  SignedStore other_member(inner_, JobRecordKey("job-token", "collectived/groups/g"));
  EXPECT_EQ(other_member.Get("a", milliseconds(100)).value(), "announcement");
  // The inner store holds the value and its MAC.
  std::string raw = inner_->Get("a", milliseconds(100)).value();
  EXPECT_EQ(raw.size(), std::string("announcement").size() + 32);
  EXPECT_EQ(raw.rfind("announcement", 0), 0u);
}

TEST_F(SignedStoreTest, ForgedRecordsAreRefusedNamingTheKey) {
  // Written by something without the token: a client, or another job's sidecar.
  ASSERT_TRUE(inner_->Set("failed", "cd3 forged").ok());
  Status forged = member_.Get("failed", milliseconds(100)).status();
  EXPECT_EQ(forged.kind(), ErrorKind::kPermissionDenied) << forged.ToString();
  EXPECT_THAT(forged.message(), HasSubstr("'failed'"));
  EXPECT_THAT(forged.message(), HasSubstr("does not authenticate"));
  ASSERT_TRUE(inner_->Set("short", "").ok());  // shorter than a MAC
  EXPECT_EQ(member_.Get("short", milliseconds(100)).status().kind(), ErrorKind::kPermissionDenied);

  // Signed under another token, or for another group: refused.
  SignedStore outsider(inner_, JobRecordKey("other-token", "collectived/groups/g"));
  SignedStore other_group(inner_, JobRecordKey("job-token", "collectived/groups/h"));
  ASSERT_TRUE(outsider.Set("rank/1", "me").ok());
  ASSERT_TRUE(other_group.Set("rank/2", "me").ok());
  EXPECT_EQ(member_.Get("rank/1", milliseconds(100)).status().kind(), ErrorKind::kPermissionDenied);
  EXPECT_EQ(member_.Get("rank/2", milliseconds(100)).status().kind(), ErrorKind::kPermissionDenied);

  // A genuine record copied to another key: refused (the MAC covers the key).
  ASSERT_TRUE(member_.Set("rank/0", "sidecar-a").ok());
  ASSERT_TRUE(inner_->Set("rank/3", inner_->Get("rank/0", milliseconds(100)).value()).ok());
  EXPECT_EQ(member_.Get("rank/3", milliseconds(100)).status().kind(), ErrorKind::kPermissionDenied);
  // One forged key fails a MultiGet as a whole.
  EXPECT_EQ(member_.MultiGet({"rank/0", "rank/3"}, milliseconds(100)).status().kind(),
            ErrorKind::kPermissionDenied);
}

TEST_F(SignedStoreTest, CountersWaitsAndDeletionPassThrough) {
  EXPECT_EQ(member_.Add("left", 1).value(), 1);
  EXPECT_EQ(inner_->Add("left", 1).value(), 2);
  ASSERT_TRUE(member_.Set("k", "v").ok());
  EXPECT_TRUE(member_.Wait({"k"}, milliseconds(100)).ok());
  EXPECT_TRUE(member_.Check({"k"}).value());
  EXPECT_EQ(member_.DeletePrefix("k").value(), 1);
  EXPECT_EQ(member_.NumKeys().value(), 1);
}

}  // namespace
}  // namespace collectived
