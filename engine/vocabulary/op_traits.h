// What each op kind is, in one table: its name as torch spells it, whether it works in place,
// has a root, is point-to-point or reduces, the layout of its input and output tensors, how
// nccl-tests counts its size and its bus bandwidth, and which algorithm family runs it. Every
// part of collectived that needs one of these facts reads it here instead of restating it.
//
// Tensor layout per kind (n = group size), as OpRequest and the client's CollectiveArgs carry
// them; the row of each kind says the same with TensorLayout values:
//   allreduce, broadcast, reduce:  inputs = {t}, in place (reduce: result on root only)
//   allreduce_coalesced:           inputs = {t0, t1, ...}, in place
//   allgather:                     inputs = {in}, outputs = n tensors
//   allgather_into_tensor:         inputs = {in}, outputs = {out of n * in.count}
//   allgather_coalesced:           inputs = {in_i}, outputs[i * n + r] = rank r's in_i
//   reduce_scatter:                inputs = n tensors, outputs = {out}
//   reduce_scatter_tensor:         inputs = {in of n * out.count}, outputs = {out}
//   alltoall:                      inputs = n tensors, outputs = n tensors
//   alltoall_single:               inputs = {in}, outputs = {out}, splits in elements
//   gather:                        inputs = {in}, outputs = n tensors on root, none elsewhere
//   scatter:                       inputs = n tensors on root, none elsewhere, outputs = {out}
//   barrier:                       nothing
//   send:                          inputs = {t}, peer = destination
//   recv:                          outputs = {t}, peer = source (not "any rank": unsupported)
//
// Thread-safety: everything here is constant.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engine/vocabulary/op.h"

namespace collectived {

// The tensors on one side (inputs or outputs) of an op's request.
enum class TensorLayout : uint8_t {
  kNone,                // no tensors
  kOne,                 // exactly one tensor
  kOnePerRank,          // n tensors, one per group rank, all of the other side's count
  kOnePerRankOnRoot,    // n tensors (as kOnePerRank) on the root, none on other ranks
  kOneOfGroupSize,      // one tensor of n times the other side's count
  kOneSplit,            // one tensor cut into n blocks by the request's splits (in elements)
  kList,                // one or more tensors of any counts
  kListTimesGroupSize,  // n tensors per input tensor: [i * n + r] = rank r's input i
};

// How the op's size is counted for algorithm bandwidth (algbw = bytes / time), as nccl-tests
// counts it: the bytes of this rank's inputs or outputs, times the group size for the ops whose
// size is that of the whole gathered (or scattered) buffer.
enum class ByteCount : uint8_t {
  kInputs,                 // sum of the input tensors' bytes
  kOutputs,                // sum of the output tensors' bytes
  kInputsTimesGroupSize,   // allgather*, gather: the size of the gathered output
  kOutputsTimesGroupSize,  // reduce_scatter*, scatter: the size of the input being scattered
};

// nccl-tests' bus-bandwidth factor (busbw = algbw * factor) as a function of the group size n.
enum class BusFactor : uint8_t {
  kOne,                  // 1 (broadcast, reduce, gather, scatter, barrier, send, recv)
  kTwiceNMinusOneOverN,  // 2(n-1)/n (allreduce), 0 for n <= 1
  kNMinusOneOverN,       // (n-1)/n (allgather, reduce_scatter, alltoall), 1 for n <= 1
};

// Which count ranks must agree on for one sequence number (OpSignature::count).
enum class SignatureCount : uint8_t {
  kNone,         // nothing: alltoall counts differ per rank (checked pairwise), barrier, p2p
  kFirstInput,   // inputs[0].count
  kFirstOutput,  // outputs[0].count
  kSumOfInputs,  // the sum of the inputs' counts, and the number of inputs (coalesced ops)
};

// The algorithm family that runs the op (the algorithms of engine/group/).
enum class OpFamily : uint8_t {
  kNone,  // unknown kinds only
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,  // alltoall, alltoall_single, gather and scatter
  kBarrier,
  kPointToPoint,
};

struct OpTraits {
  OpKind kind;
  std::string_view name;  // torch's spelling ("allreduce", "alltoall_single", ...)
  bool in_place;          // the input tensors receive the result
  bool rooted;            // OpRequest::root matters
  bool point_to_point;    // send/recv: OpRequest::peer matters, no sequence number
  bool reduces;           // OpRequest::reduce_op matters
  TensorLayout inputs;
  TensorLayout outputs;
  ByteCount bytes;
  BusFactor bus;
  SignatureCount signature_count;
  OpFamily family;
};

namespace op_traits_internal {
using L = TensorLayout;
using B = ByteCount;
using F = BusFactor;
using S = SignatureCount;
using A = OpFamily;
inline constexpr std::array<OpTraits, 16> kTable = {{
    // clang-format off
    // {kind,                      name,                    in_place, rooted, p2p, reduces,
    //   inputs,             outputs,
    //   bytes,                     bus,                     signature_count, family}
    {OpKind::kAllReduce,           "allreduce",             true,  false, false, true,
      L::kOne,             L::kNone,
      B::kInputs,                F::kTwiceNMinusOneOverN, S::kFirstInput,  A::kAllReduce},
    {OpKind::kAllReduceCoalesced,  "allreduce_coalesced",   true,  false, false, true,
      L::kList,            L::kNone,
      B::kInputs,                F::kTwiceNMinusOneOverN, S::kSumOfInputs, A::kAllReduce},
    {OpKind::kBroadcast,           "broadcast",             true,  true,  false, false,
      L::kOne,             L::kNone,
      B::kInputs,                F::kOne,                 S::kFirstInput,  A::kBroadcast},
    {OpKind::kReduce,              "reduce",                true,  true,  false, true,
      L::kOne,             L::kNone,
      B::kInputs,                F::kOne,                 S::kFirstInput,  A::kReduce},
    {OpKind::kAllGather,           "allgather",             false, false, false, false,
      L::kOne,             L::kOnePerRank,
      B::kInputsTimesGroupSize,  F::kNMinusOneOverN,      S::kFirstInput,  A::kAllGather},
    {OpKind::kAllGatherIntoTensor, "allgather_into_tensor", false, false, false, false,
      L::kOne,             L::kOneOfGroupSize,
      B::kInputsTimesGroupSize,  F::kNMinusOneOverN,      S::kFirstInput,  A::kAllGather},
    {OpKind::kAllGatherCoalesced,  "allgather_coalesced",   false, false, false, false,
      L::kList,            L::kListTimesGroupSize,
      B::kInputsTimesGroupSize,  F::kNMinusOneOverN,      S::kSumOfInputs, A::kAllGather},
    {OpKind::kReduceScatter,       "reduce_scatter",        false, false, false, true,
      L::kOnePerRank,      L::kOne,
      B::kOutputsTimesGroupSize, F::kNMinusOneOverN,      S::kFirstOutput, A::kReduceScatter},
    {OpKind::kReduceScatterTensor, "reduce_scatter_tensor", false, false, false, true,
      L::kOneOfGroupSize,  L::kOne,
      B::kOutputsTimesGroupSize, F::kNMinusOneOverN,      S::kFirstOutput, A::kReduceScatter},
    {OpKind::kAllToAll,            "alltoall",              false, false, false, false,
      L::kOnePerRank,      L::kOnePerRank,
      B::kInputs,                F::kNMinusOneOverN,      S::kNone,        A::kAllToAll},
    {OpKind::kAllToAllSingle,      "alltoall_single",       false, false, false, false,
      L::kOneSplit,        L::kOneSplit,
      B::kInputs,                F::kNMinusOneOverN,      S::kNone,        A::kAllToAll},
    {OpKind::kGather,              "gather",                false, true,  false, false,
      L::kOne,             L::kOnePerRankOnRoot,
      B::kInputsTimesGroupSize,  F::kOne,                 S::kFirstInput,  A::kAllToAll},
    {OpKind::kScatter,             "scatter",               false, true,  false, false,
      L::kOnePerRankOnRoot, L::kOne,
      B::kOutputsTimesGroupSize, F::kOne,                 S::kFirstOutput, A::kAllToAll},
    {OpKind::kBarrier,             "barrier",               false, false, false, false,
      L::kNone,            L::kNone,
      B::kInputs,                F::kOne,                 S::kNone,        A::kBarrier},
    {OpKind::kSend,                "send",                  false, false, true,  false,
      L::kOne,             L::kNone,
      B::kInputs,                F::kOne,                 S::kNone,        A::kPointToPoint},
    {OpKind::kRecv,                "recv",                  false, false, true,  false,
      L::kNone,            L::kOne,
      B::kOutputs,               F::kOne,                 S::kNone,        A::kPointToPoint},
    // clang-format on
}};

// The row of kinds that are not OpKind's values: named "unknown", no tensors, nothing set.
// clang-format off
inline constexpr OpTraits kUnknown = {OpKind{0}, "unknown", false, false, false, false,
                                      L::kNone, L::kNone, B::kInputs, F::kOne, S::kNone, A::kNone};
// clang-format on

constexpr bool CoversEveryKindInOrder() {
  const auto first = static_cast<int32_t>(kFirstOpKind);
  if (kTable.size() != static_cast<size_t>(static_cast<int32_t>(kLastOpKind) - first + 1)) {
    return false;
  }
  for (size_t i = 0; i < kTable.size(); ++i) {
    if (static_cast<int32_t>(kTable[i].kind) != first + static_cast<int32_t>(i)) return false;
  }
  return true;
}
static_assert(CoversEveryKindInOrder(), "kOpTraits must hold one row per OpKind, in enum order");
}  // namespace op_traits_internal

// One row per kind, in enum order: kOpTraits[k - kFirstOpKind] describes kind k.
inline constexpr const std::array<OpTraits, 16>& kOpTraits = op_traits_internal::kTable;
inline constexpr const OpTraits& kUnknownOpTraits = op_traits_internal::kUnknown;

// Returns true if `kind` is one of OpKind's values. Kinds that arrive from the wire (a peer's
// OpSignature, a cast integer) must be checked with it before they are trusted.
constexpr bool IsValidOpKind(OpKind kind) {
  return static_cast<int32_t>(kind) >= static_cast<int32_t>(kFirstOpKind) &&
         static_cast<int32_t>(kind) <= static_cast<int32_t>(kLastOpKind);
}

// The row of `kind`; kUnknownOpTraits for a kind that is not valid (see IsValidOpKind).
constexpr const OpTraits& TraitsOf(OpKind kind) {
  if (!IsValidOpKind(kind)) return kUnknownOpTraits;
  return kOpTraits[static_cast<size_t>(static_cast<int32_t>(kind) -
                                       static_cast<int32_t>(kFirstOpKind))];
}

// The fields of an op's message in the wire protocol (collectived.v1.CollectiveRequest,
// proto/collectived/v1/collectives.proto), named by rule from the op's row so that the sidecar
// reads and every client writes any op with the same code (rpc/op_wire.h for C++; the Python and
// Go clients' tables are generated from kOpTraits): the oneof field is the op's name; an op whose
// tensors are all on one side calls them "tensor" (one) or "tensors" (several); otherwise one
// tensor is "input" or "output" and several are "inputs" or "outputs"; a rooted op has "root", a
// reducing one "op", a send "dst" and a recv "src" (both with "tag"), and a kOneSplit side
// "input_splits" / "output_splits". tests/rpc/op_wire_test.cc holds every rule against the
// proto's descriptor.
struct OpWireFields {
  std::string_view op;      // the oneof field
  std::string_view inputs;  // "" when the op takes no inputs
  bool inputs_repeated;
  std::string_view outputs;  // "" when the op takes no outputs
  bool outputs_repeated;
  std::string_view peer;  // "dst" (send), "src" (recv), "" otherwise
};

// Whether a side of `layout` is one tensor (false: a list, or nothing).
constexpr bool IsSingleTensorLayout(TensorLayout layout) {
  return layout == TensorLayout::kOne || layout == TensorLayout::kOneOfGroupSize ||
         layout == TensorLayout::kOneSplit;
}

constexpr OpWireFields WireFieldsOf(const OpTraits& traits) {
  const bool has_inputs = traits.inputs != TensorLayout::kNone;
  const bool has_outputs = traits.outputs != TensorLayout::kNone;
  const bool one_side = has_inputs != has_outputs;
  auto name = [&](bool present, bool single, std::string_view one, std::string_view many) {
    if (!present) return std::string_view();
    if (one_side) return single ? std::string_view("tensor") : std::string_view("tensors");
    return single ? one : many;
  };
  const bool single_in = IsSingleTensorLayout(traits.inputs);
  const bool single_out = IsSingleTensorLayout(traits.outputs);
  return OpWireFields{traits.name,
                      name(has_inputs, single_in, "input", "inputs"),
                      has_inputs && !single_in,
                      name(has_outputs, single_out, "output", "outputs"),
                      has_outputs && !single_out,
                      !traits.point_to_point ? std::string_view() : (has_inputs ? "dst" : "src")};
}

// nccl-tests' bus-bandwidth factor of `rule` for a group of `n` ranks.
constexpr double BusBandwidthFactor(BusFactor rule, int n) {
  const double ranks = n;
  switch (rule) {
    case BusFactor::kOne:
      return 1.0;
    case BusFactor::kTwiceNMinusOneOverN:
      return n <= 1 ? 0.0 : 2.0 * (ranks - 1) / ranks;
    case BusFactor::kNMinusOneOverN:
      return n <= 1 ? 1.0 : (ranks - 1) / ranks;
  }
  return 1.0;
}

// nccl-tests' bus-bandwidth factor of `kind` for a group of `n` ranks (1 for unknown kinds).
constexpr double BusBandwidthFactor(OpKind kind, int n) {
  return BusBandwidthFactor(TraitsOf(kind).bus, n);
}

}  // namespace collectived
