#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "engine/cuda/device_kernels.h"

namespace collectived::device_kernels {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 4096;

// float16 and bfloat16 are computed in float, like the host kernels, and rounded to nearest even.
struct Half {
  using Storage = __half;
  __device__ static float Load(__half v) { return __half2float(v); }
  __device__ static __half Store(float v) { return __float2half_rn(v); }
};
struct BFloat16 {
  using Storage = __nv_bfloat16;
  __device__ static float Load(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 Store(float v) { return __float2bfloat16_rn(v); }
};
template <typename T>
struct Plain {
  using Storage = T;
  __device__ static T Load(T v) { return v; }
  __device__ static T Store(T v) { return v; }
};

template <typename R>
struct Complex {
  R re, im;
};

// Integer sums and products wrap: computed in the unsigned type of the same width.
template <typename I>
__device__ I WrapAdd(I a, I b) {
  using U = std::make_unsigned_t<I>;
  return static_cast<I>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <typename I>
__device__ I WrapMul(I a, I b) {
  using U = std::conditional_t<(sizeof(I) < sizeof(unsigned)), unsigned, std::make_unsigned_t<I>>;
  return static_cast<I>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
}

// NaN propagates: a NaN operand wins.
template <typename F>
__device__ F NanMin(F a, F b) {
  return (a != a || a < b) ? a : b;
}
template <typename F>
__device__ F NanMax(F a, F b) {
  return (a != a || a > b) ? a : b;
}

template <typename F>
struct FloatOps {
  __device__ static F Sum(F a, F b) { return a + b; }
  __device__ static F Product(F a, F b) { return a * b; }
  __device__ static F Min(F a, F b) { return NanMin(a, b); }
  __device__ static F Max(F a, F b) { return NanMax(a, b); }
};

template <typename Codec, Combiner kCombiner>
__global__ void FloatCombineKernel(typename Codec::Storage* out, const typename Codec::Storage* a,
                                   const typename Codec::Storage* b, size_t n) {
  using F = decltype(Codec::Load(a[0]));
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const F x = Codec::Load(a[i]);
    const F y = Codec::Load(b[i]);
    F r;
    if constexpr (kCombiner == Combiner::kSum) r = FloatOps<F>::Sum(x, y);
    if constexpr (kCombiner == Combiner::kProduct) r = FloatOps<F>::Product(x, y);
    if constexpr (kCombiner == Combiner::kMin) r = FloatOps<F>::Min(x, y);
    if constexpr (kCombiner == Combiner::kMax) r = FloatOps<F>::Max(x, y);
    out[i] = Codec::Store(r);
  }
}

template <typename I, Combiner kCombiner>
__global__ void IntCombineKernel(I* out, const I* a, const I* b, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const I x = a[i];
    const I y = b[i];
    I r;
    if constexpr (kCombiner == Combiner::kSum) r = WrapAdd(x, y);
    if constexpr (kCombiner == Combiner::kProduct) r = WrapMul(x, y);
    if constexpr (kCombiner == Combiner::kMin) r = x < y ? x : y;
    if constexpr (kCombiner == Combiner::kMax) r = x > y ? x : y;
    if constexpr (kCombiner == Combiner::kBand) r = static_cast<I>(x & y);
    if constexpr (kCombiner == Combiner::kBor) r = static_cast<I>(x | y);
    if constexpr (kCombiner == Combiner::kBxor) r = static_cast<I>(x ^ y);
    out[i] = r;
  }
}

// bool as one byte holding 0 or 1: SUM, MAX and BOR are or; PRODUCT, MIN and BAND are and.
template <Combiner kCombiner>
__global__ void BoolCombineKernel(uint8_t* out, const uint8_t* a, const uint8_t* b, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const bool x = a[i] != 0;
    const bool y = b[i] != 0;
    bool r;
    if constexpr (kCombiner == Combiner::kSum || kCombiner == Combiner::kMax ||
                  kCombiner == Combiner::kBor) {
      r = x || y;
    } else if constexpr (kCombiner == Combiner::kBxor) {
      r = x != y;
    } else {
      r = x && y;
    }
    out[i] = r ? 1 : 0;
  }
}

template <typename R, Combiner kCombiner>
__global__ void ComplexCombineKernel(Complex<R>* out, const Complex<R>* a, const Complex<R>* b,
                                     size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const Complex<R> x = a[i];
    const Complex<R> y = b[i];
    if constexpr (kCombiner == Combiner::kSum) {
      out[i] = Complex<R>{x.re + y.re, x.im + y.im};
    } else {
      out[i] = Complex<R>{x.re * y.re - x.im * y.im, x.re * y.im + x.im * y.re};
    }
  }
}

// data = data * value, or data / value when `divide`, computed as the host kernels do.
template <typename Codec, typename F>
__global__ void RescaleKernel(typename Codec::Storage* data, size_t n, F value, bool divide) {
  using L = decltype(Codec::Load(data[0]));
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const L x = Codec::Load(data[i]);
    data[i] = Codec::Store(static_cast<L>(divide ? x / value : x * value));
  }
}

template <typename I>
__global__ void DivideIntKernel(I* data, size_t n, int divisor) {
  using Promoted = std::common_type_t<I, int>;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    data[i] = static_cast<I>(static_cast<Promoted>(data[i]) / static_cast<Promoted>(divisor));
  }
}

template <typename R, typename F>
__global__ void ComplexScaleKernel(Complex<R>* data, size_t n, F factor, bool divide) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    Complex<R> v = data[i];
    if (divide) {
      data[i] = Complex<R>{static_cast<R>(v.re / factor), static_cast<R>(v.im / factor)};
    } else {
      data[i] = Complex<R>{static_cast<R>(v.re * factor), static_cast<R>(v.im * factor)};
    }
  }
}

unsigned Blocks(size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks == 0 ? 1 : blocks);
}

template <typename Launch>
int Enqueue(size_t count, Launch launch) {
  if (count == 0) return cudaSuccess;
  launch(Blocks(count));
  return static_cast<int>(cudaGetLastError());
}

template <Combiner kCombiner>
int CombineAs(DType dtype, void* out, const void* a, const void* b, size_t n, cudaStream_t s) {
  constexpr bool kArithmetic = kCombiner == Combiner::kSum || kCombiner == Combiner::kProduct;
  constexpr bool kOrdered = kCombiner == Combiner::kMin || kCombiner == Combiner::kMax;
  constexpr bool kBitwise = !kArithmetic && !kOrdered;
  auto floating = [&](auto codec) -> int {
    using Codec = decltype(codec);
    using S = typename Codec::Storage;
    if constexpr (kBitwise) {
      return cudaErrorInvalidValue;
    } else {
      return Enqueue(n, [&](unsigned blocks) {
        FloatCombineKernel<Codec, kCombiner><<<blocks, kThreads, 0, s>>>(
            static_cast<S*>(out), static_cast<const S*>(a), static_cast<const S*>(b), n);
      });
    }
  };
  auto integer = [&](auto zero) -> int {
    using I = decltype(zero);
    return Enqueue(n, [&](unsigned blocks) {
      IntCombineKernel<I, kCombiner><<<blocks, kThreads, 0, s>>>(
          static_cast<I*>(out), static_cast<const I*>(a), static_cast<const I*>(b), n);
    });
  };
  auto complex = [&](auto zero) -> int {
    using R = decltype(zero);
    if constexpr (!kArithmetic) {
      return cudaErrorInvalidValue;
    } else {
      return Enqueue(n, [&](unsigned blocks) {
        ComplexCombineKernel<R, kCombiner><<<blocks, kThreads, 0, s>>>(
            static_cast<Complex<R>*>(out), static_cast<const Complex<R>*>(a),
            static_cast<const Complex<R>*>(b), n);
      });
    }
  };
  switch (dtype) {
    case DType::kFloat16:
      return floating(Half{});
    case DType::kBFloat16:
      return floating(BFloat16{});
    case DType::kFloat32:
      return floating(Plain<float>{});
    case DType::kFloat64:
      return floating(Plain<double>{});
    case DType::kInt8:
      return integer(int8_t{});
    case DType::kUInt8:
      return integer(uint8_t{});
    case DType::kInt16:
      return integer(int16_t{});
    case DType::kInt32:
      return integer(int32_t{});
    case DType::kInt64:
      return integer(int64_t{});
    case DType::kBool:
      return Enqueue(n, [&](unsigned blocks) {
        BoolCombineKernel<kCombiner><<<blocks, kThreads, 0, s>>>(static_cast<uint8_t*>(out),
                                                                 static_cast<const uint8_t*>(a),
                                                                 static_cast<const uint8_t*>(b), n);
      });
    case DType::kComplex64:
      return complex(float{});
    case DType::kComplex128:
      return complex(double{});
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

int Combine(Combiner combiner, DType dtype, void* out, const void* a, const void* b, size_t count,
            cudaStream_t stream) {
  switch (combiner) {
    case Combiner::kSum:
      return CombineAs<Combiner::kSum>(dtype, out, a, b, count, stream);
    case Combiner::kProduct:
      return CombineAs<Combiner::kProduct>(dtype, out, a, b, count, stream);
    case Combiner::kMin:
      return CombineAs<Combiner::kMin>(dtype, out, a, b, count, stream);
    case Combiner::kMax:
      return CombineAs<Combiner::kMax>(dtype, out, a, b, count, stream);
    case Combiner::kBand:
      return CombineAs<Combiner::kBand>(dtype, out, a, b, count, stream);
    case Combiner::kBor:
      return CombineAs<Combiner::kBor>(dtype, out, a, b, count, stream);
    case Combiner::kBxor:
      return CombineAs<Combiner::kBxor>(dtype, out, a, b, count, stream);
  }
  return cudaErrorInvalidValue;
}

namespace {

// Rescales the floating and complex dtypes (see RescaleKernel); float16, bfloat16, float32 and
// complex64 in float, the others in double.
int Rescale(DType dtype, void* data, size_t n, double value, bool divide, cudaStream_t s) {
  const float f = static_cast<float>(value);
  auto floating = [&](auto codec, auto v) -> int {
    using Codec = decltype(codec);
    using S = typename Codec::Storage;
    return Enqueue(n, [&](unsigned b) {
      RescaleKernel<Codec, decltype(v)><<<b, kThreads, 0, s>>>(static_cast<S*>(data), n, v, divide);
    });
  };
  auto complex = [&](auto zero, auto v) -> int {
    using R = decltype(zero);
    return Enqueue(n, [&](unsigned b) {
      ComplexScaleKernel<R, decltype(v)>
          <<<b, kThreads, 0, s>>>(static_cast<Complex<R>*>(data), n, v, divide);
    });
  };
  switch (dtype) {
    case DType::kFloat16:
      return floating(Half{}, f);
    case DType::kBFloat16:
      return floating(BFloat16{}, f);
    case DType::kFloat32:
      return floating(Plain<float>{}, f);
    case DType::kFloat64:
      return floating(Plain<double>{}, value);
    case DType::kComplex64:
      return complex(float{}, f);
    case DType::kComplex128:
      return complex(double{}, value);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

int Scale(DType dtype, void* data, size_t n, double factor, cudaStream_t s) {
  return Rescale(dtype, data, n, factor, /*divide=*/false, s);
}

int Divide(DType dtype, void* data, size_t n, int divisor, cudaStream_t s) {
  if (divisor < 1) return cudaErrorInvalidValue;
  auto integer = [&](auto zero) -> int {
    using I = decltype(zero);
    return Enqueue(n, [&](unsigned b) {
      DivideIntKernel<I><<<b, kThreads, 0, s>>>(static_cast<I*>(data), n, divisor);
    });
  };
  switch (dtype) {
    case DType::kInt8:
      return integer(int8_t{});
    case DType::kUInt8:
      return integer(uint8_t{});
    case DType::kInt16:
      return integer(int16_t{});
    case DType::kInt32:
      return integer(int32_t{});
    case DType::kInt64:
      return integer(int64_t{});
    default:
      return Rescale(dtype, data, n, divisor, /*divide=*/true, s);
  }
}

}  // namespace collectived::device_kernels
