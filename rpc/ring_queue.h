// RingQueue: one direction of a submission ring: length-prefixed records in a circular byte
// region of shared memory, one producer process and one consumer process.
//
// Each side keeps the index it owns (the producer's tail, the consumer's head) in private memory
// and publishes it; the other side's index is read from shared memory and checked before use,
// and so is every record header, so a peer that scribbles on the shared memory can only break
// the queue (kCorrupt), never make this side read or write outside the region.
//
// A record is an 8-byte header (u32 payload bytes, u32 kind; little-endian), the payload, and
// padding to a multiple of 8. Records never wrap: when one does not fit before the end, a
// padding record (kind 0) fills the rest and the record starts at offset 0. Indices are byte
// counts that only grow; a record starts at index % region size.
//
// Thread-safety: one thread at a time on each side (callers serialize their own side).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace collectived {

// The shared indices of one queue; lives in shared memory.
struct alignas(64) RingQueueIndices {
  uint64_t tail = 0;              // written by the producer: the end of the published records
  alignas(64) uint64_t head = 0;  // written by the consumer: the end of the consumed records
  // Set by a producer that found the queue full; the consumer clears it and wakes the producer.
  alignas(64) uint32_t producer_waiting = 0;
};

enum class RingQueueResult {
  kOk,
  kEmpty,     // Pop: no record now
  kFull,      // Push: not enough room now
  kTooLarge,  // Push: the payload exceeds the queue's record limit
  kCorrupt,   // the peer's index or a record header is impossible: the queue is broken
};

class RingQueue {
 public:
  static constexpr size_t kRecordHeaderBytes = 8;
  static constexpr uint32_t kPaddingKind = 0;
  static constexpr uint32_t kMessageKind = 1;

  // `region_bytes` must be a power of two, and `max_payload` + 8 at most half of it (so a record
  // always fits once the queue drains). The indices start at what `indices` holds.
  RingQueue(RingQueueIndices* indices, std::byte* region, size_t region_bytes, size_t max_payload);

  size_t max_payload() const { return max_payload_; }
  // Why the queue is corrupt (after kCorrupt).
  const std::string& corruption() const { return corruption_; }

  // Producer: appends a record of `size` bytes. kFull leaves the queue untouched.
  RingQueueResult Push(const void* payload, size_t size);

  // Consumer: copies the next record's payload into *payload and consumes it.
  RingQueueResult Pop(std::string* payload);
  // Consumer: whether a record (or padding) is published beyond what this side consumed.
  bool HasRecord() const;
  // Whether the shared indices say a record is published and not consumed: any thread of the
  // consumer's process may ask (it reads no private state), but it trusts the shared head, so
  // only a side that trusts its peer uses it (a client, of its sidecar).
  bool SharedIndicesShowRecord() const;
  // Consumer: true (once) when the producer said it waits for room.
  bool TakeProducerWaiting();
  // Producer: tells the consumer it waits for room.
  void SetProducerWaiting();

 private:
  RingQueueResult Corrupt(std::string why);

  RingQueueIndices* const indices_;
  std::byte* const region_;
  const size_t region_bytes_;
  const size_t max_payload_;
  uint64_t tail_;  // producer side: private copy
  uint64_t head_;  // consumer side: private copy
  std::string corruption_;
};

}  // namespace collectived
