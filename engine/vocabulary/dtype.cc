#include "engine/vocabulary/dtype.h"

#include <string>

namespace collectived {
namespace {

struct NamedDType {
  std::string_view name;
  DType dtype;
};

// Canonical names first, then torch's aliases (torch.half is torch.float16, and so on).
constexpr NamedDType kNames[] = {
    {"float16", DType::kFloat16},     {"bfloat16", DType::kBFloat16},
    {"float32", DType::kFloat32},     {"float64", DType::kFloat64},
    {"int8", DType::kInt8},           {"uint8", DType::kUInt8},
    {"int16", DType::kInt16},         {"int32", DType::kInt32},
    {"int64", DType::kInt64},         {"bool", DType::kBool},
    {"complex64", DType::kComplex64}, {"complex128", DType::kComplex128},
    {"half", DType::kFloat16},        {"float", DType::kFloat32},
    {"double", DType::kFloat64},      {"short", DType::kInt16},
    {"int", DType::kInt32},           {"long", DType::kInt64},
    {"cfloat", DType::kComplex64},    {"cdouble", DType::kComplex128},
};

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kBool:
    case DType::kInt8:
    case DType::kUInt8:
      return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
    case DType::kComplex64:
      return 8;
    case DType::kComplex128:
      return 16;
    case DType::kUnspecified:
      return 0;
  }
  return 0;
}

std::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kUnspecified:
      return "unspecified";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt8:
      return "int8";
    case DType::kUInt8:
      return "uint8";
    case DType::kInt16:
      return "int16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBool:
      return "bool";
    case DType::kComplex64:
      return "complex64";
    case DType::kComplex128:
      return "complex128";
  }
  return "invalid";
}

StatusOr<DType> DTypeFromName(std::string_view name) {
  constexpr std::string_view kTorchPrefix = "torch.";
  std::string_view bare = name;
  if (bare.starts_with(kTorchPrefix)) bare.remove_prefix(kTorchPrefix.size());
  for (const NamedDType& entry : kNames) {
    if (entry.name == bare) return entry.dtype;
  }
  // torch knows these, so a user may well try them: say they are unsupported, not unknown.
  if (bare == "complex32" || bare == "chalf") {
    return Status::InvalidArgument("dtype '" + std::string(name) +
                                   "' is not supported by collectived");
  }
  return Status::InvalidArgument(
      "unknown dtype '" + std::string(name) +
      "' (expected one of float16, bfloat16, float32, float64, int8, uint8, int16, int32, "
      "int64, bool, complex64, complex128, optionally prefixed with 'torch.', or one of torch's "
      "aliases half, float, double, short, int, long, cfloat, cdouble)");
}

bool IsValidDType(int32_t value) {
  return value >= static_cast<int32_t>(DType::kFloat16) &&
         value <= static_cast<int32_t>(DType::kComplex128);
}

}  // namespace collectived
