// ReduceOp: the reduction of a reducing collective (torch.distributed.ReduceOp), and the rules
// that say which (op, dtype) pairs are valid. Invalid pairs are rejected before any data moves.
#pragma once

#include <array>
#include <string_view>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/status.h"

namespace collectived {

enum class ReduceOpKind {
  kSum,
  kAvg,
  kProduct,
  kMin,
  kMax,
  kBand,
  kBor,
  kBxor,
  kPremulSum,
};

// Every kind, in enum order.
inline constexpr std::array<ReduceOpKind, 9> kAllReduceOpKinds = {
    ReduceOpKind::kSum, ReduceOpKind::kAvg,  ReduceOpKind::kProduct,
    ReduceOpKind::kMin, ReduceOpKind::kMax,  ReduceOpKind::kBand,
    ReduceOpKind::kBor, ReduceOpKind::kBxor, ReduceOpKind::kPremulSum,
};

// A reduction: its kind and, for PREMUL_SUM, the factor every contribution is multiplied by
// before the sum (torch's _make_nccl_premul_sum). A plain value; copy it freely.
struct ReduceOp {
  ReduceOpKind kind = ReduceOpKind::kSum;
  double scale = 1.0;  // PREMUL_SUM only; ignored by the other kinds

  static constexpr ReduceOp Sum() { return {ReduceOpKind::kSum}; }
  static constexpr ReduceOp Avg() { return {ReduceOpKind::kAvg}; }
  static constexpr ReduceOp Product() { return {ReduceOpKind::kProduct}; }
  static constexpr ReduceOp Min() { return {ReduceOpKind::kMin}; }
  static constexpr ReduceOp Max() { return {ReduceOpKind::kMax}; }
  static constexpr ReduceOp Band() { return {ReduceOpKind::kBand}; }
  static constexpr ReduceOp Bor() { return {ReduceOpKind::kBor}; }
  static constexpr ReduceOp Bxor() { return {ReduceOpKind::kBxor}; }
  static constexpr ReduceOp PremulSum(double scale) { return {ReduceOpKind::kPremulSum, scale}; }

  // Exact comparison, scale included: ranks must agree on it bit for bit (desync detection).
  bool operator==(const ReduceOp&) const = default;
};

// Returns torch's spelling of `kind`: "SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR",
// "BXOR", "PREMUL_SUM"; "UNKNOWN" for a value outside the enum. The view refers to static
// storage.
std::string_view ReduceOpName(ReduceOpKind kind);

// Checks that `op` can reduce elements of `dtype`, with torch/NCCL's rules:
//  - SUM, PRODUCT: every dtype; on bool SUM is logical or and PRODUCT logical and.
//  - AVG: every dtype but bool. Integer averages truncate toward zero.
//  - MIN, MAX: every dtype but complex (complex numbers are not ordered); on bool MIN is
//    logical and and MAX logical or.
//  - BAND, BOR, BXOR: integer dtypes and bool only.
//  - PREMUL_SUM: floating point and complex dtypes only, and `op.scale` must be finite in the
//    type the scaling is computed in (float for float16/bfloat16/float32/complex64, double for
//    float64/complex128).
// Returns OK when the pair is valid. Returns InvalidArgument otherwise (also for kUnspecified,
// a dtype or kind outside its enum), with a message that names the op and the dtype, e.g.
// "ReduceOp BAND is not supported for dtype float32 (bitwise ops need an integer or bool
// dtype)".
Status ValidateReduceOp(const ReduceOp& op, DType dtype);

}  // namespace collectived
