// The collectives of c10d as the engine sees them: the op kinds, one rank's request (OpRequest),
// the per-rank validation done before an op gets a sequence number, and the signature that ranks
// compare to detect desyncs.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/vocabulary/reduce_op.h"
#include "engine/vocabulary/status.h"
#include "engine/vocabulary/stream_signal.h"
#include "engine/vocabulary/tensor.h"
#include "engine/vocabulary/timeouts.h"

namespace collectived {

enum class OpKind : int32_t {
  kAllReduce = 1,
  kAllReduceCoalesced,
  kBroadcast,
  kReduce,
  kAllGather,
  kAllGatherIntoTensor,
  kAllGatherCoalesced,
  kReduceScatter,
  kReduceScatterTensor,
  kAllToAll,
  kAllToAllSingle,
  kGather,
  kScatter,
  kBarrier,
  kSend,
  kRecv,
};
// The first and the last kind: a kind added at the end moves kLastOpKind along (and needs a row
// in kOpTraits, engine/vocabulary/op_traits.h, which a static_assert checks).
inline constexpr OpKind kFirstOpKind = OpKind::kAllReduce;
inline constexpr OpKind kLastOpKind = OpKind::kRecv;

// Shorthands for the rows of kOpTraits (engine/vocabulary/op_traits.h), which says what each kind
// is. The op's name as torch spells it ("allreduce", "alltoall_single", ...; "unknown" for a kind
// that is not one of OpKind's values).
std::string_view OpKindName(OpKind kind);
bool IsPointToPoint(OpKind kind);
bool IsReducing(OpKind kind);
bool IsRooted(OpKind kind);

// OpRequest::peer of a recv that takes the first matching send from any rank.
inline constexpr int kAnySource = -1;

// One rank's request. The tensors that each kind takes (its inputs and outputs layout) are
// listed in engine/vocabulary/op_traits.h.
struct OpRequest {
  OpKind kind = OpKind::kBarrier;
  ReduceOp reduce_op;
  int root = 0;   // group rank, rooted ops
  int peer = -1;  // group rank, send/recv; kAnySource for a recv from any rank
  int64_t tag = 0;
  std::vector<TensorView> inputs;
  std::vector<TensorView> outputs;
  std::vector<uint64_t> input_splits;   // alltoall_single; empty = equal
  std::vector<uint64_t> output_splits;  // alltoall_single; empty = equal
  std::chrono::milliseconds timeout = kUseGroupTimeout;
  // Device ops: called once, on the group's executor, when all of the op's device work is
  // enqueued on the backend's stream, with the handle of an interprocess event recorded after
  // it (see DataBackend::RecordCompletionEvent) — before the op completes, so that the trainer
  // can order its own stream after the op instead of blocking its CPU. Not called for host
  // ops, ops that failed before their work was enqueued, or when no event could be recorded
  // (the op's completion then is the only signal). Must be short and must not throw.
  std::function<void(const std::string& completion_event)> on_enqueued;
  // The word to move to a value once the op's results are in place, on success (see
  // StreamSignal): written on a device backend's stream after the op's work, else stored by the
  // group when the op concludes.
  std::optional<StreamSignal> stream_signal;
};

// Checks one rank's request against the group's shape, before any data moves: dtypes, counts,
// the number of tensors, root and peer ranks, (op, dtype) pairs, split sizes, timeouts, and that
// every tensor lives on `device`, the memory the group's backend serves. Returns
// InvalidArgument with a c10d-like message that names `group`, the op and `group_rank`.
// Rewrites equal (empty) alltoall_single splits into explicit ones.
Status ValidateRequest(OpRequest& request, std::string_view group, int group_rank, int group_size,
                       DeviceKind device);

// What every rank must agree on for one sequence number (desync detection). Fixed size so
// sidecars can exchange it with a plain allgather.
struct OpSignature {
  int64_t sequence_number = 0;
  int32_t kind = 0;
  int32_t dtype = 0;
  int32_t reduce_kind = 0;
  int32_t root = -1;
  double scale = 1.0;
  int64_t count = 0;        // the count that must match across ranks (see MakeSignature)
  int64_t num_tensors = 0;  // coalesced ops: how many tensors
  // Coalesced ops: the per-tensor counts must match too, not only their total (else elements
  // would be combined across tensors). The first kSizesShown counts, for messages, and a digest
  // of them all.
  static constexpr int kSizesShown = 8;
  int64_t sizes[kSizesShown] = {};
  uint64_t sizes_digest = 0;
  bool operator==(const OpSignature&) const = default;
};

OpSignature MakeSignature(const OpRequest& request, uint64_t sequence_number);
// "allreduce(float32, count=4, SUM)" for error messages.
std::string DescribeSignature(const OpSignature& signature);

// The op's size as nccl-tests counts it for algorithm bandwidth (algbw = bytes / time), by the
// kind's ByteCount rule (engine/vocabulary/op_traits.h) for a group of `group_size` ranks.
uint64_t AlgorithmBytes(const OpRequest& request, int group_size);

}  // namespace collectived
