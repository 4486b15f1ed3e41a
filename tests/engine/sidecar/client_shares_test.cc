// Shares per client: the sessions of one client process draw on one share of every resource, so
// opening more sessions buys a process nothing, and another process keeps its whole share.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "engine/sidecar/sidecar.h"
#include "engine/store/memory_store.h"
#include "tests/engine/sidecar/client_memory.h"

namespace collectived {
namespace {

using ::testing::HasSubstr;

const std::string kConnection = "test-connection";

class ClientSharesTest : public ::testing::Test {
 protected:
  ClientSharesTest() {
    SidecarOptions options;
    options.groups.sidecar_id = "test-sidecar";
    options.groups.advertise_host = "127.0.0.1";
    options.local_store = std::make_shared<MemoryStore>();
    options.resolve_store = [](const std::string& address) -> StatusOr<std::shared_ptr<Store>> {
      return Status::Unavailable("no sidecar at " + address);
    };
    options.ceilings = ResourceCeilings::Defaults(MachineLimits::OfThisProcess());
    options.ceilings[Resource::kBuffers] = {2, 3};
    options.ceilings[Resource::kSessions] = {3, 5};
    options.on_resource_refused = [this](Resource r) { refused_.push_back(r); };
    sidecar_ = std::make_unique<Sidecar>(std::move(options));
  }

  std::shared_ptr<Session> Open(const std::string& client) {
    StatusOr<std::shared_ptr<Session>> session =
        sidecar_->OpenSession("trainer", 42, kConnection, PeerCredentials{}, client);
    EXPECT_TRUE(session.ok()) << session.status().ToString();
    return session.ok() ? *session : nullptr;
  }

  Status Register(const std::shared_ptr<Session>& session) {
    return sidecar_->RegisterBuffer({session->id(), kConnection}, NewMemfd(4096), 4096).status();
  }

  std::vector<Resource> refused_;
  std::unique_ptr<Sidecar> sidecar_;
};

TEST_F(ClientSharesTest, TheSessionsOfOneProcessDrawOnOneShare) {
  std::shared_ptr<Session> a = Open("pid 7 uid 1000");
  std::shared_ptr<Session> b = Open("pid 7 uid 1000");
  EXPECT_EQ(a->resources(), b->resources());
  ASSERT_TRUE(Register(a).ok());
  ASSERT_TRUE(Register(b).ok());
  // A third buffer is past the process's share, whichever of its sessions asks, and a fresh
  // session of the same process has no share of its own to spend.
  std::shared_ptr<Session> c = Open("pid 7 uid 1000");
  for (const auto& session : {a, b, c}) {
    Status refused = Register(session);
    ASSERT_EQ(refused.kind(), ErrorKind::kResourceExhausted) << refused.ToString();
    EXPECT_THAT(refused.message(),
                HasSubstr("buffers: client pid 7 uid 1000 holds 2, its share is 2 "
                          "(--client-max-buffers raises it)"));
  }
  EXPECT_EQ(refused_, std::vector<Resource>(3, Resource::kBuffers));
}

TEST_F(ClientSharesTest, AnotherProcessIsServedWhileOneHoldsItsWholeShare) {
  std::shared_ptr<Session> a = Open("pid 7 uid 1000");
  std::shared_ptr<Session> b = Open("pid 7 uid 1000");
  ASSERT_TRUE(Register(a).ok());
  ASSERT_TRUE(Register(b).ok());
  std::shared_ptr<Session> other = Open("pid 8 uid 1000");
  EXPECT_NE(other->resources(), a->resources());
  EXPECT_TRUE(Register(other).ok());
  // The sidecar's total (3) is reached: the refusal names it, not the share.
  Status full = Register(other);
  ASSERT_EQ(full.kind(), ErrorKind::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("buffers: the sidecar holds 3 for all clients"));
  // The first process goes: its share comes back to the sidecar.
  sidecar_->CloseSession(a->id(), "test");
  sidecar_->CloseSession(b->id(), "test");
  a.reset();
  b.reset();
  EXPECT_TRUE(Register(other).ok());
}

TEST_F(ClientSharesTest, SessionsAreBoundedPerProcessAndComeBack) {
  std::vector<std::shared_ptr<Session>> held;
  for (int i = 0; i < 3; ++i) held.push_back(Open("pid 7 uid 1000"));
  StatusOr<std::shared_ptr<Session>> fourth =
      sidecar_->OpenSession("trainer", 7, kConnection, PeerCredentials{}, "pid 7 uid 1000");
  ASSERT_EQ(fourth.status().kind(), ErrorKind::kResourceExhausted);
  EXPECT_THAT(fourth.status().message(),
              HasSubstr("sessions: client pid 7 uid 1000 holds 3, its share is 3 "
                        "(--client-max-sessions raises it)"));
  // Another process still attaches, up to the total.
  std::shared_ptr<Session> other = Open("pid 8 uid 1000");
  ASSERT_NE(other, nullptr);
  sidecar_->CloseSession(held.back()->id(), "test");
  held.pop_back();
  EXPECT_NE(Open("pid 7 uid 1000"), nullptr);
}

TEST_F(ClientSharesTest, ASessionWithoutAKnownClientIsAClientOfItsOwn) {
  std::shared_ptr<Session> a = Open("");
  std::shared_ptr<Session> b = Open("");
  EXPECT_NE(a->resources(), b->resources());
  EXPECT_EQ(a->resources()->label(), "session " + a->label());
  ASSERT_TRUE(Register(a).ok());
  ASSERT_TRUE(Register(a).ok());
  EXPECT_TRUE(Register(b).ok());
}

}  // namespace
}  // namespace collectived
