// collectives_bench: nccl-tests style tables for allreduce, allgather (allgather_into_tensor),
// broadcast and reduce_scatter (reduce_scatter_tensor) of float32 through real collectived
// sidecars, on three topologies of 4 ranks:
//
//   1x4  one sidecar hosting all 4 ranks (everything is combined in shared memory)
//   4x1  four sidecars with one rank each (every byte crosses Gloo over loopback TCP)
//   2x2  two sidecars with two ranks each, interleaved (ranks 0, 2 on one; 1, 3 on the other)
//
// The program starts the sidecars itself: build/bin/collectived next to this binary (or
// --daemon PATH), each on a private Unix socket, a free loopback port (--listen 127.0.0.1:0,
// the bound port read back from Admin.GetInfo), --advertise 127.0.0.1 and no metrics endpoint.
// Ranks are threads of this process with one Client (session) each; tensors live in the
// rank's registered shared-memory buffer, so the sidecar works on them in place (the real data
// path, zero-copy). Ops are blocking: each is waited for before the next is issued.
//
// For every size: one op whose result is checked element by element (the #wrong column), a few
// warm-up ops, then `iters` timed ops. time = mean time per op, the maximum over the ranks;
// algbw = size / time; busbw = algbw x the nccl-tests factor (allreduce 2(n-1)/n, allgather and
// reduce_scatter (n-1)/n, broadcast 1). For allgather and reduce_scatter `size` is the whole
// gathered / scattered tensor (n x the per-rank part), as in nccl-tests; sizes are rounded up to
// a multiple of n elements. Sidecars are stopped (SIGTERM) at the end.
//
// Usage: collectives_bench [--quick] [--sizes LIST|MIN:MAX[:FACTOR]] [--iters N] [--warmup N]
//                          [--ops allreduce,allgather,broadcast,reduce_scatter]
//                          [--topologies 1x4,4x1,2x2] [--ranks N] [--daemon PATH]
//   --sizes 8,1K,32M     explicit sizes in bytes (suffixes K, M, G are powers of 1024)
//   --sizes 8:64M:4      8 B to 64 MiB in x4 steps, MAX included (default; --quick: 8:32M:8)
//   --iters N            timed ops per size (default: 50 up to 256 KiB, 20 up to 4 MiB, 10
//                        above; --quick: a quarter, at least 3)
//   --warmup N           untimed ops after the checked one (default 5 up to 4 MiB, 2 above;
//                        --quick: 1)
// Exit status: 0 when every op succeeded and every check passed, 1 otherwise.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_args.h"
#include "bench/bench_sidecar.h"
#include "clients/cpp/client.h"

namespace collectived {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Ops of a group fail on the sidecar after this long; waits give up a little later.
constexpr milliseconds kGroupTimeout{120000};
constexpr milliseconds kWaitSlack{15000};

enum class Op { kAllReduce, kAllGather, kBroadcast, kReduceScatter };

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "allreduce";
    case Op::kAllGather:
      return "allgather";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kReduceScatter:
      return "reduce_scatter";
  }
  return "?";
}

// What the table calls the op: the c10d function that runs it.
const char* OpCall(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "allreduce";
    case Op::kAllGather:
      return "allgather_into_tensor";
    case Op::kBroadcast:
      return "broadcast (root 0)";
    case Op::kReduceScatter:
      return "reduce_scatter_tensor";
  }
  return "?";
}

// nccl-tests' bus-bandwidth factors.
double BusFactor(Op op, int n) {
  switch (op) {
    case Op::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kReduceScatter:
      return static_cast<double>(n - 1) / n;
    case Op::kBroadcast:
      return 1.0;
  }
  return 1.0;
}

// A topology: which sidecar hosts each rank.
struct Topology {
  std::string name;
  std::string description;
  std::vector<int> sidecar_of_rank;
  int sidecars = 0;
};

Topology MakeTopology(const std::string& name, int n) {
  Topology t{name, "", std::vector<int>(n, 0), 1};
  if (name == "1x4" || name == "1xN") {
    t.description = "1 sidecar, " + std::to_string(n) + " ranks";
  } else if (name == "4x1" || name == "Nx1") {
    for (int r = 0; r < n; ++r) t.sidecar_of_rank[r] = r;
    t.sidecars = n;
    t.description = std::to_string(n) + " sidecars, 1 rank each";
  } else {  // 2x2: interleaved
    for (int r = 0; r < n; ++r) t.sidecar_of_rank[r] = r % 2;
    t.sidecars = n > 1 ? 2 : 1;
    t.description = "2 sidecars, " + std::to_string(n / 2) + " ranks each, interleaved";
  }
  return t;
}

struct Config {
  std::vector<size_t> sizes;
  int iters = 0;    // 0: by size
  int warmup = -1;  // -1: by size
  bool quick = false;
  std::vector<Op> ops{Op::kAllReduce, Op::kAllGather, Op::kBroadcast, Op::kReduceScatter};
  std::vector<std::string> topologies{"1x4", "4x1", "2x2"};
  int ranks = 4;
  std::string daemon;
  std::vector<std::string> sidecar_args;  // extra flags for every sidecar (--sidecar-arg)
};

int ItersFor(size_t bytes, const Config& config) {
  if (config.iters > 0) return config.iters;
  int iters = bytes <= (256u << 10) ? 50 : bytes <= (4u << 20) ? 20 : 10;
  return config.quick ? std::max(3, iters / 4) : iters;
}

int WarmupFor(size_t bytes, const Config& config) {
  if (config.warmup >= 0) return config.warmup;
  if (config.quick) return 1;
  return bytes <= (4u << 20) ? 5 : 2;
}

// The element counts of one row: `count` is what the table shows (the whole tensor), `part`
// the per-rank part of allgather / reduce_scatter (count / n).
struct Shape {
  size_t count = 0;
  size_t part = 0;
};

Shape ShapeFor(Op op, size_t bytes, int n) {
  size_t elements = std::max<size_t>(1, bytes / sizeof(float));
  if (op == Op::kAllGather || op == Op::kReduceScatter) {
    size_t part = std::max<size_t>(1, elements / n);
    return {part * n, part};
  }
  return {elements, elements};
}

// ---- one rank --------------------------------------------------------------------------------

// Values that stay exact in float32 when summed over a few ranks.
inline float Value(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
}
// Sum over ranks 0..n-1 of Value(rank, i).
inline float SumOfValues(int n, size_t i) {
  return static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 13 + 1));
}

// Per-rank state of one (op, size) row, read by rank 0 after a barrier.
struct RankResult {
  double seconds = 0;  // mean per timed op
  size_t wrong = 0;
  Status status;
};

// What the rank threads of one topology share. results[r] is written by rank r before the first
// barrier of a row and read by rank 0 between the two; `stop` is set by rank 0 there.
struct Shared {
  explicit Shared(int n) : sync(n), results(n) {}
  std::barrier<> sync;
  std::vector<RankResult> results;
  std::atomic<bool> failed{false};  // something failed: the run's exit status is 1
  std::atomic<bool> stop{false};    // an op failed: the group is unusable, every rank leaves
};

class Rank {
 public:
  Rank(int rank, int n, const Config& config) : rank_(rank), n_(n), config_(config) {}

  // Connects to `address` and allocates the shared-memory buffer for the largest row.
  Status Setup(const std::string& address, size_t max_bytes) {
    ClientOptions options;
    options.address = address;
    options.client_name = "collectives_bench rank " + std::to_string(rank_);
    options.wait_for_sidecar = true;
    auto client = Client::Connect(options);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
    // Inputs at 0, outputs at out_offset_ (page aligned); each up to max_bytes + n elements.
    size_t room = max_bytes + n_ * sizeof(float);
    out_offset_ = (room + 4095) / 4096 * 4096;
    auto buffer = client_->AllocateBuffer(out_offset_ + room);
    if (!buffer.ok()) return buffer.status();
    buffer_ = *buffer;
    return Status::Ok();
  }

  Status Join(const std::string& group, const std::string& store) {
    GroupOptions options;
    options.name = group;
    options.rank = rank_;
    options.world_size = n_;
    options.store_address = store;
    options.timeout = kGroupTimeout;
    auto info = client_->CreateGroup(options);
    if (!info.ok()) return info.status();
    group_ = group;
    return Status::Ok();
  }

  void Leave() {
    if (!group_.empty()) (void)client_->DestroyGroup(group_);
    group_.clear();
  }

  // Runs one row: checked op, warm-up, timed ops.
  RankResult Row(Op op, size_t bytes) {
    RankResult result;
    const Shape shape = ShapeFor(op, bytes, n_);
    Fill(op, shape);
    result.status = Issue(op, shape);
    if (!result.status.ok()) return result;
    result.wrong = Check(op, shape);
    // In-place allreduce would grow the values without bound over the timed ops: start at 0.
    if (op == Op::kAllReduce) std::memset(buffer_->data(), 0, shape.count * sizeof(float));
    for (int i = 0; i < WarmupFor(bytes, config_); ++i) {
      result.status = Issue(op, shape);
      if (!result.status.ok()) return result;
    }
    const int iters = ItersFor(bytes, config_);
    auto start = Clock::now();
    for (int i = 0; i < iters; ++i) {
      result.status = Issue(op, shape);
      if (!result.status.ok()) return result;
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - start).count() / iters;
    return result;
  }

 private:
  float* In() const { return reinterpret_cast<float*>(buffer_->data()); }
  float* Out() const { return reinterpret_cast<float*>(buffer_->data() + out_offset_); }
  ClientTensor InTensor(size_t count) const {
    return ClientTensor::Shm(*buffer_, 0, DType::kFloat32, count);
  }
  ClientTensor OutTensor(size_t count) const {
    return ClientTensor::Shm(*buffer_, out_offset_, DType::kFloat32, count);
  }

  Status Issue(Op op, const Shape& shape) {
    std::shared_ptr<ClientWork> work;
    switch (op) {
      case Op::kAllReduce:
        work = client_->AllReduce(group_, InTensor(shape.count), ReduceOp::Sum());
        break;
      case Op::kAllGather:
        work = client_->AllGatherIntoTensor(group_, InTensor(shape.part), OutTensor(shape.count));
        break;
      case Op::kBroadcast:
        work = client_->Broadcast(group_, InTensor(shape.count), /*root=*/0);
        break;
      case Op::kReduceScatter:
        work = client_->ReduceScatterTensor(group_, InTensor(shape.count), OutTensor(shape.part),
                                            ReduceOp::Sum());
        break;
    }
    return work->Wait(kGroupTimeout + kWaitSlack);
  }

  void Fill(Op op, const Shape& shape) {
    float* in = In();
    float* out = Out();
    switch (op) {
      case Op::kAllReduce:
      case Op::kReduceScatter:
        for (size_t i = 0; i < shape.count; ++i) in[i] = Value(rank_, i);
        if (op == Op::kReduceScatter) std::fill(out, out + shape.part, -1.0f);
        break;
      case Op::kAllGather:
        for (size_t i = 0; i < shape.part; ++i) in[i] = Value(rank_, i);
        std::fill(out, out + shape.count, -1.0f);
        break;
      case Op::kBroadcast:
        for (size_t i = 0; i < shape.count; ++i) in[i] = rank_ == 0 ? Value(0, i) : -1.0f;
        break;
    }
  }

  size_t Check(Op op, const Shape& shape) const {
    const float* in = In();
    const float* out = Out();
    size_t wrong = 0;
    switch (op) {
      case Op::kAllReduce:
        for (size_t i = 0; i < shape.count; ++i) wrong += in[i] != SumOfValues(n_, i);
        break;
      case Op::kAllGather:
        for (int r = 0; r < n_; ++r) {
          for (size_t i = 0; i < shape.part; ++i) wrong += out[r * shape.part + i] != Value(r, i);
        }
        break;
      case Op::kBroadcast:
        for (size_t i = 0; i < shape.count; ++i) wrong += in[i] != Value(0, i);
        break;
      case Op::kReduceScatter:
        for (size_t i = 0; i < shape.part; ++i) {
          wrong += out[i] != SumOfValues(n_, rank_ * shape.part + i);
        }
        break;
    }
    return wrong;
  }

  const int rank_;
  const int n_;
  const Config& config_;
  std::unique_ptr<Client> client_;
  const RegisteredBuffer* buffer_ = nullptr;
  size_t out_offset_ = 0;
  std::string group_;
};

// ---- tables ----------------------------------------------------------------------------------

void PrintTableHeader(Op op, const Topology& topology, int n) {
  std::printf("\n# collectived | %s | %s | %s, float32%s, %d ranks\n", OpName(op),
              topology.name.c_str(), topology.description.c_str(),
              op == Op::kAllReduce || op == Op::kReduceScatter ? ", sum" : "", n);
  std::printf("# op: %s; time = mean per op (max over ranks); busbw factor %.3f\n", OpCall(op),
              BusFactor(op, n));
  std::printf("#%11s %13s %9s %7s %5s %11s %9s %9s %7s %6s\n", "size", "count", "type", "redop",
              "root", "time", "algbw", "busbw", "#wrong", "iters");
  std::printf("#%11s %13s %9s %7s %5s %11s %9s %9s %7s %6s\n", "(B)", "(elements)", "", "", "",
              "(us)", "(GB/s)", "(GB/s)", "", "");
  std::fflush(stdout);
}

// Returns false when the row failed (an op error or wrong results).
bool PrintRow(Op op, size_t bytes, int n, const Config& config,
              const std::vector<RankResult>& results) {
  const Shape shape = ShapeFor(op, bytes, n);
  const size_t size = shape.count * sizeof(float);
  const char* redop = op == Op::kAllReduce || op == Op::kReduceScatter ? "sum" : "none";
  const int root = op == Op::kBroadcast ? 0 : -1;
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].status.ok()) {
      std::printf("%12zu %13zu %9s %7s %5d   error on rank %zu: %s\n", size, shape.count, "float",
                  redop, root, r, results[r].status.ToString().c_str());
      std::fflush(stdout);
      return false;
    }
  }
  double seconds = 0;
  size_t wrong = 0;
  for (const RankResult& r : results) {
    seconds = std::max(seconds, r.seconds);
    wrong += r.wrong;
  }
  double algbw = size / seconds / 1e9;
  std::printf("%12zu %13zu %9s %7s %5d %11.1f %9.3f %9.3f %7zu %6d\n", size, shape.count, "float",
              redop, root, seconds * 1e6, algbw, algbw * BusFactor(op, n), wrong,
              ItersFor(bytes, config));
  std::fflush(stdout);
  return wrong == 0;
}

// Runs every op and size on one topology. Returns false if anything failed.
bool RunTopology(const Topology& topology, const std::vector<SidecarProcess>& sidecars,
                 const Config& config) {
  const int n = config.ranks;
  size_t max_bytes = 0;
  for (size_t s : config.sizes) max_bytes = std::max(max_bytes, s);
  const std::string group = "bench-" + std::to_string(getpid()) + "-" + topology.name;
  const std::string store = sidecars[0].tcp_address;

  Shared shared(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      Rank rank(r, n, config);
      // Phase 1: sessions and buffers; phase 2: the group. A failure stops every rank.
      Status status = rank.Setup(sidecars[topology.sidecar_of_rank[r]].unix_address, max_bytes);
      if (!status.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", r, status.ToString().c_str());
        shared.failed = true;
      }
      shared.sync.arrive_and_wait();
      if (shared.failed) return;
      status = rank.Join(group, store);
      if (!status.ok()) {
        std::fprintf(stderr, "rank %d: CreateGroup: %s\n", r, status.ToString().c_str());
        shared.failed = true;
      }
      shared.sync.arrive_and_wait();
      if (shared.failed) return;
      for (Op op : config.ops) {
        if (r == 0) PrintTableHeader(op, topology, n);
        for (size_t bytes : config.sizes) {
          shared.results[r] = rank.Row(op, bytes);
          shared.sync.arrive_and_wait();
          if (r == 0) {
            if (!PrintRow(op, bytes, n, config, shared.results)) shared.failed = true;
            // An op error leaves the group failed: nothing more can run on it.
            for (const RankResult& result : shared.results) {
              if (!result.status.ok()) shared.stop = true;
            }
          }
          shared.sync.arrive_and_wait();
          if (shared.stop) {
            rank.Leave();
            return;
          }
        }
      }
      rank.Leave();
    });
  }
  for (std::thread& t : threads) t.join();
  return !shared.failed;
}

int Usage(const char* message) {
  std::fprintf(
      stderr,
      "collectives_bench: %s\nusage: collectives_bench [--quick] [--sizes LIST|MIN:MAX[:F]] "
      "[--iters N] [--warmup N] [--ops allreduce,allgather,broadcast,reduce_scatter] "
      "[--topologies 1x4,4x1,2x2] [--ranks N] [--daemon PATH] [--sidecar-arg ARG]...\n",
      message);
  return 2;
}

int Main(int argc, char** argv) {
  Config config;
  std::string sizes_text;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (flag == "--quick") {
      config.quick = true;
    } else if (flag == "--help" || flag == "-h") {
      Usage("nccl-tests style tables of collectived collectives");
      return 0;
    } else if (flag == "--sizes") {
      sizes_text = value();
    } else if (flag == "--iters") {
      config.iters = std::atoi(value().c_str());
      if (config.iters <= 0) return Usage("--iters needs a positive integer");
    } else if (flag == "--warmup") {
      std::string text = value();
      config.warmup = std::atoi(text.c_str());
      if (text.empty() || config.warmup < 0) return Usage("--warmup needs a non-negative integer");
    } else if (flag == "--ranks") {
      config.ranks = std::atoi(value().c_str());
      if (config.ranks < 2 || config.ranks % 2) return Usage("--ranks needs an even number >= 2");
    } else if (flag == "--sidecar-arg") {
      config.sidecar_args.push_back(value());
    } else if (flag == "--daemon") {
      config.daemon = value();
    } else if (flag == "--ops") {
      config.ops.clear();
      for (const std::string& name : Split(value(), ',')) {
        bool known = false;
        for (Op op : {Op::kAllReduce, Op::kAllGather, Op::kBroadcast, Op::kReduceScatter}) {
          if (name == OpName(op)) {
            config.ops.push_back(op);
            known = true;
          }
        }
        if (!known) return Usage(("unknown op '" + name + "'").c_str());
      }
    } else if (flag == "--topologies") {
      config.topologies = Split(value(), ',');
      for (const std::string& t : config.topologies) {
        if (t != "1x4" && t != "4x1" && t != "2x2") {
          return Usage(("unknown topology '" + t + "' (1x4, 4x1, 2x2)").c_str());
        }
      }
    } else {
      return Usage(("unknown flag '" + flag + "'").c_str());
    }
  }
  if (sizes_text.empty()) sizes_text = config.quick ? "8:32M:8" : "8:64M:4";
  config.sizes = ParseSizes(sizes_text);
  if (config.sizes.empty()) return Usage(("bad --sizes '" + sizes_text + "'").c_str());
  if (config.daemon.empty()) config.daemon = SelfDirectory() + "/collectived";
  if (access(config.daemon.c_str(), X_OK) != 0) {
    std::fprintf(stderr, "collectives_bench: no collectived at %s (use --daemon PATH)\n",
                 config.daemon.c_str());
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);

  char dir_template[] = "/tmp/cdbench-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = dir_template;
  int sidecars_needed = 1;
  for (const std::string& t : config.topologies) {
    sidecars_needed = std::max(sidecars_needed, MakeTopology(t, config.ranks).sidecars);
  }
  std::vector<SidecarProcess> sidecars;
  bool ok = true;
  for (int i = 0; i < sidecars_needed && ok; ++i) {
    auto side = SpawnSidecar(config.daemon, dir, i, config.sidecar_args);
    if (!side.ok()) {
      std::fprintf(stderr, "collectives_bench: sidecar %d: %s\n", i,
                   side.status().ToString().c_str());
      ok = false;
      break;
    }
    sidecars.push_back(*side);
  }

  if (ok) {
    std::printf(
        "# collectived collectives_bench: %d ranks (threads, one session each, shm tensors), "
        "float32, %zu sizes %zu B .. %zu B, blocking ops\n",
        config.ranks, config.sizes.size(), config.sizes.front(), config.sizes.back());
    std::printf("# sidecars: %zu x %s (private sockets in %s, loopback TCP), %u CPUs\n",
                sidecars.size(), config.daemon.c_str(), dir.c_str(),
                std::thread::hardware_concurrency());
    auto start = Clock::now();
    for (const std::string& name : config.topologies) {
      Topology topology = MakeTopology(name, config.ranks);
      std::vector<SidecarProcess> used(sidecars.begin(), sidecars.begin() + topology.sidecars);
      if (!RunTopology(topology, used, config)) ok = false;
    }
    std::printf("\n# total time %.1f s\n",
                std::chrono::duration<double>(Clock::now() - start).count());
  }

  bool clean = true;
  for (SidecarProcess& side : sidecars) {
    int code = StopSidecar(side);
    if (code != 0) {
      std::fprintf(stderr, "collectives_bench: sidecar %s exited with %d; log:\n%s\n",
                   side.unix_address.c_str(), code, ReadFile(side.log_path).c_str());
      clean = false;
    }
  }
  if (ok && clean) {
    std::error_code error;
    std::filesystem::remove_all(dir, error);
  } else {
    std::fprintf(stderr, "collectives_bench: FAILED; sidecar logs kept in %s\n", dir.c_str());
  }
  return ok && clean ? 0 : 1;
}

}  // namespace
}  // namespace collectived

int main(int argc, char** argv) {
  return collectived::Main(argc, argv);
}
