// The device kernels' combiner for a reduce op (host code: the GPU backend and its tests).
#pragma once

#include "engine/cuda/device_kernels.h"
#include "engine/vocabulary/reduce_op.h"

namespace collectived::device_kernels {

// AVG and PREMUL_SUM combine by summing (their scaling happens around the sum).
inline Combiner CombinerOf(ReduceOpKind kind) {
  switch (kind) {
    case ReduceOpKind::kProduct:
      return Combiner::kProduct;
    case ReduceOpKind::kMin:
      return Combiner::kMin;
    case ReduceOpKind::kMax:
      return Combiner::kMax;
    case ReduceOpKind::kBand:
      return Combiner::kBand;
    case ReduceOpKind::kBor:
      return Combiner::kBor;
    case ReduceOpKind::kBxor:
      return Combiner::kBxor;
    default:
      return Combiner::kSum;
  }
}

}  // namespace collectived::device_kernels
