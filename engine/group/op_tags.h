// OpTags: the tags that keep one op's node-level messages apart from every other op's.
//
// Ops of a group run one at a time on every sidecar, in sequence-number order, but a fast
// sidecar may already send for op k+1 while a slow one still receives for op k. Every message of
// an op therefore carries a tag made of the op's sequence number, the channel and a step:
//
//   bit  31      channel: 0 = data (the algorithm's transfers), 1 = control (agreement)
//   bits 8..30   sequence number modulo 2^23 (ops k and k + 2^23 never overlap)
//   bits 0..7    step: the index of the network call within the op on that channel
//
// Control steps are fixed (kSignatures, kAllToAllCounts); an algorithm makes at most
// kMaxDataSteps network calls per op (today every algorithm makes one). Point-to-point messages
// do not use these tags: they are matched by (source rank, destination rank, user tag) in slots
// of their own (see DataBackend::P2PKey).
#pragma once

#include <cstdint>

namespace collectived {

class OpTags {
 public:
  static constexpr uint32_t kStepBits = 8;
  static constexpr uint32_t kSequenceBits = 23;
  static constexpr uint32_t kMaxDataSteps = 1u << kStepBits;
  static constexpr uint32_t kControlBit = 1u << 31;

  // Control steps.
  static constexpr uint32_t kSignatures = 0;      // each rank's op signature and arrival time
  static constexpr uint32_t kAllToAllCounts = 1;  // per-pair block sizes of alltoall ops

  // Whether `tag` is on the control half of the tag space.
  static constexpr bool IsControl(uint32_t tag) { return (tag & kControlBit) != 0; }

  explicit OpTags(uint64_t sequence_number)
      : base_(static_cast<uint32_t>(sequence_number & ((1u << kSequenceBits) - 1)) << kStepBits) {}

  // The tag of the algorithm's network call number kStep (checked at compile time).
  template <uint32_t kStep>
  uint32_t Data() const {
    static_assert(kStep < kMaxDataSteps, "an op makes at most kMaxDataSteps network calls");
    return base_ | kStep;
  }
  // The tag of network call `step` of an algorithm that makes a varying number of calls (a
  // pipelined allreduce, one per chunk). REQUIRES: step < kMaxDataSteps.
  uint32_t DataStep(uint32_t step) const { return base_ | (step & (kMaxDataSteps - 1)); }
  // The tag of control step kSignatures or kAllToAllCounts.
  template <uint32_t kStep>
  uint32_t Control() const {
    static_assert(kStep == kSignatures || kStep == kAllToAllCounts, "unknown control step");
    return kControlBit | base_ | kStep;
  }

 private:
  static_assert(kStepBits + kSequenceBits + 1 == 32, "a tag is one uint32 (Gloo's tag type)");
  const uint32_t base_;
};

}  // namespace collectived
