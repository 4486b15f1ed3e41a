// ShmSegment and MappingFaultGuard: what a client's file descriptor must be, range checks, and
// a client that shrinks its memory under the sidecar (SIGBUS contained, the op failed).
#include "engine/memory/shm_segment.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <thread>

#include "engine/memory/mapping_fault_guard.h"
#include "engine/sidecar/session.h"

namespace collectived {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

int NewMemfd(size_t bytes, unsigned seals = 0) {
  const int fd = memfd_create("shm-segment-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
  if (seals != 0) {
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, seals), 0);
  }
  return fd;
}

bool IsOpen(int fd) {
  return fcntl(fd, F_GETFD) >= 0;
}

TEST(ShmSegmentTest, AdoptsASealedMemfdAndSeesTheClientsBytes) {
  const int fd = NewMemfd(8192, F_SEAL_SHRINK);
  const int client_view = dup(fd);
  auto segment = ShmSegment::Adopt(fd, 8192, "buffer 1 of session s1");
  ASSERT_TRUE(segment.ok()) << segment.status().ToString();
  EXPECT_TRUE((*segment)->sealed());
  EXPECT_EQ((*segment)->size(), 8192u);
  void* client = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, client_view, 0);
  ASSERT_NE(client, MAP_FAILED);
  const float value = 2.5f;
  std::memcpy(static_cast<char*>(client) + 64, &value, sizeof(value));
  auto view = (*segment)->View(64, 8, DType::kFloat32, 2);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  float seen;
  std::memcpy(&seen, view->data, sizeof(seen));
  EXPECT_EQ(seen, 2.5f);
  munmap(client, 8192);
  close(client_view);
}

TEST(ShmSegmentTest, RefusesDescriptorsThatAreNotReadWriteMemoryAndClosesThem) {
  int pipe_ends[2];
  ASSERT_EQ(pipe(pipe_ends), 0);
  auto pipe_segment = ShmSegment::Adopt(pipe_ends[0], 16, "buffer 1 of session s1");
  EXPECT_TRUE(pipe_segment.status().IsInvalidArgument());
  EXPECT_THAT(pipe_segment.status().message(),
              AllOf(HasSubstr("buffer 1 of session s1"), HasSubstr("not a regular file")));
  EXPECT_FALSE(IsOpen(pipe_ends[0]));
  close(pipe_ends[1]);

  const int writable = NewMemfd(4096);
  const int readonly = open(("/proc/self/fd/" + std::to_string(writable)).c_str(), O_RDONLY);
  ASSERT_GE(readonly, 0);
  close(writable);
  auto read_only = ShmSegment::Adopt(readonly, 16, "b");
  EXPECT_THAT(read_only.status().message(), HasSubstr("not open for reading and writing"));
  EXPECT_FALSE(IsOpen(readonly));

  const int empty = NewMemfd(0);
  EXPECT_THAT(ShmSegment::Adopt(empty, 0, "b").status().message(), HasSubstr("has 0 bytes"));
  EXPECT_FALSE(IsOpen(empty));

  const int small = NewMemfd(100);
  EXPECT_THAT(ShmSegment::Adopt(small, 4096, "b").status().message(),
              HasSubstr("the file has 100 bytes, fewer than the 4096 announced"));
  EXPECT_FALSE(IsOpen(small));

  EXPECT_THAT(ShmSegment::Adopt(-1, 16, "b").status().message(),
              HasSubstr("no file descriptor was passed"));

  // Sealed against writing: cannot be mapped for collectives' results.
  const int write_sealed = NewMemfd(4096, F_SEAL_WRITE);
  auto sealed = ShmSegment::Adopt(write_sealed, 16, "b");
  EXPECT_FALSE(sealed.ok());
  EXPECT_THAT(sealed.status().message(), HasSubstr("sealed against writing"));
}

TEST(ShmSegmentTest, ViewsAreBoundsCheckedAgainstTheRealSize) {
  auto segment = ShmSegment::Adopt(NewMemfd(4100, F_SEAL_SHRINK), 0, "buffer 2 of session s1");
  ASSERT_TRUE(segment.ok());
  EXPECT_TRUE((*segment)->View(4096, 4, DType::kFloat32, 1).ok());
  EXPECT_THAT((*segment)->View(4100, 4, DType::kFloat32, 1).status().message(),
              HasSubstr("is outside buffer 2 of session s1 of 4100 bytes"));
  EXPECT_THAT((*segment)->View(~size_t{0} - 3, 4, DType::kFloat32, 1).status().message(),
              HasSubstr("is outside"));
  EXPECT_THAT((*segment)->View(2, 4, DType::kFloat32, 1).status().message(),
              HasSubstr("not aligned"));
  EXPECT_THAT((*segment)->View(0, 12, DType::kFloat32, 4).status().message(),
              HasSubstr("does not match"));
}

TEST(ShmSegmentTest, AnUnsealedFileShrunkBetweenOpsIsRefusedOnUse) {
  const int fd = NewMemfd(1 << 16);
  const int client = dup(fd);
  auto segment = ShmSegment::Adopt(fd, 0, "buffer 3 of session s1");
  ASSERT_TRUE(segment.ok());
  EXPECT_FALSE((*segment)->sealed());
  ASSERT_TRUE((*segment)->View(60000, 16, DType::kUInt8, 16).ok());
  ASSERT_EQ(ftruncate(client, 4096), 0);
  auto view = (*segment)->View(60000, 16, DType::kUInt8, 16);
  EXPECT_TRUE(view.status().IsInvalidArgument());
  EXPECT_THAT(view.status().message(),
              AllOf(HasSubstr("buffer 3 of session s1"), HasSubstr("shrank to 4096 bytes")));
  EXPECT_TRUE((*segment)->View(0, 16, DType::kUInt8, 16).ok());  // still backed
  close(client);
}

TEST(ShmSegmentTest, ASigbusFromAShrinkUnderAnOpIsContainedAndFailsTheOp) {
  const int fd = NewMemfd(1 << 16);
  const int client = dup(fd);
  auto segment = ShmSegment::Adopt(fd, 0, "buffer 4 of session s1");
  ASSERT_TRUE(segment.ok());
  auto view = (*segment)->View(0, 1 << 16, DType::kUInt8, 1 << 16);
  ASSERT_TRUE(view.ok());
  std::memset(view->data, 1, 1 << 16);
  EXPECT_TRUE((*segment)->CheckIntact().ok());
  const uint64_t faults = MappingFaultGuard::FaultsHandled();

  ASSERT_EQ(ftruncate(client, 4096), 0);  // the client shrinks it while the op holds the view
  // Touching a lost page raises SIGBUS: contained, the access completes on zero pages.
  volatile std::byte* lost = view->data + 50000;
  *lost = std::byte{7};
  const std::byte read_back = *lost;
  EXPECT_EQ(read_back, std::byte{7});
  EXPECT_EQ(view->data[60000], std::byte{0});
  EXPECT_EQ(MappingFaultGuard::FaultsHandled(), faults + 1);

  Status intact = (*segment)->CheckIntact();
  EXPECT_TRUE(intact.IsInvalidArgument());
  EXPECT_THAT(intact.message(),
              AllOf(HasSubstr("buffer 4 of session s1"), HasSubstr("shrank the file under an op")));
  // Later uses are refused too.
  EXPECT_FALSE((*segment)->View(0, 16, DType::kUInt8, 16).ok());
  close(client);
}

TEST(ShmSegmentTest, ASigbusOutsideGuardedMappingsStillKillsTheProcess) {
  EXPECT_DEATH(
      {
        const int fd = NewMemfd(8192);
        auto segment = ShmSegment::Adopt(dup(fd), 0, "guarded");  // installs the handler
        void* unguarded = mmap(nullptr, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        (void)!ftruncate(fd, 0);
        static_cast<volatile char*>(unguarded)[100] = 1;
      },
      "");
}

TEST(ShmSegmentTest, ReleasedSlotsAreReused) {
  for (int i = 0; i < 3 * 16384 / 1000; ++i) {
    std::vector<std::shared_ptr<ShmSegment>> many;
    for (int j = 0; j < 1000; ++j) {
      auto segment = ShmSegment::Adopt(NewMemfd(4096), 0, "b");
      ASSERT_TRUE(segment.ok()) << segment.status().ToString();
      many.push_back(*segment);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Session look-up (each thread keeps its last id's digest: see SessionRegistry::LookupKey)

TEST(SessionLookupTest, RepeatedLookupsFindOnlyLiveSessionsOfTheirOwnRegistry) {
  auto first = std::make_unique<SessionRegistry>();
  SessionRegistry second;
  auto a = first->Open("trainer a", 1, "unix");
  auto b = second.Open("trainer b", 2, "unix");
  for (int i = 0; i < 3; ++i) {  // the same id again and again: the kept digest
    StatusOr<std::shared_ptr<Session>> found = first->Find(a->id());
    ASSERT_TRUE(found.ok()) << found.status().ToString();
    EXPECT_EQ(found->get(), a.get());
  }
  // The id just looked up in one registry names nothing in another, and the reverse.
  EXPECT_TRUE(second.Find(a->id()).status().IsNotFound());
  EXPECT_TRUE(first->Find(b->id()).status().IsNotFound());
  ASSERT_TRUE(second.Find(b->id()).ok());
  ASSERT_TRUE(first->Find(a->id()).ok());
  // A guess one character off the kept id is not it.
  std::string guess = a->id();
  guess.back() = guess.back() == '0' ? '1' : '0';
  EXPECT_TRUE(first->Find(guess).status().IsNotFound());
  EXPECT_TRUE(first->Find(a->id().substr(1)).status().IsNotFound());
  ASSERT_TRUE(first->Find(a->id()).ok());
  // A removed session is gone even though its digest is still kept.
  EXPECT_EQ(first->Remove(a->id()).get(), a.get());
  EXPECT_TRUE(first->Find(a->id()).status().IsNotFound());
  // A registry made where an old one was (same address, new key) finds nothing of the old.
  const std::string old_id = a->id();
  first.reset();
  first = std::make_unique<SessionRegistry>();
  EXPECT_TRUE(first->Find(old_id).status().IsNotFound());
  auto c = first->Open("trainer c", 3, "unix");
  ASSERT_TRUE(first->Find(c->id()).ok());
  // Another thread keeps digests of its own.
  std::thread other([&] {
    EXPECT_TRUE(first->Find(c->id()).ok());
    EXPECT_TRUE(second.Find(c->id()).status().IsNotFound());
  });
  other.join();
  EXPECT_EQ(first->Find(c->id())->get(), c.get());
}

// ---------------------------------------------------------------------------------------------
// Fd-channel tokens

TEST(ChannelTokenTest, ATokenBindsOnceAndOnlyWhileItsSessionLives) {
  SessionRegistry registry;
  auto session = registry.Open("trainer", 1, "unix");
  const std::string token = registry.IssueChannelToken(session);
  EXPECT_EQ(token.size(), 32u);
  auto redeemed = registry.RedeemChannelToken(token);
  ASSERT_TRUE(redeemed.ok());
  EXPECT_EQ(redeemed->get(), session.get());
  auto again = registry.RedeemChannelToken(token);
  EXPECT_TRUE(again.status().IsNotFound());
  EXPECT_THAT(again.status().message(), HasSubstr("unknown or used fd-channel token"));
  EXPECT_THAT(again.status().message(), ::testing::Not(HasSubstr(token)));

  EXPECT_TRUE(registry.RedeemChannelToken(std::string(32, '0')).status().IsNotFound());
  EXPECT_TRUE(registry.RedeemChannelToken("").status().IsNotFound());

  const std::string orphan = registry.IssueChannelToken(session);
  registry.Remove(session->id());
  EXPECT_TRUE(registry.RedeemChannelToken(orphan).status().IsNotFound());
}

TEST(ChannelTokenTest, AtMostAFewTokensAreOutstandingPerSession) {
  SessionRegistry registry;
  auto session = registry.Open("trainer", 1, "unix");
  std::vector<std::string> tokens;
  for (size_t i = 0; i < SessionRegistry::kMaxChannelTokens + 2; ++i) {
    tokens.push_back(registry.IssueChannelToken(session));
  }
  // The oldest were dropped; the newest still bind.
  EXPECT_FALSE(registry.RedeemChannelToken(tokens[0]).ok());
  EXPECT_FALSE(registry.RedeemChannelToken(tokens[1]).ok());
  EXPECT_TRUE(registry.RedeemChannelToken(tokens.back()).ok());
}

TEST(ChannelTokenTest, RegistrationTakesTheDescriptorAndCountsTheQuota) {
  ResourceCeilings ceilings = ResourceCeilings::Defaults(MachineLimits::OfThisProcess());
  ceilings[Resource::kBuffers].per_client = 1;
  auto ledger = ResourceLedger::Create(ceilings, nullptr);
  Session session("id", "s9", "unix", "trainer", 1);
  const int sealed = NewMemfd(4096, F_SEAL_SHRINK);
  auto first = session.RegisterBuffer(sealed, 4096, *ledger);
  ASSERT_TRUE(first.ok());
  // A sealed file cannot shrink: its mapping is all the sidecar keeps, not its descriptor.
  EXPECT_FALSE(IsOpen(sealed));
  EXPECT_EQ(ledger->InUse(Resource::kDescriptors), 0u);
  EXPECT_EQ(ledger->InUse(Resource::kMappedBytes), 4096u);
  const int fd = NewMemfd(4096);
  auto second = session.RegisterBuffer(fd, 4096, *ledger);
  EXPECT_EQ(second.status().kind(), ErrorKind::kResourceExhausted);
  EXPECT_NE(second.status().message().find("--client-max-buffers"), std::string::npos)
      << second.status().message();
  EXPECT_FALSE(IsOpen(fd));  // refused descriptors are closed, never leaked
  EXPECT_EQ(session.BufferCount(), 1u);
  EXPECT_EQ(session.RegisteredBytes(), 4096u);
  auto segment = session.Buffer(*first);
  ASSERT_TRUE(segment.ok());
  EXPECT_EQ((*segment)->what(), "buffer 1 of session s9");
  ASSERT_TRUE(session.UnregisterBuffer(*first).ok());
  EXPECT_EQ(ledger->InUse(Resource::kBuffers), 0u);
  EXPECT_EQ(ledger->InUse(Resource::kMappedBytes), 0u);
}

TEST(ChannelTokenTest, AnUnsealedBufferKeepsItsDescriptorAndCountsIt) {
  auto ledger =
      ResourceLedger::Create(ResourceCeilings::Defaults(MachineLimits::OfThisProcess()), nullptr);
  Session session("id", "s9", "unix", "trainer", 1);
  const int fd = NewMemfd(8192);
  auto id = session.RegisterBuffer(fd, 8192, *ledger);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_TRUE(IsOpen(fd));  // kept to see the file shrink
  EXPECT_EQ(ledger->InUse(Resource::kDescriptors), 1u);
  ASSERT_TRUE(session.UnregisterBuffer(*id).ok());
  EXPECT_EQ(ledger->InUse(Resource::kDescriptors), 0u);
  EXPECT_FALSE(IsOpen(fd));
}

}  // namespace
}  // namespace collectived
