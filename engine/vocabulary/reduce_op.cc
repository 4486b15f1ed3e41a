#include "engine/vocabulary/reduce_op.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>

namespace collectived {
namespace {

bool IsValidKind(ReduceOpKind kind) {
  return static_cast<int>(kind) >= static_cast<int>(ReduceOpKind::kSum) &&
         static_cast<int>(kind) <= static_cast<int>(ReduceOpKind::kPremulSum);
}

Status Unsupported(const ReduceOp& op, DType dtype, std::string_view why) {
  std::string dtype_name(DTypeName(dtype));
  if (dtype != DType::kUnspecified && !IsValidDType(static_cast<int32_t>(dtype))) {
    dtype_name = "invalid (" + std::to_string(static_cast<int32_t>(dtype)) + ")";
  }
  std::string op_name(ReduceOpName(op.kind));
  if (!IsValidKind(op.kind)) {
    op_name = "UNKNOWN (" + std::to_string(static_cast<int>(op.kind)) + ")";
  }
  return Status::InvalidArgument("ReduceOp " + op_name + " is not supported for dtype " +
                                 dtype_name + " (" + std::string(why) + ")");
}

std::string FormatScale(double scale) {
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), "%g", scale);
  return buffer;
}

}  // namespace

std::string_view ReduceOpName(ReduceOpKind kind) {
  switch (kind) {
    case ReduceOpKind::kSum:
      return "SUM";
    case ReduceOpKind::kAvg:
      return "AVG";
    case ReduceOpKind::kProduct:
      return "PRODUCT";
    case ReduceOpKind::kMin:
      return "MIN";
    case ReduceOpKind::kMax:
      return "MAX";
    case ReduceOpKind::kBand:
      return "BAND";
    case ReduceOpKind::kBor:
      return "BOR";
    case ReduceOpKind::kBxor:
      return "BXOR";
    case ReduceOpKind::kPremulSum:
      return "PREMUL_SUM";
  }
  return "UNKNOWN";
}

Status ValidateReduceOp(const ReduceOp& op, DType dtype) {
  if (!IsValidDType(static_cast<int32_t>(dtype))) {
    return Unsupported(op, dtype, "a valid dtype is required");
  }
  switch (op.kind) {
    case ReduceOpKind::kSum:
    case ReduceOpKind::kProduct:
      return Status::Ok();
    case ReduceOpKind::kAvg:
      if (dtype == DType::kBool) {
        return Unsupported(op, dtype, "the average of booleans is not a boolean");
      }
      return Status::Ok();
    case ReduceOpKind::kMin:
    case ReduceOpKind::kMax:
      if (IsComplex(dtype)) return Unsupported(op, dtype, "complex numbers are not ordered");
      return Status::Ok();
    case ReduceOpKind::kBand:
    case ReduceOpKind::kBor:
    case ReduceOpKind::kBxor:
      if (!IsIntegral(dtype) && dtype != DType::kBool) {
        return Unsupported(op, dtype, "bitwise ops need an integer or bool dtype");
      }
      return Status::Ok();
    case ReduceOpKind::kPremulSum: {
      if (!IsFloatingPoint(dtype) && !IsComplex(dtype)) {
        return Unsupported(op, dtype, "PREMUL_SUM needs a floating point or complex dtype");
      }
      // The scale is applied in the kernels' compute type; a double that overflows float
      // would turn every element into inf or NaN (and converting it is undefined behaviour).
      const bool in_double = dtype == DType::kFloat64 || dtype == DType::kComplex128;
      const bool finite = std::isfinite(op.scale) &&
                          (in_double || std::fabs(op.scale) <= std::numeric_limits<float>::max());
      if (!finite) {
        return Status::InvalidArgument("ReduceOp PREMUL_SUM scale " + FormatScale(op.scale) +
                                       " is not finite as " + (in_double ? "a double" : "a float") +
                                       " (dtype " + std::string(DTypeName(dtype)) + ")");
      }
      return Status::Ok();
    }
  }
  return Unsupported(op, dtype, "unknown reduce op kind");
}

}  // namespace collectived
