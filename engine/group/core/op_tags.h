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
// kMaxDataSteps network calls per op (today every algorithm makes one).
//
// Point-to-point messages (send/recv) do not use these tags, and nothing hashes or truncates
// theirs: they are matched by exact keys, so two streams cannot collide whatever their tags.
//   - On the destination's sidecar, PointToPoint keeps a mailbox per (destination rank, user
//     tag), the whole int64 tag; in it a recv takes the first send from the rank it names (or
//     from any rank, kAnySource), so the sends of one (source, destination, tag) arrive in issue
//     order.
//   - Between sidecars a message travels on the group's socket mesh (SocketMesh, the group's
//     MessageTransport; a device backend stages through host memory around it) under the
//     P2PKey (source rank, destination rank, user tag): each frame carries the three as int32,
//     int32 and int64, and each side keeps its sends, clearances (CTS) and receives in
//     std::map<P2PKey, deque>, so bytes (DATA) move only into the receive that cleared that key.
//   - A send to another sidecar first announces itself (an envelope: source, destination, tag,
//     bytes) on the stream P2PKey{-1 - from node, -1 - to node, 0}: negative ranks, which no
//     user stream has (group ranks are >= 0). The in-process test fabric's control streams use
//     ranks -1'000'000 - node, below every envelope stream (world sizes are at most 2^17).
//   - These tags live in other frames: the control channel's are kControl frames of the mesh,
//     never matched against point-to-point (kClearToSend, kData) frames; Gloo's collectives use
//     Gloo's own connections.
// (Point-to-point once went through Gloo in a slot built from a 32-bit hash of the tag, where two
// tags could meet; that path is gone.)
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
  static constexpr uint32_t kSummary = 2;         // a large group's combined op summary
  static constexpr uint32_t kCountsKey = 3;       // the key of a large group's alltoall digests
  static constexpr uint32_t kCommit = 4;          // every sidecar finished the op's data phase

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
  // The tag of control step kSignatures, kAllToAllCounts, kSummary, kCountsKey or kCommit.
  template <uint32_t kStep>
  uint32_t Control() const {
    static_assert(kStep == kSignatures || kStep == kAllToAllCounts || kStep == kSummary ||
                      kStep == kCountsKey || kStep == kCommit,
                  "unknown control step");
    return kControlBit | base_ | kStep;
  }

 private:
  static_assert(kStepBits + kSequenceBits + 1 == 32, "a tag is one uint32 (Gloo's tag type)");
  const uint32_t base_;
};

}  // namespace collectived
