// RingQueue over private memory: round trips, FIFO order, a full queue, wrap-around with padding
// records, a producer and a consumer thread at once, and the indices and record headers a hostile
// peer writes. The region sits between two inaccessible pages, so a read or write outside it
// crashes the test instead of passing unnoticed.
#include "rpc/ring_queue.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace collectived {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

constexpr size_t kRegionBytes = 4096;
constexpr size_t kMaxPayload = 1024;

// Bytes a record of `payload` bytes takes in the region: header, payload, padding to 8.
uint64_t RecordBytes(size_t payload) {
  return RingQueue::kRecordHeaderBytes + ((payload + 7) / 8) * 8;
}

// A payload whose every byte depends on its sequence number, so a record swapped, torn or
// shifted by the queue shows as a mismatch.
std::string PayloadFor(uint64_t sequence, size_t size) {
  std::string payload(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    payload[i] = static_cast<char>((sequence * 131 + i * 7 + 1) & 0xff);
  }
  return payload;
}

// The size of record `sequence`: cycles through every size from 0 to kMaxPayload, in a stride
// that is prime to the cycle so that neighbouring records differ in size.
size_t SizeFor(uint64_t sequence) {
  return static_cast<size_t>((sequence * 37) % (kMaxPayload + 1));
}

// FNV-1a, folded over the payloads in the order they passed.
uint64_t Fold(uint64_t checksum, const std::string& payload) {
  for (const char c : payload) {
    checksum ^= static_cast<unsigned char>(c);
    checksum *= 1099511628211ull;
  }
  return checksum ^ payload.size();
}
constexpr uint64_t kChecksumSeed = 14695981039346656037ull;

// Memory with an inaccessible page on either side of `bytes` (a multiple of the page size).
class GuardedRegion {
 public:
  explicit GuardedRegion(size_t bytes) : bytes_(bytes), page_(sysconf(_SC_PAGESIZE)) {
    void* mapped = mmap(nullptr, bytes_ + 2 * page_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mapped == MAP_FAILED) return;
    mapping_ = static_cast<std::byte*>(mapped);
    if (mprotect(mapping_ + page_, bytes_, PROT_READ | PROT_WRITE) != 0) {
      munmap(mapping_, bytes_ + 2 * page_);
      mapping_ = nullptr;
    }
  }
  ~GuardedRegion() {
    if (mapping_ != nullptr) munmap(mapping_, bytes_ + 2 * page_);
  }
  GuardedRegion(const GuardedRegion&) = delete;
  GuardedRegion& operator=(const GuardedRegion&) = delete;

  std::byte* data() const { return mapping_ == nullptr ? nullptr : mapping_ + page_; }

 private:
  const size_t bytes_;
  const size_t page_;
  std::byte* mapping_ = nullptr;
};

class RingQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(kRegionBytes % sysconf(_SC_PAGESIZE), 0u) << "the guard pages need whole pages";
    ASSERT_NE(region_.data(), nullptr);
  }

  // Each side owns its own RingQueue over the same indices and region, as two processes do.
  RingQueue Producer() { return RingQueue(&indices_, region_.data(), kRegionBytes, kMaxPayload); }
  RingQueue Consumer() { return RingQueue(&indices_, region_.data(), kRegionBytes, kMaxPayload); }

  // What a hostile producer writes: a record header at `offset` and its published tail.
  void WriteHeader(size_t offset, uint32_t size, uint32_t kind) {
    const uint32_t header[2] = {size, kind};
    std::memcpy(region_.data() + offset, header, sizeof(header));
  }
  void PublishTail(uint64_t tail) {
    std::atomic_ref<uint64_t>(indices_.tail).store(tail, std::memory_order_release);
  }
  void PublishHead(uint64_t head) {
    std::atomic_ref<uint64_t>(indices_.head).store(head, std::memory_order_release);
  }
  std::string RegionBytes() const {
    return std::string(reinterpret_cast<const char*>(region_.data()), kRegionBytes);
  }

  RingQueueIndices indices_;
  GuardedRegion region_{kRegionBytes};
};

TEST_F(RingQueueTest, PayloadsOfSeveralSizesRoundTrip) {
  RingQueue producer = Producer();
  RingQueue consumer = Consumer();
  for (const size_t size : {0, 1, 7, 8, 9, 63, 64, 65, 1000, 1023, 1024}) {
    SCOPED_TRACE(size);
    const std::string sent = PayloadFor(size, size);
    ASSERT_EQ(producer.Push(sent.data(), sent.size()), RingQueueResult::kOk);
    EXPECT_TRUE(consumer.HasRecord());
    std::string received = "stale";  // a zero-byte record must clear it
    ASSERT_EQ(consumer.Pop(&received), RingQueueResult::kOk);
    EXPECT_EQ(received, sent);
    EXPECT_FALSE(consumer.HasRecord());
    EXPECT_EQ(indices_.head, indices_.tail);
  }
}

TEST_F(RingQueueTest, AnEmptyQueueHasNoRecord) {
  RingQueue consumer = Consumer();
  std::string received;
  EXPECT_FALSE(consumer.HasRecord());
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kEmpty);
  EXPECT_THAT(consumer.corruption(), IsEmpty());
}

TEST_F(RingQueueTest, RecordsComeOutInTheOrderTheyWentIn) {
  RingQueue producer = Producer();
  RingQueue consumer = Consumer();
  const std::vector<std::string> sent = {"first", "", "third record", std::string(300, 'x'), "5"};
  for (const std::string& payload : sent) {
    ASSERT_EQ(producer.Push(payload.data(), payload.size()), RingQueueResult::kOk);
  }
  for (const std::string& expected : sent) {
    std::string received;
    ASSERT_EQ(consumer.Pop(&received), RingQueueResult::kOk);
    EXPECT_EQ(received, expected);
  }
  std::string received;
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kEmpty);
}

TEST_F(RingQueueTest, AFullQueueRefusesAPushAndWritesNothing) {
  RingQueue producer = Producer();
  RingQueue consumer = Consumer();
  const std::string largest = PayloadFor(1, kMaxPayload);
  // Three records of 1032 bytes fit in 4096; the fourth does not.
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(producer.Push(largest.data(), largest.size()), RingQueueResult::kOk);
  }
  const std::string region_before = RegionBytes();
  const uint64_t tail_before = indices_.tail;
  EXPECT_EQ(producer.Push(largest.data(), largest.size()), RingQueueResult::kFull);
  EXPECT_EQ(indices_.tail, tail_before);
  EXPECT_EQ(RegionBytes(), region_before);
  EXPECT_THAT(producer.corruption(), IsEmpty());

  // Room again once the consumer takes one: the new record wraps behind a padding record.
  std::string received;
  ASSERT_EQ(consumer.Pop(&received), RingQueueResult::kOk);
  const std::string wrapped = PayloadFor(2, kMaxPayload);
  ASSERT_EQ(producer.Push(wrapped.data(), wrapped.size()), RingQueueResult::kOk);
  for (const std::string& expected : {largest, largest, wrapped}) {
    ASSERT_EQ(consumer.Pop(&received), RingQueueResult::kOk);
    EXPECT_EQ(received, expected);
  }
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kEmpty);
}

TEST_F(RingQueueTest, APayloadOverTheLimitIsRefusedAndWritesNothing) {
  RingQueue producer = Producer();
  const std::string too_large(kMaxPayload + 1, 'x');
  const std::string region_before = RegionBytes();
  EXPECT_EQ(producer.Push(too_large.data(), too_large.size()), RingQueueResult::kTooLarge);
  EXPECT_EQ(indices_.tail, 0u);
  EXPECT_EQ(RegionBytes(), region_before);
  EXPECT_THAT(producer.corruption(), IsEmpty());
  // Not sticky: the queue still takes a record at the limit.
  EXPECT_EQ(producer.Push(too_large.data(), kMaxPayload), RingQueueResult::kOk);
}

TEST_F(RingQueueTest, WrapsAroundManyTimesWithEveryPayloadIntact) {
  RingQueue producer = Producer();
  RingQueue consumer = Consumer();
  constexpr uint64_t kRecords = 10000;
  uint64_t pushed = 0;
  uint64_t popped = 0;
  uint64_t paddings_crossed = 0;
  int round = 0;
  while (popped < kRecords) {
    // Fill until full, then drain a varying number, so the queue wraps at every occupancy.
    while (pushed < kRecords) {
      const std::string payload = PayloadFor(pushed, SizeFor(pushed));
      const RingQueueResult result = producer.Push(payload.data(), payload.size());
      if (result == RingQueueResult::kFull) break;
      ASSERT_EQ(result, RingQueueResult::kOk) << "record " << pushed;
      ++pushed;
    }
    const int to_pop = 1 + round++ % 4;
    for (int i = 0; i < to_pop && popped < pushed; ++i) {
      const uint64_t head_before = indices_.head;
      std::string received;
      ASSERT_EQ(consumer.Pop(&received), RingQueueResult::kOk) << "record " << popped;
      ASSERT_EQ(received, PayloadFor(popped, SizeFor(popped))) << "record " << popped;
      // The head moved by more than the record: it skipped a padding record first.
      if (indices_.head - head_before > RecordBytes(received.size())) ++paddings_crossed;
      ++popped;
    }
  }
  std::string received;
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kEmpty);
  EXPECT_GT(indices_.tail, 100 * kRegionBytes);
  EXPECT_GT(paddings_crossed, 100u);
  EXPECT_THAT(producer.corruption(), IsEmpty());
  EXPECT_THAT(consumer.corruption(), IsEmpty());
}

TEST_F(RingQueueTest, AProducerThreadAndAConsumerThreadPassRecordsConcurrently) {
  constexpr uint64_t kRecords = 100000;
  uint64_t sent_checksum = kChecksumSeed;
  std::thread producing([&] {
    RingQueue producer = Producer();
    for (uint64_t sequence = 0; sequence < kRecords; ++sequence) {
      const std::string payload = PayloadFor(sequence, SizeFor(sequence));
      RingQueueResult result;
      while ((result = producer.Push(payload.data(), payload.size())) == RingQueueResult::kFull) {
        std::this_thread::yield();
      }
      if (result != RingQueueResult::kOk) {
        ADD_FAILURE() << "push " << sequence << ": " << static_cast<int>(result);
        return;
      }
      sent_checksum = Fold(sent_checksum, payload);
    }
  });
  uint64_t received_checksum = kChecksumSeed;
  uint64_t mismatches = 0;
  {
    RingQueue consumer = Consumer();
    std::string received;
    for (uint64_t sequence = 0; sequence < kRecords; ++sequence) {
      RingQueueResult result;
      while ((result = consumer.Pop(&received)) == RingQueueResult::kEmpty) {
        std::this_thread::yield();
      }
      ASSERT_EQ(result, RingQueueResult::kOk)
          << "pop " << sequence << ": " << consumer.corruption();
      if (received != PayloadFor(sequence, SizeFor(sequence))) ++mismatches;
      received_checksum = Fold(received_checksum, received);
    }
    EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kEmpty);
  }
  producing.join();
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(received_checksum, sent_checksum);
}

TEST_F(RingQueueTest, TheProducerWaitingFlagIsTakenOnce) {
  RingQueue producer = Producer();
  RingQueue consumer = Consumer();
  EXPECT_FALSE(consumer.TakeProducerWaiting());
  producer.SetProducerWaiting();
  EXPECT_TRUE(consumer.TakeProducerWaiting());
  EXPECT_FALSE(consumer.TakeProducerWaiting());
}

// ---- A hostile producer: the consumer's checks -------------------------------------------------

// Pops once more after the peer repaired the queue: kCorrupt stays, and so does the first reason.
void ExpectStaysCorrupt(RingQueue& queue) {
  const std::string first_reason = queue.corruption();
  std::string received;
  EXPECT_EQ(queue.Pop(&received), RingQueueResult::kCorrupt);
  EXPECT_EQ(queue.Push("x", 1), RingQueueResult::kCorrupt);
  EXPECT_EQ(queue.corruption(), first_reason);
}

TEST_F(RingQueueTest, ConsumerRefusesATailBehindItsHead) {
  RingQueue producer = Producer();
  RingQueue consumer = Consumer();
  std::string received;
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(producer.Push("abcd", 4), RingQueueResult::kOk);
    ASSERT_EQ(consumer.Pop(&received), RingQueueResult::kOk);
  }
  PublishTail(8);  // head is at 64
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kCorrupt);
  EXPECT_THAT(consumer.corruption(), HasSubstr("producer's index 8"));
  // A valid record published afterwards does not revive the queue.
  PublishTail(64);
  ASSERT_EQ(producer.Push("abcd", 4), RingQueueResult::kOk);
  ExpectStaysCorrupt(consumer);
}

TEST_F(RingQueueTest, ConsumerRefusesATailMoreThanTheRegionAhead) {
  RingQueue consumer = Consumer();
  WriteHeader(0, 0, RingQueue::kMessageKind);
  PublishTail(kRegionBytes + 8);
  std::string received;
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kCorrupt);
  EXPECT_THAT(consumer.corruption(), HasSubstr("producer's index"));
  EXPECT_EQ(indices_.head, 0u);  // nothing consumed
  PublishTail(8);
  ExpectStaysCorrupt(consumer);
}

TEST_F(RingQueueTest, ConsumerRefusesATailThatIsOnlyPartOfAHeader) {
  RingQueue consumer = Consumer();
  PublishTail(4);
  std::string received;
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kCorrupt);
  EXPECT_THAT(consumer.corruption(), HasSubstr("less than a record header"));
  ExpectStaysCorrupt(consumer);
}

TEST_F(RingQueueTest, ConsumerRefusesAnUnknownRecordKind) {
  RingQueue consumer = Consumer();
  WriteHeader(0, 4, 7);
  PublishTail(16);
  std::string received;
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kCorrupt);
  EXPECT_THAT(consumer.corruption(), HasSubstr("unknown kind 7"));
  WriteHeader(0, 4, RingQueue::kMessageKind);
  ExpectStaysCorrupt(consumer);
}

TEST_F(RingQueueTest, ConsumerRefusesASizeOverTheLimit) {
  RingQueue consumer = Consumer();
  // Published bytes cover the record, so only the limit stands in the way.
  WriteHeader(0, kMaxPayload + 1, RingQueue::kMessageKind);
  PublishTail(kRegionBytes);
  std::string received;
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kCorrupt);
  EXPECT_THAT(consumer.corruption(), HasSubstr("over the limit"));
  ExpectStaysCorrupt(consumer);
}

TEST_F(RingQueueTest, ConsumerRefusesARecordThatRunsPastThePublishedTail) {
  RingQueue consumer = Consumer();
  WriteHeader(0, 100, RingQueue::kMessageKind);
  PublishTail(8);  // the header only
  std::string received = "untouched";
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kCorrupt);
  EXPECT_THAT(consumer.corruption(), HasSubstr("runs past the published records"));
  EXPECT_EQ(received, "untouched");
  ExpectStaysCorrupt(consumer);
}

TEST_F(RingQueueTest, ConsumerRefusesARecordThatRunsPastTheEndOfTheRegion) {
  // Start both indices 16 bytes before the end of the region: a record there must be padding or
  // at most 8 bytes of payload. The guard page after the region catches a read past it.
  indices_.tail = indices_.head = kRegionBytes - 16;
  RingQueue consumer = Consumer();
  WriteHeader(kRegionBytes - 16, 64, RingQueue::kMessageKind);
  PublishTail(kRegionBytes - 16 + 512);
  std::string received;
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kCorrupt);
  EXPECT_THAT(consumer.corruption(), HasSubstr("runs past the published records"));
  ExpectStaysCorrupt(consumer);
}

TEST_F(RingQueueTest, ConsumerRefusesAPaddingRecordThatRunsPastThePublishedTail) {
  RingQueue consumer = Consumer();
  // Padding at offset 0 would skip the whole region, but only 8 bytes are published.
  WriteHeader(0, 0, RingQueue::kPaddingKind);
  PublishTail(8);
  std::string received;
  EXPECT_EQ(consumer.Pop(&received), RingQueueResult::kCorrupt);
  EXPECT_THAT(consumer.corruption(), HasSubstr("padding record"));
  EXPECT_EQ(indices_.head, 0u);  // nothing skipped
  ExpectStaysCorrupt(consumer);
}

// ---- A hostile consumer: the producer's checks -------------------------------------------------

TEST_F(RingQueueTest, ProducerRefusesAHeadAheadOfItsTail) {
  RingQueue producer = Producer();
  ASSERT_EQ(producer.Push("abcd", 4), RingQueueResult::kOk);
  const std::string region_before = RegionBytes();
  PublishHead(indices_.tail + 8);
  EXPECT_EQ(producer.Push("efgh", 4), RingQueueResult::kCorrupt);
  EXPECT_THAT(producer.corruption(), HasSubstr("consumer's index"));
  EXPECT_EQ(indices_.tail, 16u);
  EXPECT_EQ(RegionBytes(), region_before);
  PublishHead(0);
  ExpectStaysCorrupt(producer);
}

TEST_F(RingQueueTest, ProducerRefusesAHeadMoreThanTheRegionBehind) {
  // Start far from zero so that a head a region and more behind is representable.
  indices_.tail = indices_.head = 3 * kRegionBytes;
  RingQueue producer = Producer();
  // Exactly a region behind is a full queue, not a broken one.
  PublishHead(2 * kRegionBytes);
  EXPECT_EQ(producer.Push("abcd", 4), RingQueueResult::kFull);
  EXPECT_THAT(producer.corruption(), IsEmpty());
  PublishHead(2 * kRegionBytes - 8);
  EXPECT_EQ(producer.Push("abcd", 4), RingQueueResult::kCorrupt);
  EXPECT_THAT(producer.corruption(), Not(IsEmpty()));
  EXPECT_EQ(indices_.tail, 3 * kRegionBytes);
  PublishHead(3 * kRegionBytes);
  ExpectStaysCorrupt(producer);
}

}  // namespace
}  // namespace collectived
