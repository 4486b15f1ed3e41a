// The kernels are templates instantiated once per (op, element type). Each inner loop is a plain
// loop over __restrict-qualified typed pointers whose body is an inlined, branch-free element
// function, so that GCC vectorises it (this file is built with -O3 -march=x86-64-v2). Every
// decision (op, dtype, aliasing) is taken once per call, outside the loops.
#include "engine/vocabulary/reduce_kernels.h"

#include <cstdint>
#include <string>
#include <type_traits>

#include "engine/vocabulary/reduce_kernels_x86.h"

namespace collectived {
namespace {

// ----------------------------------------------------------------------------------------------
// Element operations: stateless types with `using T` (the element as stored) and
// `static T Apply(T a, T b)`.
// ----------------------------------------------------------------------------------------------

// Arithmetic on integers narrower than int is done after promotion to int, where a product of
// two uint16 can overflow; doing it in an unsigned type of at least int's width makes wrap-around
// well defined for every width.
template <typename T>
using WrapType =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <typename F>
struct FloatSum {
  using T = F;
  static F Apply(F a, F b) { return a + b; }
};
template <typename F>
struct FloatProduct {
  using T = F;
  static F Apply(F a, F b) { return a * b; }
};
// `b != b` is the NaN test; written as a select so the loop stays a compare-and-blend.
template <typename F>
struct FloatMin {
  using T = F;
  static F Apply(F a, F b) {
    const F smaller = b < a ? b : a;  // a when a is NaN
    return b != b ? b : smaller;
  }
};
template <typename F>
struct FloatMax {
  using T = F;
  static F Apply(F a, F b) {
    const F larger = b > a ? b : a;  // a when a is NaN
    return b != b ? b : larger;
  }
};

template <typename I>
struct IntSum {
  using T = I;
  static I Apply(I a, I b) {
    return static_cast<I>(static_cast<WrapType<I>>(a) + static_cast<WrapType<I>>(b));
  }
};
template <typename I>
struct IntProduct {
  using T = I;
  static I Apply(I a, I b) {
    return static_cast<I>(static_cast<WrapType<I>>(a) * static_cast<WrapType<I>>(b));
  }
};
template <typename I>
struct IntMin {
  using T = I;
  static I Apply(I a, I b) { return b < a ? b : a; }
};
template <typename I>
struct IntMax {
  using T = I;
  static I Apply(I a, I b) { return b > a ? b : a; }
};
template <typename I>
struct IntBand {
  using T = I;
  static I Apply(I a, I b) { return static_cast<I>(a & b); }
};
template <typename I>
struct IntBor {
  using T = I;
  static I Apply(I a, I b) { return static_cast<I>(a | b); }
};
template <typename I>
struct IntBxor {
  using T = I;
  static I Apply(I a, I b) { return static_cast<I>(a ^ b); }
};

// Bool elements are handled as bytes: loading a byte that is neither 0 nor 1 through `bool` is
// undefined behaviour, and a client's shared memory can hold anything.
struct BoolOr {
  using T = uint8_t;
  static uint8_t Apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a | b) != 0); }
};
struct BoolAnd {
  using T = uint8_t;
  static uint8_t Apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) & (b != 0)); }
};
struct BoolXor {
  using T = uint8_t;
  static uint8_t Apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a != 0) != (b != 0)); }
};

// float16 and bfloat16: widen to float, apply the float op, round back.
struct HalfCodec {
  static float Decode(uint16_t h) { return HalfToFloat(h); }
  static uint16_t Encode(float f) { return FloatToHalf(f); }
};
struct BFloat16Codec {
  static float Decode(uint16_t h) { return BFloat16ToFloat(h); }
  static uint16_t Encode(float f) { return FloatToBFloat16(f); }
};
template <typename Codec, template <typename> class FloatOp>
struct Via16 {
  using T = uint16_t;
  static uint16_t Apply(uint16_t a, uint16_t b) {
    return Codec::Encode(FloatOp<float>::Apply(Codec::Decode(a), Codec::Decode(b)));
  }
};
// MIN/MAX pick one of the inputs, so they return its bits and skip the rounding step.
template <typename Codec>
struct Via16Min {
  using T = uint16_t;
  static uint16_t Apply(uint16_t a, uint16_t b) {
    const float fa = Codec::Decode(a);
    const float fb = Codec::Decode(b);
    return (fb < fa || fb != fb) ? b : a;
  }
};
template <typename Codec>
struct Via16Max {
  using T = uint16_t;
  static uint16_t Apply(uint16_t a, uint16_t b) {
    const float fa = Codec::Decode(a);
    const float fb = Codec::Decode(b);
    return (fb > fa || fb != fb) ? b : a;
  }
};

// Complex numbers as two floating-point parts, laid out like std::complex and torch's.
template <typename F>
struct Complex {
  F re;
  F im;
};
template <typename F>
struct ComplexProduct {
  using T = Complex<F>;
  static T Apply(T a, T b) { return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re}; }
};

// ----------------------------------------------------------------------------------------------
// Loops. __restrict promises the compiler that the written buffer is not reached through the
// other pointers, which it needs to vectorise without runtime overlap checks; each aliasing case
// therefore gets its own loop in which that promise is true.
// ----------------------------------------------------------------------------------------------

template <typename Op>
void Distinct(typename Op::T* __restrict out, const typename Op::T* __restrict a,
              const typename Op::T* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Op::Apply(a[i], b[i]);
}

// inout[i] = inout[i] (op) other[i], or other[i] (op) inout[i]: operand order is kept so that
// which NaN comes out of MIN/MAX does not depend on which input the output aliases.
template <typename Op, bool kInoutIsA>
void InPlace(typename Op::T* __restrict inout, const typename Op::T* __restrict other, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    inout[i] = kInoutIsA ? Op::Apply(inout[i], other[i]) : Op::Apply(other[i], inout[i]);
  }
}

template <typename Op>
void AllSame(typename Op::T* __restrict inout, size_t n) {
  for (size_t i = 0; i < n; ++i) inout[i] = Op::Apply(inout[i], inout[i]);
}

// No promises: GCC checks for overlap at run time; correct (in index order) whatever the overlap.
template <typename Op>
void Overlapping(typename Op::T* out, const typename Op::T* a, const typename Op::T* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Op::Apply(a[i], b[i]);
}

bool Overlap(const void* x, const void* y, size_t bytes) {
  const auto xs = reinterpret_cast<uintptr_t>(x);
  const auto ys = reinterpret_cast<uintptr_t>(y);
  return xs < ys + bytes && ys < xs + bytes;
}

template <typename Op>
void Combine(void* out_v, const void* a_v, const void* b_v, size_t n) {
  using T = typename Op::T;
  if (n == 0) return;
  auto* out = static_cast<T*>(out_v);
  const auto* a = static_cast<const T*>(a_v);
  const auto* b = static_cast<const T*>(b_v);
  const size_t bytes = n * sizeof(T);
  if (out == a) {
    if (out == b) {
      AllSame<Op>(out, n);
    } else if (Overlap(out, b, bytes)) {
      Overlapping<Op>(out, a, b, n);
    } else {
      InPlace<Op, true>(out, b, n);
    }
  } else if (out == b) {
    if (Overlap(out, a, bytes)) {
      Overlapping<Op>(out, a, b, n);
    } else {
      InPlace<Op, false>(out, a, n);
    }
  } else if (Overlap(out, a, bytes) || Overlap(out, b, bytes)) {
    Overlapping<Op>(out, a, b, n);
  } else {
    Distinct<Op>(out, a, b, n);  // `a` and `b` may alias each other: both are only read
  }
}

// float16/bfloat16 SUM through a vector loop (reduce_kernels_x86.h), which handles exact
// aliasing; partially overlapping buffers take the scalar loop, which keeps index order.
template <typename Codec, void (*kVector)(uint16_t*, const uint16_t*, const uint16_t*, size_t)>
void VectorSum16(void* out_v, const void* a_v, const void* b_v, size_t n) {
  auto* out = static_cast<uint16_t*>(out_v);
  const auto* a = static_cast<const uint16_t*>(a_v);
  const auto* b = static_cast<const uint16_t*>(b_v);
  const size_t bytes = n * sizeof(uint16_t);
  if ((out != a && Overlap(out, a, bytes)) || (out != b && Overlap(out, b, bytes))) {
    Combine<Via16<Codec, FloatSum>>(out_v, a_v, b_v, n);
    return;
  }
  kVector(out, a, b, n);
}

// A complex SUM is a SUM over twice as many parts.
template <typename F>
void ComplexSum(void* out, const void* a, const void* b, size_t n) {
  Combine<FloatSum<F>>(out, a, b, 2 * n);
}

// ----------------------------------------------------------------------------------------------
// Scaling loops for PreScale and Finalize.
// ----------------------------------------------------------------------------------------------

template <typename F>
void Multiply(F* __restrict data, size_t n, F factor) {
  for (size_t i = 0; i < n; ++i) data[i] *= factor;
}

template <typename F>
void Divide(F* __restrict data, size_t n, F divisor) {
  for (size_t i = 0; i < n; ++i) data[i] /= divisor;
}

template <typename Codec>
void Multiply16(uint16_t* __restrict data, size_t n, float factor) {
  for (size_t i = 0; i < n; ++i) data[i] = Codec::Encode(Codec::Decode(data[i]) * factor);
}

template <typename Codec>
void Divide16(uint16_t* __restrict data, size_t n, float divisor) {
  for (size_t i = 0; i < n; ++i) data[i] = Codec::Encode(Codec::Decode(data[i]) / divisor);
}

// C++ integer division truncates toward zero, as NCCL's AVG does. Division happens in the
// promoted type (at least int), and the quotient always fits back since divisor >= 1.
template <typename I>
void DivideInt(I* __restrict data, size_t n, int divisor) {
  using Promoted = std::common_type_t<I, int>;
  const auto d = static_cast<Promoted>(divisor);
  for (size_t i = 0; i < n; ++i) data[i] = static_cast<I>(static_cast<Promoted>(data[i]) / d);
}

// ----------------------------------------------------------------------------------------------
// Dispatch tables.
// ----------------------------------------------------------------------------------------------

template <template <typename> class FloatOp>
CombineFn FloatingKernel(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return &Combine<Via16<HalfCodec, FloatOp>>;
    case DType::kBFloat16:
      return &Combine<Via16<BFloat16Codec, FloatOp>>;
    case DType::kFloat32:
      return &Combine<FloatOp<float>>;
    case DType::kFloat64:
      return &Combine<FloatOp<double>>;
    default:
      return nullptr;
  }
}

template <template <typename> class IntOp>
CombineFn IntegralKernel(DType dtype) {
  switch (dtype) {
    case DType::kInt8:
      return &Combine<IntOp<int8_t>>;
    case DType::kUInt8:
      return &Combine<IntOp<uint8_t>>;
    case DType::kInt16:
      return &Combine<IntOp<int16_t>>;
    case DType::kInt32:
      return &Combine<IntOp<int32_t>>;
    case DType::kInt64:
      return &Combine<IntOp<int64_t>>;
    default:
      return nullptr;
  }
}

// Returns the kernel for a pair ValidateReduceOp accepted; null only for pairs it rejects.
CombineFn SelectKernel(ReduceOpKind kind, DType dtype) {
  const bool is_bool = dtype == DType::kBool;
  switch (kind) {
    case ReduceOpKind::kSum:
    case ReduceOpKind::kAvg:
    case ReduceOpKind::kPremulSum:
      if (is_bool) return &Combine<BoolOr>;
      if (dtype == DType::kComplex64) return &ComplexSum<float>;
      if (dtype == DType::kComplex128) return &ComplexSum<double>;
      if (IsIntegral(dtype)) return IntegralKernel<IntSum>(dtype);
      return FloatingKernel<FloatSum>(dtype);
    case ReduceOpKind::kProduct:
      if (is_bool) return &Combine<BoolAnd>;
      if (dtype == DType::kComplex64) return &Combine<ComplexProduct<float>>;
      if (dtype == DType::kComplex128) return &Combine<ComplexProduct<double>>;
      if (IsIntegral(dtype)) return IntegralKernel<IntProduct>(dtype);
      return FloatingKernel<FloatProduct>(dtype);
    case ReduceOpKind::kMin:
      if (is_bool) return &Combine<BoolAnd>;
      if (IsIntegral(dtype)) return IntegralKernel<IntMin>(dtype);
      if (dtype == DType::kFloat16) return &Combine<Via16Min<HalfCodec>>;
      if (dtype == DType::kBFloat16) return &Combine<Via16Min<BFloat16Codec>>;
      return FloatingKernel<FloatMin>(dtype);
    case ReduceOpKind::kMax:
      if (is_bool) return &Combine<BoolOr>;
      if (IsIntegral(dtype)) return IntegralKernel<IntMax>(dtype);
      if (dtype == DType::kFloat16) return &Combine<Via16Max<HalfCodec>>;
      if (dtype == DType::kBFloat16) return &Combine<Via16Max<BFloat16Codec>>;
      return FloatingKernel<FloatMax>(dtype);
    case ReduceOpKind::kBand:
      return is_bool ? &Combine<BoolAnd> : IntegralKernel<IntBand>(dtype);
    case ReduceOpKind::kBor:
      return is_bool ? &Combine<BoolOr> : IntegralKernel<IntBor>(dtype);
    case ReduceOpKind::kBxor:
      return is_bool ? &Combine<BoolXor> : IntegralKernel<IntBxor>(dtype);
  }
  return nullptr;
}

Status CheckBuffer(const ReduceOp& op, DType dtype, const void* data, size_t count,
                   std::string_view function) {
  if (data == nullptr && count != 0) {
    return Status::InvalidArgument(std::string(function) + " for ReduceOp " +
                                   std::string(ReduceOpName(op.kind)) + " on dtype " +
                                   std::string(DTypeName(dtype)) + ": null buffer with " +
                                   std::to_string(count) + " elements");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<CombineFn> CombineFunction(const ReduceOp& op, DType dtype, KernelChoice choice) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  CombineFn fn = SelectKernel(op.kind, dtype);
  const bool sum = op.kind == ReduceOpKind::kSum || op.kind == ReduceOpKind::kAvg ||
                   op.kind == ReduceOpKind::kPremulSum;
  if (sum && choice == KernelChoice::kFastest && x86::HasAvx2AndF16c()) {
    if (dtype == DType::kFloat16) fn = &VectorSum16<HalfCodec, &x86::HalfSum>;
    if (dtype == DType::kBFloat16) fn = &VectorSum16<BFloat16Codec, &x86::BFloat16Sum>;
  }
  if (fn == nullptr) {
    return Status::Internal("no kernel for valid ReduceOp " + std::string(ReduceOpName(op.kind)) +
                            " on dtype " + std::string(DTypeName(dtype)));
  }
  return fn;
}

Status PreScale(const ReduceOp& op, DType dtype, void* data, size_t count) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  COLLECTIVED_RETURN_IF_ERROR(CheckBuffer(op, dtype, data, count, "PreScale"));
  if (op.kind != ReduceOpKind::kPremulSum || count == 0) return Status::Ok();
  // Validation guarantees the scale is finite in the compute type, so these casts are exact
  // roundings, never overflows.
  const auto scale_f = static_cast<float>(op.scale);
  switch (dtype) {
    case DType::kFloat16:
      Multiply16<HalfCodec>(static_cast<uint16_t*>(data), count, scale_f);
      break;
    case DType::kBFloat16:
      Multiply16<BFloat16Codec>(static_cast<uint16_t*>(data), count, scale_f);
      break;
    case DType::kFloat32:
      Multiply(static_cast<float*>(data), count, scale_f);
      break;
    case DType::kComplex64:  // a real scale multiplies both parts
      Multiply(static_cast<float*>(data), 2 * count, scale_f);
      break;
    case DType::kFloat64:
      Multiply(static_cast<double*>(data), count, op.scale);
      break;
    case DType::kComplex128:
      Multiply(static_cast<double*>(data), 2 * count, op.scale);
      break;
    default:
      return Status::Internal("PreScale: no PREMUL_SUM kernel for dtype " +
                              std::string(DTypeName(dtype)));
  }
  return Status::Ok();
}

Status Finalize(const ReduceOp& op, DType dtype, void* data, size_t count, int num_contributions) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  COLLECTIVED_RETURN_IF_ERROR(CheckBuffer(op, dtype, data, count, "Finalize"));
  if (op.kind != ReduceOpKind::kAvg) return Status::Ok();
  if (num_contributions < 1) {
    return Status::InvalidArgument(
        "Finalize for ReduceOp AVG on dtype " + std::string(DTypeName(dtype)) +
        ": num_contributions must be at least 1, got " + std::to_string(num_contributions));
  }
  if (count == 0) return Status::Ok();
  const auto n_f = static_cast<float>(num_contributions);
  const auto n_d = static_cast<double>(num_contributions);
  switch (dtype) {
    case DType::kFloat16:
      Divide16<HalfCodec>(static_cast<uint16_t*>(data), count, n_f);
      break;
    case DType::kBFloat16:
      Divide16<BFloat16Codec>(static_cast<uint16_t*>(data), count, n_f);
      break;
    case DType::kFloat32:
      Divide(static_cast<float*>(data), count, n_f);
      break;
    case DType::kComplex64:
      Divide(static_cast<float*>(data), 2 * count, n_f);
      break;
    case DType::kFloat64:
      Divide(static_cast<double*>(data), count, n_d);
      break;
    case DType::kComplex128:
      Divide(static_cast<double*>(data), 2 * count, n_d);
      break;
    case DType::kInt8:
      DivideInt(static_cast<int8_t*>(data), count, num_contributions);
      break;
    case DType::kUInt8:
      DivideInt(static_cast<uint8_t*>(data), count, num_contributions);
      break;
    case DType::kInt16:
      DivideInt(static_cast<int16_t*>(data), count, num_contributions);
      break;
    case DType::kInt32:
      DivideInt(static_cast<int32_t*>(data), count, num_contributions);
      break;
    case DType::kInt64:
      DivideInt(static_cast<int64_t*>(data), count, num_contributions);
      break;
    default:
      return Status::Internal("Finalize: no AVG kernel for dtype " + std::string(DTypeName(dtype)));
  }
  return Status::Ok();
}

}  // namespace collectived
