// The submission ring's two ends in one process: submissions host-ward and completions
// client-ward in order, several submitting threads, a full completion queue, Close waking a
// waiting client, a client that scribbles on the shared header, and descriptors that are not a
// ring. The test maps the ring itself to play the hostile client and to see who sleeps.
#include "rpc/submission_ring.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace collectived {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using Clock = std::chrono::steady_clock;
using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Long enough that a waiter that returns was woken, not timed out.
constexpr microseconds kLongTimeout = seconds(30);
// What "promptly" means for a wake-up: far under kLongTimeout, far over a loaded machine's jitter.
constexpr auto kPrompt = seconds(5);

std::string CompletionFor(int index, size_t size) {
  std::string payload(size, '\0');
  for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>((index * 31 + i) & 0xff);
  return payload;
}

class SubmissionRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string error;
    host_ = SubmissionRingHost::Create(&error);
    ASSERT_NE(host_, nullptr) << error;
    client_ = SubmissionRingClient::Attach(host_->fd(), &error);
    ASSERT_NE(client_, nullptr) << error;
    void* mapped = mmap(nullptr, SubmissionRingHeader::kTotalBytes, PROT_READ | PROT_WRITE,
                        MAP_SHARED, host_->fd(), 0);
    ASSERT_NE(mapped, MAP_FAILED);
    shared_ = static_cast<SubmissionRingHeader*>(mapped);
  }
  void TearDown() override {
    if (shared_ != nullptr) munmap(shared_, SubmissionRingHeader::kTotalBytes);
  }

  // Waits until a thread sleeps on `words`: a ring after that must wake it, so a test that
  // rings then cannot pass by a timeout or miss the wake-up.
  static bool WaitForSleeper(DoorbellWords& words) {
    const auto give_up = Clock::now() + kPrompt;
    while (std::atomic_ref<uint32_t>(words.sleepers).load() == 0) {
      if (Clock::now() > give_up) return false;
      std::this_thread::sleep_for(microseconds(100));
    }
    return true;
  }

  RingQueueResult Submit(const std::string& payload) {
    return client_->Submit(payload.data(), payload.size(), seconds(5));
  }

  std::unique_ptr<SubmissionRingHost> host_;
  std::unique_ptr<SubmissionRingClient> client_;
  SubmissionRingHeader* shared_ = nullptr;  // the test's own mapping of the ring
};

TEST_F(SubmissionRingTest, SubmissionsReachTheHostInOrder) {
  const std::vector<std::string> sent = {"first", "", std::string(1000, 's'), "last"};
  for (const std::string& payload : sent) ASSERT_EQ(Submit(payload), RingQueueResult::kOk);
  for (const std::string& expected : sent) {
    std::string received;
    ASSERT_EQ(host_->NextSubmission(&received, seconds(1)), RingWaitResult::kOk);
    EXPECT_EQ(received, expected);
  }
}

TEST_F(SubmissionRingTest, CompletionsReachTheClientInOrderThroughEveryWayToTakeThem) {
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(host_->PushCompletion(CompletionFor(i, 100 + i)), RingQueueResult::kOk);
  }
  std::string received;
  ASSERT_EQ(client_->NextCompletion(&received, seconds(1)), RingWaitResult::kOk);
  EXPECT_EQ(received, CompletionFor(0, 100));
  ASSERT_EQ(client_->TryNextCompletion(&received), RingWaitResult::kOk);
  EXPECT_EQ(received, CompletionFor(1, 101));
  ASSERT_TRUE(client_->WaitForCompletion(seconds(1)));
  ASSERT_EQ(client_->TryNextCompletion(&received), RingWaitResult::kOk);
  EXPECT_EQ(received, CompletionFor(2, 102));
  ASSERT_EQ(client_->NextCompletion(&received, seconds(1)), RingWaitResult::kOk);
  EXPECT_EQ(received, CompletionFor(3, 103));

  EXPECT_EQ(client_->TryNextCompletion(&received), RingWaitResult::kTimeout);
  EXPECT_FALSE(client_->WaitForCompletion(milliseconds(10)));
  EXPECT_EQ(client_->NextCompletion(&received, milliseconds(10)), RingWaitResult::kTimeout);
  EXPECT_FALSE(client_->closed());
}

TEST_F(SubmissionRingTest, ACompletionWakesAClientWaitingForIt) {
  std::string received;
  RingWaitResult result = RingWaitResult::kTimeout;
  const auto start = Clock::now();
  std::thread waiting([&] { result = client_->NextCompletion(&received, kLongTimeout); });
  ASSERT_TRUE(WaitForSleeper(shared_->client_bell));
  ASSERT_EQ(host_->PushCompletion("done"), RingQueueResult::kOk);
  waiting.join();
  EXPECT_EQ(result, RingWaitResult::kOk);
  EXPECT_EQ(received, "done");
  EXPECT_LT(Clock::now() - start, kPrompt);
}

TEST_F(SubmissionRingTest, ASubmissionWakesAHostWaitingForIt) {
  std::string received;
  RingWaitResult result = RingWaitResult::kTimeout;
  const auto start = Clock::now();
  std::thread waiting([&] { result = host_->NextSubmission(&received, kLongTimeout); });
  ASSERT_TRUE(WaitForSleeper(shared_->sidecar_bell));
  ASSERT_EQ(Submit("op"), RingQueueResult::kOk);
  waiting.join();
  EXPECT_EQ(result, RingWaitResult::kOk);
  EXPECT_EQ(received, "op");
  EXPECT_LT(Clock::now() - start, kPrompt);
}

TEST_F(SubmissionRingTest, SubmissionsFromSeveralThreadsAllArriveInEachThreadsOrder) {
  constexpr uint32_t kThreads = 4;
  constexpr uint32_t kPerThread = 5000;
  struct Tagged {
    uint32_t thread;
    uint32_t counter;
  };

  std::vector<uint32_t> next_counter(kThreads, 0);
  uint32_t received_total = 0;
  uint32_t out_of_order = 0;
  std::string problem;
  std::thread hosting([&] {
    const auto give_up = Clock::now() + seconds(8);
    std::string received;
    while (received_total < kThreads * kPerThread && Clock::now() < give_up) {
      const RingWaitResult result = host_->NextSubmission(&received, milliseconds(100));
      if (result == RingWaitResult::kTimeout) continue;
      if (result != RingWaitResult::kOk || received.size() != sizeof(Tagged)) {
        problem = "unexpected result or size " + std::to_string(received.size());
        return;
      }
      Tagged tagged;
      std::memcpy(&tagged, received.data(), sizeof(tagged));
      if (tagged.thread >= kThreads) {
        problem = "unknown thread " + std::to_string(tagged.thread);
        return;
      }
      if (tagged.counter != next_counter[tagged.thread]) ++out_of_order;
      next_counter[tagged.thread] = tagged.counter + 1;
      ++received_total;
    }
  });

  std::vector<std::thread> submitting;
  std::atomic<uint32_t> failed_submits{0};
  for (uint32_t thread = 0; thread < kThreads; ++thread) {
    submitting.emplace_back([&, thread] {
      for (uint32_t counter = 0; counter < kPerThread; ++counter) {
        const Tagged tagged{thread, counter};
        if (client_->Submit(&tagged, sizeof(tagged), seconds(5)) != RingQueueResult::kOk) {
          ++failed_submits;
        }
      }
    });
  }
  for (std::thread& thread : submitting) thread.join();
  hosting.join();

  EXPECT_THAT(problem, IsEmpty());
  EXPECT_EQ(failed_submits.load(), 0u);
  EXPECT_EQ(out_of_order, 0u);
  EXPECT_EQ(received_total, kThreads * kPerThread);
  for (uint32_t thread = 0; thread < kThreads; ++thread) {
    EXPECT_EQ(next_counter[thread], kPerThread) << "thread " << thread;
  }
}

TEST_F(SubmissionRingTest, AFullCompletionQueueRefusesUntilTheClientTakesOne) {
  // 100 KiB completions: ten fit in the 1 MiB queue, the eleventh does not.
  constexpr size_t kCompletionBytes = 100 << 10;
  int pushed = 0;
  RingQueueResult result;
  while ((result = host_->PushCompletion(CompletionFor(pushed, kCompletionBytes))) ==
         RingQueueResult::kOk) {
    ++pushed;
    ASSERT_LT(pushed, 100) << "the queue never filled";
  }
  ASSERT_EQ(result, RingQueueResult::kFull);
  EXPECT_EQ(pushed, 10);
  EXPECT_FALSE(host_->closed());
  // Still full when asked again: nothing was written by the refused push.
  EXPECT_EQ(host_->PushCompletion(CompletionFor(pushed, kCompletionBytes)), RingQueueResult::kFull);

  // The host waits for room (the sidecar's bell); the client taking one rings it.
  RingWaitResult host_woke = RingWaitResult::kOk;
  const auto start = Clock::now();
  std::thread waiting_for_room([&] {
    std::string unused;
    host_woke = host_->NextSubmission(&unused, kLongTimeout);
  });
  ASSERT_TRUE(WaitForSleeper(shared_->sidecar_bell));
  std::string received;
  ASSERT_EQ(client_->TryNextCompletion(&received), RingWaitResult::kOk);
  EXPECT_EQ(received, CompletionFor(0, kCompletionBytes));
  waiting_for_room.join();
  EXPECT_EQ(host_woke, RingWaitResult::kTimeout);  // woken without a submission
  EXPECT_LT(Clock::now() - start, kPrompt);

  ASSERT_EQ(host_->PushCompletion(CompletionFor(pushed, kCompletionBytes)), RingQueueResult::kOk);
  ++pushed;
  for (int i = 1; i < pushed; ++i) {
    ASSERT_EQ(client_->NextCompletion(&received, seconds(1)), RingWaitResult::kOk) << i;
    EXPECT_EQ(received, CompletionFor(i, kCompletionBytes)) << i;
  }
  EXPECT_EQ(client_->TryNextCompletion(&received), RingWaitResult::kTimeout);
}

TEST_F(SubmissionRingTest, TrySubmitNeverWaits) {
  // Submitted and rung like Submit: a host asleep for submissions wakes.
  std::string received;
  RingWaitResult woke = RingWaitResult::kTimeout;
  std::thread waiting([&] { woke = host_->NextSubmission(&received, kLongTimeout); });
  ASSERT_TRUE(WaitForSleeper(shared_->sidecar_bell));
  ASSERT_EQ(client_->TrySubmit("quick", 5), RingQueueResult::kOk);
  waiting.join();
  EXPECT_EQ(woke, RingWaitResult::kOk);
  EXPECT_EQ(received, "quick");

  // A full queue refuses at once, where Submit would wait for room.
  const std::string chunk(100 << 10, 'c');
  int pushed = 0;
  while (client_->TrySubmit(chunk.data(), chunk.size()) == RingQueueResult::kOk) {
    ASSERT_LT(++pushed, 100) << "the queue never filled";
  }
  EXPECT_EQ(pushed, 10);
  int small = 0;
  while (client_->TrySubmit("x", 1) == RingQueueResult::kOk) {
    ASSERT_LT(++small, 1 << 20) << "the queue never filled";
  }
  const auto start = Clock::now();
  EXPECT_EQ(client_->TrySubmit("x", 1), RingQueueResult::kFull);
  EXPECT_LT(Clock::now() - start, milliseconds(100));

  // While a thread waits for room in Submit, TrySubmit refuses instead of queueing behind it.
  RingQueueResult waited = RingQueueResult::kFull;
  std::thread submitting([&] { waited = Submit("after room"); });
  ASSERT_TRUE(WaitForSleeper(shared_->client_bell));
  EXPECT_EQ(client_->TrySubmit("x", 1), RingQueueResult::kFull);
  ASSERT_EQ(host_->NextSubmission(&received, seconds(1)), RingWaitResult::kOk);
  submitting.join();
  EXPECT_EQ(waited, RingQueueResult::kOk);
  EXPECT_EQ(client_->TrySubmit(std::string(client_->max_record_bytes() + 1, 'x').data(),
                               client_->max_record_bytes() + 1),
            RingQueueResult::kTooLarge);
}

TEST_F(SubmissionRingTest, OversizedRecordsAreRefusedOnBothSides) {
  const std::string too_large(client_->max_record_bytes() + 1, 'x');
  EXPECT_EQ(Submit(too_large), RingQueueResult::kTooLarge);
  EXPECT_EQ(host_->PushCompletion(too_large), RingQueueResult::kTooLarge);
  EXPECT_FALSE(host_->closed());
  EXPECT_EQ(Submit(too_large.substr(1)), RingQueueResult::kOk);
  std::string received;
  ASSERT_EQ(host_->NextSubmission(&received, seconds(1)), RingWaitResult::kOk);
  EXPECT_EQ(received.size(), client_->max_record_bytes());
}

TEST_F(SubmissionRingTest, CloseWakesAClientWaitingForACompletion) {
  std::string received;
  RingWaitResult result = RingWaitResult::kOk;
  const auto start = Clock::now();
  std::thread waiting([&] { result = client_->NextCompletion(&received, kLongTimeout); });
  ASSERT_TRUE(WaitForSleeper(shared_->client_bell));
  host_->Close("the sidecar is shutting down");
  waiting.join();
  EXPECT_EQ(result, RingWaitResult::kClosed);
  EXPECT_LT(Clock::now() - start, kPrompt);
  EXPECT_TRUE(client_->closed());
  EXPECT_EQ(client_->reason(), "the sidecar is shutting down");
  EXPECT_TRUE(host_->closed());
  EXPECT_EQ(host_->reason(), "the sidecar is shutting down");
}

TEST_F(SubmissionRingTest, AClosedRingDeliversWhatItHeldThenRefusesEverything) {
  ASSERT_EQ(host_->PushCompletion("one"), RingQueueResult::kOk);
  ASSERT_EQ(host_->PushCompletion("two"), RingQueueResult::kOk);
  host_->Close("first reason");
  host_->Close("second reason");  // the first reason stays
  EXPECT_EQ(host_->reason(), "first reason");
  EXPECT_EQ(client_->reason(), "first reason");

  std::string received;
  ASSERT_EQ(client_->NextCompletion(&received, seconds(1)), RingWaitResult::kOk);
  EXPECT_EQ(received, "one");
  ASSERT_EQ(client_->TryNextCompletion(&received), RingWaitResult::kOk);
  EXPECT_EQ(received, "two");
  EXPECT_EQ(client_->NextCompletion(&received, seconds(1)), RingWaitResult::kClosed);
  EXPECT_TRUE(client_->WaitForCompletion(seconds(1)));  // closed counts as ready

  EXPECT_EQ(host_->PushCompletion("three"), RingQueueResult::kCorrupt);
  EXPECT_EQ(Submit("late"), RingQueueResult::kCorrupt);
  EXPECT_EQ(host_->NextSubmission(&received, seconds(1)), RingWaitResult::kClosed);
}

TEST_F(SubmissionRingTest, AClientThatScribblesOnTheSubmissionTailGetsTheRingClosed) {
  ASSERT_EQ(Submit("fine"), RingQueueResult::kOk);
  std::string received;
  ASSERT_EQ(host_->NextSubmission(&received, seconds(1)), RingWaitResult::kOk);

  // Far more than a queue ahead of the host's head.
  std::atomic_ref<uint64_t>(shared_->submissions.tail)
      .store(5 * SubmissionRingHeader::kQueueBytes + 8);
  const auto start = Clock::now();
  EXPECT_EQ(host_->NextSubmission(&received, kLongTimeout), RingWaitResult::kClosed);
  EXPECT_LT(Clock::now() - start, kPrompt);
  EXPECT_TRUE(host_->closed());
  EXPECT_THAT(host_->reason(), HasSubstr("the client broke the submission queue"));
  EXPECT_TRUE(client_->closed());
  EXPECT_THAT(client_->reason(), HasSubstr("the client broke the submission queue"));
  // Closed for good, even after the client puts the tail back.
  std::atomic_ref<uint64_t>(shared_->submissions.tail).store(shared_->submissions.head);
  EXPECT_EQ(host_->NextSubmission(&received, seconds(1)), RingWaitResult::kClosed);
  EXPECT_EQ(host_->PushCompletion("after"), RingQueueResult::kCorrupt);
}

TEST_F(SubmissionRingTest, AClientThatScribblesOnTheCompletionHeadGetsTheRingClosed) {
  // A head ahead of everything the host published.
  std::atomic_ref<uint64_t>(shared_->completions.head).store(4096);
  EXPECT_EQ(host_->PushCompletion("result"), RingQueueResult::kCorrupt);
  EXPECT_TRUE(host_->closed());
  EXPECT_THAT(host_->reason(), HasSubstr("the client broke the completion queue"));
  std::string received;
  EXPECT_EQ(host_->NextSubmission(&received, seconds(1)), RingWaitResult::kClosed);
}

TEST_F(SubmissionRingTest, NextSubmissionWithNothingSubmittedTimesOut) {
  std::string received;
  const auto start = Clock::now();
  EXPECT_EQ(host_->NextSubmission(&received, milliseconds(50)), RingWaitResult::kTimeout);
  EXPECT_LT(Clock::now() - start, kPrompt);
  EXPECT_FALSE(host_->closed());
}

TEST_F(SubmissionRingTest, AScribbledSubmissionHeadDoesNotMakeTheHostSpin) {
  // The head is the host's to write; a client that writes it must not make the host believe
  // in records that are not there (its wait would return at once, forever).
  std::atomic_ref<uint64_t>(shared_->submissions.head).store(12345);
  std::string received;
  const auto start = Clock::now();
  EXPECT_EQ(host_->NextSubmission(&received, milliseconds(50)), RingWaitResult::kTimeout);
  EXPECT_GE(Clock::now() - start, milliseconds(40));  // it slept: no busy loop
  EXPECT_FALSE(host_->closed());
}

TEST_F(SubmissionRingTest, WakeHostEndsAWaitForSubmissions) {
  RingWaitResult result = RingWaitResult::kOk;
  const auto start = Clock::now();
  std::thread waiting([&] {
    std::string received;
    result = host_->NextSubmission(&received, kLongTimeout);
  });
  ASSERT_TRUE(WaitForSleeper(shared_->sidecar_bell));
  host_->WakeHost();
  waiting.join();
  EXPECT_EQ(result, RingWaitResult::kTimeout);
  EXPECT_LT(Clock::now() - start, kPrompt);
}

// ---- Attach: descriptors that are not a ring ---------------------------------------------------

class AttachTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (fd_ >= 0) close(fd_);
  }
  void MakeMemfd(size_t bytes, bool seal) {
    fd_ = memfd_create("not-a-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ASSERT_GE(fd_, 0);
    ASSERT_EQ(ftruncate(fd_, static_cast<off_t>(bytes)), 0);
    if (seal) {
      ASSERT_EQ(fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    }
  }
  int fd_ = -1;
};

TEST_F(AttachTest, RefusesAMemfdOfTheWrongSize) {
  MakeMemfd(4096, /*seal=*/true);
  std::string error;
  EXPECT_EQ(SubmissionRingClient::Attach(fd_, &error), nullptr);
  EXPECT_THAT(error, HasSubstr("not a submission ring"));
}

TEST_F(AttachTest, RefusesAnUnsealedMemfd) {
  // Unsealed, the sidecar could shrink it under the client's mapping (SIGBUS).
  MakeMemfd(SubmissionRingHeader::kTotalBytes, /*seal=*/false);
  std::string error;
  EXPECT_EQ(SubmissionRingClient::Attach(fd_, &error), nullptr);
  EXPECT_THAT(error, HasSubstr("not sealed"));
}

TEST_F(AttachTest, RefusesARingWithoutTheMagic) {
  MakeMemfd(SubmissionRingHeader::kTotalBytes, /*seal=*/true);
  std::string error;
  EXPECT_EQ(SubmissionRingClient::Attach(fd_, &error), nullptr);
  EXPECT_THAT(error, HasSubstr("another format"));
}

TEST_F(AttachTest, RefusesAPipe) {
  int ends[2];
  ASSERT_EQ(pipe(ends), 0);
  std::string error;
  EXPECT_EQ(SubmissionRingClient::Attach(ends[0], &error), nullptr);
  EXPECT_THAT(error, Not(IsEmpty()));
  close(ends[0]);
  close(ends[1]);
}

}  // namespace
}  // namespace collectived
