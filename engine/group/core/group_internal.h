// What the parts of Group share (group.cc, group_agreement.cc, group_summary_agreement.cc,
// group_failures.cc, group_deadlines.cc): an op once started (StartedOp), and the records its
// agreement exchanges and how they combine. Internal to the group.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "engine/group/core/group.h"
#include "engine/group/transport/control_channel.h"
#include "engine/vocabulary/op.h"

namespace collectived {
namespace group_internal {

// A Combine of the control channel over values of type T, which its buffers hold as bytes (not
// necessarily aligned): `merge(acc, later)` folds `later` into `acc`.
template <typename T, typename Merge>
ControlChannel::Combine CombineAs(Merge merge) {
  return [merge = std::move(merge)](std::byte* acc_bytes, const std::byte* later_bytes) {
    T acc, later;
    std::memcpy(&acc, acc_bytes, sizeof(T));
    std::memcpy(&later, later_bytes, sizeof(T));
    merge(acc, later);
    std::memcpy(acc_bytes, &acc, sizeof(T));
  };
}

// Each rank's signature travels with its arrival time (for skew and straggler metrics).
struct Announcement {
  OpSignature signature;
  int64_t arrival_unix_us;
};

// What a large group's sidecars combine for an op instead of gathering every announcement: one
// fixed size whatever the number of ranks. Combined in node order (ControlChannel's allreduce).
struct AgreementSummary {
  OpSignature signature;  // the first rank's, in node order
  int32_t disagree = 0;   // some rank issued another op than `signature`
  int32_t filled = 1;     // every node packed its part of a small allreduce into `payload`
  int64_t first_arrival_unix_us = INT64_MAX;
  int64_t last_arrival_unix_us = -1;
  int32_t first_rank = -1;
  int32_t last_rank = -1;
  std::byte payload[kPiggybackPayloadBytes] = {};
};
static_assert(std::is_trivially_copyable_v<AgreementSummary>);

}  // namespace group_internal

struct Group::StartedOp {
  PendingOp op;
  RunningOp running;  // what InFlight, the flight recorder and the watchdog show
  Phase phase = Phase::kAgreeing;
  Clock::TimePoint deadline;
  std::optional<Status> outcome;  // set once it ended; it concludes once every earlier op did
  // The agreement's buffers: this node's announcements (and piggyback slot), everyone's.
  std::vector<std::byte> mine;
  std::vector<std::byte> all;
  std::vector<int64_t> rows;    // alltoall: this node's ranks' send and receive counts
  std::vector<int64_t> matrix;  // alltoall: every rank's
  // alltoall in a large group: the digests' key (this node's draw, then every node's combined),
  // the digests of what this node's ranks send and expect, then the sums of every node's (both
  // reduced in place).
  uint64_t counts_key = 0;
  std::array<uint64_t, 2> count_digests{};
  std::vector<std::byte> slots;
  CompletionEvent completion_event;  // recorded after its work (NotifyEnqueued), if any
  // Committing groups: the data phase finished here; its flow ended while the group froze (it
  // waits for RetireFrozen); what its data phase overwrote (KeepOutputs: in host memory, or on
  // the device); the commit's byte.
  bool data_finished = false;
  bool held = false;
  std::vector<std::vector<std::byte>> kept;
  std::byte* kept_on_device = nullptr;  // a device backend's KeptMemory, the outputs in order
  std::byte commit_in{1};
  std::byte commit_out{0};
  bool piggybacked = false;
  int piggybacked_payloads = 0;  // the slots' payloads to combine: one per node, or one summary
  group_internal::AgreementSummary summary;  // summary agreements: this node's, then everyone's
  group_internal::AgreementSummary combined;
};

}  // namespace collectived
