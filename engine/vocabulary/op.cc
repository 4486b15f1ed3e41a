#include "engine/vocabulary/op.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>

#include "engine/vocabulary/op_traits.h"

namespace collectived {
namespace {

std::string Where(std::string_view group, int rank, OpKind kind) {
  return std::string(OpKindName(kind)) + " on group '" + std::string(group) + "' (rank " +
         std::to_string(rank) + ")";
}

Status CheckTensors(const std::vector<TensorView>& tensors, DType dtype, DeviceKind device,
                    const std::string& where, std::string_view role) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorView& t = tensors[i];
    if (t.device.kind != device) {
      return Status::InvalidArgument(
          where + ": " + std::string(role) + " tensor " + std::to_string(i) + " is on " +
          std::string(DeviceKindName(t.device.kind)) + " but the group's tensors live on " +
          std::string(DeviceKindName(device)));
    }
    if (t.dtype == DType::kUnspecified || DTypeSize(t.dtype) == 0) {
      return Status::InvalidArgument(where + ": " + std::string(role) + " tensor " +
                                     std::to_string(i) + " has no dtype");
    }
    if (t.dtype != dtype) {
      return Status::InvalidArgument(
          where + ": tensors with different dtypes: " + std::string(DTypeName(dtype)) + " and " +
          std::string(DTypeName(t.dtype)) + " (" + std::string(role) + " tensor " +
          std::to_string(i) + ")");
    }
    if (t.count > 0 && t.data == nullptr) {
      return Status::InvalidArgument(where + ": " + std::string(role) + " tensor " +
                                     std::to_string(i) + " has no memory");
    }
  }
  return Status::Ok();
}

Status CheckCount(size_t expected, size_t actual, const std::string& where,
                  const std::string& what) {
  if (expected == actual) return Status::Ok();
  return Status::InvalidArgument(where + ": " + what + " has " + std::to_string(actual) +
                                 " elements, expected " + std::to_string(expected));
}

Status CheckNumber(size_t expected, size_t actual, const std::string& where,
                   const std::string& what) {
  if (expected == actual) return Status::Ok();
  return Status::InvalidArgument(where + ": expected " + std::to_string(expected) + " " + what +
                                 " (one per rank of the group), got " + std::to_string(actual));
}

Status CheckRank(int rank, int group_size, const std::string& where, std::string_view what) {
  if (rank >= 0 && rank < group_size) return Status::Ok();
  return Status::InvalidArgument(where + ": invalid " + std::string(what) + " rank " +
                                 std::to_string(rank) + " (group size " +
                                 std::to_string(group_size) + ")");
}

Status CheckSplits(std::vector<uint64_t>& splits, size_t count, int group_size,
                   const std::string& where, std::string_view which) {
  if (splits.empty()) {
    if (count % group_size != 0) {
      return Status::InvalidArgument(where + ": " + std::string(which) + " of " +
                                     std::to_string(count) + " elements cannot be split equally " +
                                     "among " + std::to_string(group_size) + " ranks");
    }
    splits.assign(group_size, count / group_size);
    return Status::Ok();
  }
  if (splits.size() != static_cast<size_t>(group_size)) {
    return Status::InvalidArgument(where + ": " + std::string(which) + " split sizes have " +
                                   std::to_string(splits.size()) + " entries, expected " +
                                   std::to_string(group_size));
  }
  uint64_t sum = 0;
  for (uint64_t split : splits) {
    if (split > std::numeric_limits<uint64_t>::max() - sum) {  // the sum would wrap around
      return Status::InvalidArgument(where + ": " + std::string(which) +
                                     " split sizes add up to more than 2^64 elements (the tensor "
                                     "has " +
                                     std::to_string(count) + ")");
    }
    sum += split;
  }
  if (sum != count) {
    return Status::InvalidArgument(where + ": " + std::string(which) + " split sizes add up to " +
                                   std::to_string(sum) + " elements but the tensor has " +
                                   std::to_string(count));
  }
  return Status::Ok();
}

}  // namespace

std::string_view OpKindName(OpKind kind) {
  return TraitsOf(kind).name;
}

bool IsPointToPoint(OpKind kind) {
  return TraitsOf(kind).point_to_point;
}

bool IsReducing(OpKind kind) {
  return TraitsOf(kind).reduces;
}

bool IsRooted(OpKind kind) {
  return TraitsOf(kind).rooted;
}

namespace {

// The side of a request one TensorLayout describes.
struct Side {
  std::vector<TensorView>& tensors;
  TensorLayout layout;
  std::string_view name;  // "input" or "output"
  std::vector<uint64_t>* splits;
};

// The number of tensors `side` takes (and, on a non-root rank, that it takes none).
Status CheckShape(const OpRequest& r, const Side& side, const Side& other, int rank, int n,
                  const std::string& where) {
  const std::vector<TensorView>& v = side.tensors;
  const std::string name(side.name);
  auto none = [&](const std::string& what) -> Status {
    if (v.empty()) return Status::Ok();
    return Status::InvalidArgument(where + ": " + what + " tensors given (" +
                                   std::to_string(v.size()) + ") where none are expected");
  };
  switch (side.layout) {
    case TensorLayout::kNone:
      return none(name);
    case TensorLayout::kOne:
    case TensorLayout::kOneOfGroupSize:
    case TensorLayout::kOneSplit:
      if (v.size() == 1) return Status::Ok();
      return Status::InvalidArgument(where + ": expected exactly one " + name + " tensor, got " +
                                     std::to_string(v.size()));
    case TensorLayout::kList:
      return Status::Ok();
    case TensorLayout::kOnePerRankOnRoot:
      if (rank != r.root) {
        // torch's names: gather_list, scatter_list.
        return none(name + " (" + std::string(OpKindName(r.kind)) + "_list on a non-root rank)");
      }
      [[fallthrough]];
    case TensorLayout::kOnePerRank:
      return CheckNumber(n, v.size(), where, name + " tensors");
    case TensorLayout::kListTimesGroupSize:
      return CheckNumber(other.tensors.size() * n, v.size(), where,
                         name + " tensors per " + std::string(other.name));
  }
  return Status::InvalidArgument(where + ": unknown tensor layout");
}

// The counts of `side`'s tensors against the other side's (its shape already checked).
Status CheckCounts(const OpRequest& r, const Side& side, const Side& other, int rank, int n,
                   const std::string& where) {
  const std::vector<TensorView>& v = side.tensors;
  const std::string name(side.name);
  switch (side.layout) {
    case TensorLayout::kOnePerRankOnRoot:
    case TensorLayout::kOnePerRank:
      // Blocks of the other side's one tensor (allgather, reduce_scatter, gather, scatter);
      // alltoall's blocks may differ (checked pairwise across ranks).
      if (other.layout != TensorLayout::kOne) return Status::Ok();
      for (size_t i = 0; i < v.size(); ++i) {
        COLLECTIVED_RETURN_IF_ERROR(CheckCount(other.tensors[0].count, v[i].count, where,
                                               name + " tensor " + std::to_string(i)));
      }
      return Status::Ok();
    case TensorLayout::kOneOfGroupSize:
      return CheckCount(other.tensors[0].count * n, v[0].count, where,
                        "the " + name + " tensor (group size x " + std::string(other.name) + ")");
    case TensorLayout::kOneSplit:
      return CheckSplits(*side.splits, v[0].count, n, where, side.name);
    case TensorLayout::kListTimesGroupSize:
      for (size_t i = 0; i < v.size(); ++i) {
        COLLECTIVED_RETURN_IF_ERROR(CheckCount(other.tensors[i / n].count, v[i].count, where,
                                               name + " tensor " + std::to_string(i)));
      }
      return Status::Ok();
    default:
      return Status::Ok();
  }
}

// The tensors of `r` against the layouts of its kind (engine/vocabulary/op_traits.h): how many each
// side takes, then their counts. Rewrites equal (empty) splits into explicit ones.
Status CheckLayouts(OpRequest& r, int rank, int n, const std::string& where) {
  const OpTraits& traits = TraitsOf(r.kind);
  if (traits.family == OpFamily::kNone) {
    return Status::InvalidArgument(where + ": unknown op kind");
  }
  Side inputs{r.inputs, traits.inputs, "input", &r.input_splits};
  Side outputs{r.outputs, traits.outputs, "output", &r.output_splits};
  // Single-tensor sides are checked before list sides: their one tensor is what the other side's
  // counts are measured against.
  const bool outputs_first =
      IsSingleTensorLayout(outputs.layout) && !IsSingleTensorLayout(inputs.layout);
  const Side& first = outputs_first ? outputs : inputs;
  const Side& second = outputs_first ? inputs : outputs;
  COLLECTIVED_RETURN_IF_ERROR(CheckShape(r, first, second, rank, n, where));
  COLLECTIVED_RETURN_IF_ERROR(CheckShape(r, second, first, rank, n, where));
  COLLECTIVED_RETURN_IF_ERROR(CheckCounts(r, first, second, rank, n, where));
  return CheckCounts(r, second, first, rank, n, where);
}

}  // namespace

Status ValidateRequest(OpRequest& r, std::string_view group, int rank, int n, DeviceKind device) {
  const std::string where = Where(group, rank, r.kind);
  if (r.timeout.count() < 0) {
    return Status::InvalidArgument(where + ": negative timeout " +
                                   std::to_string(r.timeout.count()) + " ms");
  }
  if (r.timeout > kMaxTimeout) {
    return Status::InvalidArgument(where + ": timeout " + std::to_string(r.timeout.count()) +
                                   " ms is longer than the longest accepted, " +
                                   std::to_string(kMaxTimeout.count()) + " ms (7 days)");
  }
  if (IsRooted(r.kind)) COLLECTIVED_RETURN_IF_ERROR(CheckRank(r.root, n, where, "root"));
  if (IsPointToPoint(r.kind)) {
    std::string_view role = r.kind == OpKind::kSend ? "destination" : "source";
    const bool any_source = r.kind == OpKind::kRecv && r.peer == kAnySource;
    if (!any_source) COLLECTIVED_RETURN_IF_ERROR(CheckRank(r.peer, n, where, role));
    if (r.peer == rank) {
      return Status::InvalidArgument(where + ": invalid " + std::string(role) + " rank " +
                                     std::to_string(r.peer) +
                                     ": should not be the same as the rank of the caller");
    }
  }
  const std::vector<TensorView>& first = r.inputs.empty() ? r.outputs : r.inputs;
  if (r.kind != OpKind::kBarrier && first.empty()) {
    if (!((r.kind == OpKind::kScatter && rank != r.root))) {
      return Status::InvalidArgument(where + ": no tensors given");
    }
  }
  DType dtype = first.empty() ? (r.outputs.empty() ? DType::kUnspecified : r.outputs[0].dtype)
                              : first[0].dtype;
  if (r.kind != OpKind::kBarrier) {
    COLLECTIVED_RETURN_IF_ERROR(CheckTensors(r.inputs, dtype, device, where, "input"));
    COLLECTIVED_RETURN_IF_ERROR(CheckTensors(r.outputs, dtype, device, where, "output"));
  }
  if (IsReducing(r.kind)) {
    Status valid = ValidateReduceOp(r.reduce_op, dtype);
    if (!valid.ok()) return valid.WithContext(where);
  }
  return CheckLayouts(r, rank, n, where);
}

OpSignature MakeSignature(const OpRequest& r, uint64_t sequence_number) {
  OpSignature s;
  s.sequence_number = static_cast<int64_t>(sequence_number);
  s.kind = static_cast<int32_t>(r.kind);
  const std::vector<TensorView>& any = r.inputs.empty() ? r.outputs : r.inputs;
  s.dtype = any.empty() ? 0 : static_cast<int32_t>(any[0].dtype);
  if (IsReducing(r.kind)) {
    s.reduce_kind = static_cast<int32_t>(r.reduce_op.kind);
    s.scale = r.reduce_op.scale;
  }
  s.root = IsRooted(r.kind) ? r.root : -1;
  switch (TraitsOf(r.kind).signature_count) {
    case SignatureCount::kFirstInput:
      s.count = static_cast<int64_t>(r.inputs[0].count);
      break;
    case SignatureCount::kFirstOutput:
      s.count = static_cast<int64_t>(r.outputs[0].count);
      break;
    case SignatureCount::kSumOfInputs:
      s.sizes_digest = 14695981039346656037ull;  // FNV-1a over the counts
      for (size_t i = 0; i < r.inputs.size(); ++i) {
        const uint64_t count = r.inputs[i].count;
        s.count += static_cast<int64_t>(count);
        if (i < OpSignature::kSizesShown) s.sizes[i] = static_cast<int64_t>(count);
        for (int byte = 0; byte < 8; ++byte) {
          s.sizes_digest = (s.sizes_digest ^ ((count >> (8 * byte)) & 0xff)) * 1099511628211ull;
        }
      }
      s.num_tensors = static_cast<int64_t>(r.inputs.size());
      break;
    case SignatureCount::kNone:  // alltoall: counts differ per rank, checked pairwise
      break;
  }
  return s;
}

std::string DescribeSignature(const OpSignature& s) {
  std::string text = std::string(OpKindName(static_cast<OpKind>(s.kind))) + "(";
  if (s.dtype != 0) text += std::string(DTypeName(static_cast<DType>(s.dtype))) + ", ";
  text += "count=" + std::to_string(s.count);
  if (s.num_tensors > 0) text += ", tensors=" + std::to_string(s.num_tensors);
  if (s.root >= 0) text += ", root=" + std::to_string(s.root);
  if (IsReducing(static_cast<OpKind>(s.kind))) {
    text += ", " + std::string(ReduceOpName(static_cast<ReduceOpKind>(s.reduce_kind)));
    if (static_cast<ReduceOpKind>(s.reduce_kind) == ReduceOpKind::kPremulSum) {
      text += "(" + std::to_string(s.scale) + ")";
    }
  }
  text += ")";
  if (s.num_tensors > 0) {
    text += " with tensor sizes [";
    const int64_t shown = std::min<int64_t>(s.num_tensors, OpSignature::kSizesShown);
    for (int64_t i = 0; i < shown; ++i) text += (i ? ", " : "") + std::to_string(s.sizes[i]);
    if (s.num_tensors > shown) {
      char digest[32];
      std::snprintf(digest, sizeof(digest), "%016llx",
                    static_cast<unsigned long long>(s.sizes_digest));
      text += ", ... (digest " + std::string(digest) + ")";
    }
    text += "]";
  }
  return text;
}

uint64_t AlgorithmBytes(const OpRequest& r, int n) {
  auto sum = [](const std::vector<TensorView>& v) {
    uint64_t total = 0;
    for (const TensorView& t : v) total += t.bytes();
    return total;
  };
  const auto group_size = static_cast<uint64_t>(n);
  switch (TraitsOf(r.kind).bytes) {
    case ByteCount::kInputs:
      return sum(r.inputs);
    case ByteCount::kOutputs:
      return sum(r.outputs);
    case ByteCount::kInputsTimesGroupSize:
      return sum(r.inputs) * group_size;
    case ByteCount::kOutputsTimesGroupSize:
      return sum(r.outputs) * group_size;
  }
  return sum(r.inputs);
}

}  // namespace collectived
