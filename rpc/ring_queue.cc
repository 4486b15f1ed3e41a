#include "rpc/ring_queue.h"

#include <atomic>
#include <cstring>

namespace collectived {
namespace {

uint64_t PaddedRecordBytes(size_t payload) {
  return RingQueue::kRecordHeaderBytes + ((payload + 7) & ~uint64_t{7});
}

}  // namespace

RingQueue::RingQueue(RingQueueIndices* indices, std::byte* region, size_t region_bytes,
                     size_t max_payload)
    : indices_(indices),
      region_(region),
      region_bytes_(region_bytes),
      max_payload_(max_payload),
      tail_(std::atomic_ref<uint64_t>(indices->tail).load(std::memory_order_acquire)),
      head_(std::atomic_ref<uint64_t>(indices->head).load(std::memory_order_acquire)) {
  if (tail_ % 8 != 0 || head_ % 8 != 0) {
    corruption_ = "the queue's indices are not multiples of 8";
  }
}

RingQueueResult RingQueue::Corrupt(std::string why) {
  if (corruption_.empty()) corruption_ = std::move(why);
  return RingQueueResult::kCorrupt;
}

RingQueueResult RingQueue::Push(const void* payload, size_t size) {
  if (!corruption_.empty()) return RingQueueResult::kCorrupt;
  if (size > max_payload_) return RingQueueResult::kTooLarge;
  const uint64_t head = std::atomic_ref<uint64_t>(indices_->head).load(std::memory_order_seq_cst);
  if (head > tail_ || tail_ - head > region_bytes_) {
    return Corrupt("the consumer's index " + std::to_string(head) +
                   " is not within the published records [" +
                   std::to_string(tail_ > region_bytes_ ? tail_ - region_bytes_ : 0) + ", " +
                   std::to_string(tail_) + "]");
  }
  const uint64_t record = PaddedRecordBytes(size);
  const uint64_t offset = tail_ % region_bytes_;
  const uint64_t before_end = region_bytes_ - offset;
  const uint64_t needed = record <= before_end ? record : before_end + record;
  if (region_bytes_ - (tail_ - head) < needed) return RingQueueResult::kFull;
  uint64_t tail = tail_;
  if (record > before_end) {
    const uint32_t padding[2] = {static_cast<uint32_t>(before_end - kRecordHeaderBytes),
                                 kPaddingKind};
    std::memcpy(region_ + offset, padding, sizeof(padding));
    tail += before_end;
  }
  std::byte* at = region_ + tail % region_bytes_;
  const uint32_t header[2] = {static_cast<uint32_t>(size), kMessageKind};
  std::memcpy(at, header, sizeof(header));
  if (size != 0) std::memcpy(at + kRecordHeaderBytes, payload, size);
  tail_ = tail + record;
  std::atomic_ref<uint64_t>(indices_->tail).store(tail_, std::memory_order_release);
  return RingQueueResult::kOk;
}

bool RingQueue::HasRecord() const {
  // Against the private head: a peer that scribbles on the shared one cannot make this side
  // believe in records forever (and spin).
  return std::atomic_ref<uint64_t>(indices_->tail).load(std::memory_order_acquire) != head_;
}

bool RingQueue::SharedIndicesShowRecord() const {
  return std::atomic_ref<uint64_t>(indices_->tail).load(std::memory_order_acquire) !=
         std::atomic_ref<uint64_t>(indices_->head).load(std::memory_order_acquire);
}

RingQueueResult RingQueue::Pop(std::string* payload) {
  if (!corruption_.empty()) return RingQueueResult::kCorrupt;
  for (;;) {
    const uint64_t tail = std::atomic_ref<uint64_t>(indices_->tail).load(std::memory_order_acquire);
    if (tail == head_) return RingQueueResult::kEmpty;
    if (tail < head_ || tail - head_ > region_bytes_) {
      return Corrupt("the producer's index " + std::to_string(tail) + " is not within the queue [" +
                     std::to_string(head_) + ", " + std::to_string(head_ + region_bytes_) + "]");
    }
    const uint64_t available = tail - head_;
    const uint64_t offset = head_ % region_bytes_;
    if (available < kRecordHeaderBytes) {
      return Corrupt("the producer published " + std::to_string(available) +
                     " bytes, less than a record header");
    }
    // Copied once: the peer may rewrite the shared bytes while they are checked.
    uint32_t header[2];
    std::memcpy(header, region_ + offset, sizeof(header));
    const uint32_t size = header[0];
    const uint32_t kind = header[1];
    if (kind == kPaddingKind) {
      const uint64_t skip = region_bytes_ - offset;
      if (skip > available) {
        return Corrupt("a padding record at offset " + std::to_string(offset) +
                       " runs past the published records");
      }
      head_ += skip;
      std::atomic_ref<uint64_t>(indices_->head).store(head_, std::memory_order_seq_cst);
      continue;
    }
    if (kind != kMessageKind) {
      return Corrupt("a record at offset " + std::to_string(offset) + " has unknown kind " +
                     std::to_string(kind));
    }
    if (size > max_payload_) {
      return Corrupt("a record at offset " + std::to_string(offset) + " announces " +
                     std::to_string(size) + " bytes, over the limit of " +
                     std::to_string(max_payload_));
    }
    const uint64_t record = PaddedRecordBytes(size);
    if (record > available || offset + record > region_bytes_) {
      return Corrupt("a record of " + std::to_string(size) + " bytes at offset " +
                     std::to_string(offset) + " runs past the published records");
    }
    payload->assign(reinterpret_cast<const char*>(region_ + offset + kRecordHeaderBytes), size);
    head_ += record;
    std::atomic_ref<uint64_t>(indices_->head).store(head_, std::memory_order_seq_cst);
    return RingQueueResult::kOk;
  }
}

bool RingQueue::TakeProducerWaiting() {
  // Sequentially consistent, like the head's store in Pop and the producer's flag store and head
  // load: the producer sets the flag and then reads the head, this side stores the head and
  // then reads the flag, so one of the two sees the other (no wake-up is lost).
  return std::atomic_ref<uint32_t>(indices_->producer_waiting)
             .exchange(0, std::memory_order_seq_cst) != 0;
}

void RingQueue::SetProducerWaiting() {
  std::atomic_ref<uint32_t>(indices_->producer_waiting).store(1, std::memory_order_seq_cst);
}

}  // namespace collectived
