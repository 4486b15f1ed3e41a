// StreamSignal: a 32-bit word of a client's shared memory that the sidecar moves to a value once
// an op's results are in place (CollectiveRequest.stream_signal), so that the client's device
// stream can wait on the word (cuStreamWaitValue32, GEQ) instead of waiting on the CPU for a
// response that names an event. A device backend writes the word on its stream after the op's
// work; otherwise, and for an op that failed, the group stores it when the op concludes (a
// client moves the words of failed ops on itself as well, and of ops the sidecar never had).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "engine/memory/shm_segment.h"
#include "engine/vocabulary/status.h"

namespace collectived {

struct StreamSignal {
  std::shared_ptr<ShmSegment> segment;  // keeps the word mapped (and registered) while in use
  size_t offset = 0;                    // of the word in the segment: aligned, within it
  uint32_t value = 0;
  // Set by the group once a device backend enqueued the write; else the group stores the value
  // when the op concludes successfully.
  bool written_on_stream = false;

  uint32_t* word() const { return reinterpret_cast<uint32_t*>(segment->data() + offset); }
};

// A signal's segment is pinned (registered with the device) for its life: a bound on what one
// client can make the sidecar pin.
inline constexpr size_t kMaxStreamSignalBufferBytes = size_t{1} << 20;

// The signal for the word at `offset` of `segment`. InvalidArgument naming the segment for a
// segment not sealed against shrinking (the word is written with no fault guard, and by a
// device), one larger than kMaxStreamSignalBufferBytes, an offset that is not a multiple of 4,
// or one whose word is not inside the segment.
StatusOr<StreamSignal> MakeStreamSignal(std::shared_ptr<ShmSegment> segment, uint64_t offset,
                                        uint32_t value);

// Sets the word to the value: a release store, so that results written before are visible to
// whoever reads the word (the CPU's side of what a device stream's write does).
void StoreSignal(const StreamSignal& signal);

}  // namespace collectived
