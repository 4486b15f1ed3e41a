// Throughput of the reduction kernels against memcpy, on the same buffers.
//
// What is measured: out = a (op) b with out aliasing a, which is how the engine uses the kernels
// (an accumulator combined in place with an incoming contribution), on buffers of 64 KiB each
// (in cache) and 64 MiB each (well beyond the 32 MiB L3 of the machines we run on).
//
// How bytes are counted: bytes the CPU reads plus bytes it writes, for both contenders.
//   kernel:  reads a and b, writes a       -> 3 * n * sizeof(element) per iteration
//   memcpy:  reads b, writes a             -> 2 * n * sizeof(element) per iteration
// This is also the DRAM traffic of each, which is what bounds them on large buffers: the kernel
// stores into lines it has just loaded (no extra read-for-ownership), and glibc's memcpy uses
// non-temporal stores for copies this large (no read-for-ownership either). Counting only the
// `n * sizeof(element)` bytes "reduced" would make the kernel look 3x slower than the memory
// system it saturates; counting memcpy as 1x would flatter the kernel by 2x.
//
// Fairness: memcpy runs on the very buffers the kernel uses (dst = a, src = b), already faulted
// in and warm, with the same alignment (4 KiB), single-threaded, timed by wall clock in both
// cases. Each kernel benchmark also times memcpy on its own buffers right after its timed loop,
// for as many iterations, and reports:
//   bytes_per_second        the kernel (Google Benchmark's own, from real time)
//   memcpy_bytes_per_second memcpy on the same buffers, counted as above
//   pct_of_memcpy           100 * kernel bytes/s / memcpy bytes/s, both from the same clock
// The BM_Memcpy rows give the plain memcpy figures beside them.
//
// Target: float32 SUM on 64 MiB buffers at >= 70% of memcpy's bytes/s.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/reduce_kernels.h"
#include "engine/vocabulary/reduce_op.h"

namespace collectived {
namespace {

constexpr int64_t kInCache = int64_t{64} << 10;
constexpr int64_t kBeyondCache = int64_t{64} << 20;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

// A page-aligned buffer whose every page is faulted in, filled with the value 1 of `dtype`
// (a value whose repeated sums and maxima stay finite and normal: no denormal slow paths).
Buffer MakeBuffer(DType dtype, size_t bytes) {
  Buffer buffer(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)));
  const size_t size = DTypeSize(dtype);
  uint8_t one[8] = {};
  switch (dtype) {
    case DType::kFloat16: {
      const uint16_t h = FloatToHalf(1.0f);
      std::memcpy(one, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t h = FloatToBFloat16(1.0f);
      std::memcpy(one, &h, 2);
      break;
    }
    case DType::kFloat32: {
      const float f = 1.0f;
      std::memcpy(one, &f, 4);
      break;
    }
    case DType::kInt64: {
      const int64_t i = 1;
      std::memcpy(one, &i, 8);
      break;
    }
    default:
      std::abort();  // only the dtypes registered below
  }
  for (size_t offset = 0; offset < bytes; offset += size)
    std::memcpy(buffer.get() + offset, one, size);
  return buffer;
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

void BM_Reduce(benchmark::State& state, ReduceOpKind kind, DType dtype) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / DTypeSize(dtype);
  StatusOr<CombineFn> fn_or = CombineFunction(ReduceOp{kind, 1.0}, dtype);
  if (!fn_or.ok()) {
    state.SkipWithError(fn_or.status().ToString().c_str());
    return;
  }
  const CombineFn fn = *fn_or;
  Buffer a = MakeBuffer(dtype, bytes);
  Buffer b = MakeBuffer(dtype, bytes);
  fn(a.get(), a.get(), b.get(), count);  // warm up: caches, TLB, branch predictors

  const auto kernel_start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    fn(a.get(), a.get(), b.get(), count);
    benchmark::ClobberMemory();
  }
  const double kernel_seconds = Seconds(std::chrono::steady_clock::now() - kernel_start);
  const auto iterations = static_cast<int64_t>(state.iterations());
  state.SetBytesProcessed(iterations * 3 * static_cast<int64_t>(bytes));

  // The baseline, untimed by the framework: memcpy on the same buffers, as many times.
  std::memcpy(a.get(), b.get(), bytes);
  const auto memcpy_start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    std::memcpy(a.get(), b.get(), bytes);
    benchmark::ClobberMemory();
  }
  const double memcpy_seconds = Seconds(std::chrono::steady_clock::now() - memcpy_start);

  const double kernel_rate = 3.0 * static_cast<double>(bytes) * iterations / kernel_seconds;
  const double memcpy_rate = 2.0 * static_cast<double>(bytes) * iterations / memcpy_seconds;
  state.counters["memcpy_bytes_per_second"] =
      benchmark::Counter(memcpy_rate, benchmark::Counter::kDefaults, benchmark::Counter::kIs1024);
  state.counters["pct_of_memcpy"] = benchmark::Counter(100.0 * kernel_rate / memcpy_rate);
}

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  Buffer a = MakeBuffer(DType::kFloat32, bytes);
  Buffer b = MakeBuffer(DType::kFloat32, bytes);
  std::memcpy(a.get(), b.get(), bytes);
  for (auto _ : state) {
    std::memcpy(a.get(), b.get(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 *
                          static_cast<int64_t>(bytes));
}

void Sizes(benchmark::internal::Benchmark* b) {
  b->ArgName("bytes")->Arg(kInCache)->Arg(kBeyondCache)->UseRealTime();
}

BENCHMARK(BM_Memcpy)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Reduce, float32_sum, ReduceOpKind::kSum, DType::kFloat32)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Reduce, bfloat16_sum, ReduceOpKind::kSum, DType::kBFloat16)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Reduce, float16_sum, ReduceOpKind::kSum, DType::kFloat16)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Reduce, int64_sum, ReduceOpKind::kSum, DType::kInt64)->Apply(Sizes);
BENCHMARK_CAPTURE(BM_Reduce, float32_max, ReduceOpKind::kMax, DType::kFloat32)->Apply(Sizes);

}  // namespace
}  // namespace collectived

BENCHMARK_MAIN();
