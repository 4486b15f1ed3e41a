// gpu_allreduce_bench: the sidecar's GPU path against in-process NCCL, on GPU 0 of this machine.
//
//   nccl   the anchor: ncclCommInitAll over {0} (world size 1) in this process, ncclAllReduce
//          (float32, SUM) in place on a cudaMalloc'd buffer, on a stream of its own.
//   cd w=1 one trainer (a Client of a sidecar this program starts) in a CUDA group of 1: the
//          tensor is shared with the sidecar through CUDA IPC, the sidecar works on it in place.
//   cd w=2 two trainers (two Clients, one thread each) sharing GPU 0 on that sidecar, which
//          combines their tensors on the GPU.
//
//   kern w=2 the anchor of the two-trainer path, since no NCCL can have two ranks on one GPU:
//          what that path must do at least, in this process with no IPC and no sidecar (the
//          same combine kernel over the two buffers, then a device-to-device copy of the sum to
//          the second), on one stream.
//
// For every size (8 B to 1 GiB in x4 steps by default): one op whose result is checked, a few
// warm-up ops, then `rounds` rounds of `iters` ops, each waited for before the next (the
// trainer's Wait(); the anchor's cudaStreamSynchronize). time = median over the rounds of the
// mean time per op; algbw = size / time; busbw = algbw x 2(n-1)/n (0 at world size 1, where
// algbw is the figure to compare). "overhead" is a row's time minus its anchor's (nccl for the
// world size 1 rows, kern for the world size 2 rows) and "ratio" the anchor's time over the row's.
// At world size 1 an in-place ncclAllReduce moves no data, so that anchor is NCCL's launch cost
// alone and the overhead column is the sidecar path's whole fixed cost.
//
// Then the two-trainer path in flight: for every size from 1 MiB, both trainers issue N
// allreduces back to back, each followed by a stream-ordered wait (on stream-signal words, then
// by the event path), and then all N before any wait (queued: as nccl-tests times NCCL and as
// DDP issues its buckets), and drain their streams once, against the in-process combine issued
// N times on one stream; each round's result is checked. The table above waits for every op, so it
// shows the sidecar's fixed cost whole; this one shows what of it the GPU cannot overlap (the
// issue's busbw target is this way of timing).
//
// Then: where the fixed cost of an 8 B op goes (the trainer's export of the tensor, the same op
// on a CPU group of the same sidecar, the CUDA op; medians of 200); the cost of a CUDA IPC
// handle the sidecar opens for the first time (an 8 B allreduce on a freshly allocated buffer)
// against a cached one (the same buffer again), medians of 20; where an allreduce's time goes
// on the sidecar for two trainers at 8 B and 64 MiB (its flight recorder's stages: arrival and
// agreement, enqueueing, the GPU, concluding; the rest is the request and response); and
// the overlap penalty: a compute kernel (the device kernels' combine over 256 MiB, repeated) and
// a 64 MiB allreduce issued together, time of both over the longer of the two alone, for
// in-process NCCL (a second stream) and for the sidecar (another process's CUDA context: without
// MPS its kernels time-slice with the trainer's instead of running beside them).
//
// Then back to back (the torch benchmark's (c) without Python): 1,000 allreduces of 1 MiB at
// world size 1, each followed by a stream-ordered wait, by the event path and by stream signals,
// against in-process NCCL issuing the same; and a CPU group's ops submitted back to back, the
// floor of the sidecar and the client with no GPU work.
//
// Usage: gpu_allreduce_bench [--sizes LIST|MIN:MAX[:F]] [--rounds N] [--iters N] [--daemon P]
// Exit status: 0 when every op succeeded and every check passed; 1 otherwise; 2 when there is no
// usable GPU (nothing measured).
#include <cuda_runtime_api.h>
#include <grpcpp/grpcpp.h>
#include <nccl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_args.h"
#include "bench/bench_sidecar.h"
#include "clients/cpp/client.h"
#include "clients/cpp/cuda_tensor_export.h"
#include "collectived/v1/admin.grpc.pb.h"
#include "engine/cuda/device_combiner.h"
#include "engine/cuda/device_kernels.h"
#include "engine/cuda/gpu_inventory.h"

namespace collectived {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kOpTimeout{120000};
constexpr size_t kOverlapBytes = size_t{64} << 20;
constexpr size_t kComputeBytes = size_t{256} << 20;
constexpr int kBreakdownOps = 50;

struct Config {
  std::vector<size_t> sizes;
  int rounds = 5;
  int iters = 0;  // 0: by size
  std::string daemon;
};

double Seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

bool Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return true;
  std::fprintf(stderr, "gpu_allreduce_bench: %s: %s\n", what, cudaGetErrorString(error));
  return false;
}

bool Check(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return true;
  std::fprintf(stderr, "gpu_allreduce_bench: %s: %s\n", what, ncclGetErrorString(result));
  return false;
}

int ItersFor(const Config& config, size_t bytes) {
  if (config.iters > 0) return config.iters;
  return bytes <= (size_t{1} << 20) ? 50 : bytes <= (size_t{64} << 20) ? 10 : 3;
}

// A device buffer of `bytes` bytes holding float32 `value` everywhere.
struct DeviceBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  ~DeviceBuffer() {
    if (data != nullptr) cudaFree(data);
  }
  bool Fill(float value) {
    std::vector<float> host(bytes / sizeof(float), value);
    return Check(cudaMemcpy(data, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
                 "cudaMemcpy");
  }
  // A device-to-device cudaMemcpy may return before the copy ran, and the streams of the
  // benchmark do not wait for the default stream: the device is drained before returning.
  bool CopyFrom(const DeviceBuffer& other) {
    return Check(cudaMemcpy(data, other.data, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy") &&
           Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  }
  // Whether every element is `expected`; past `limit` bytes, every element of the first and
  // the last `limit` / 2 bytes (reading back a GiB would take longer than the ops measured).
  bool Holds(float expected, size_t limit = SIZE_MAX) const {
    const size_t count = bytes / sizeof(float);
    size_t front = count, back = 0;  // the elements checked: the first `front`, the last `back`
    if (count * sizeof(float) > limit) front = back = limit / sizeof(float) / 2;
    std::vector<float> host(front + back);
    auto* base = static_cast<std::byte*>(data);
    if (!Check(cudaMemcpy(host.data(), base, front * sizeof(float), cudaMemcpyDeviceToHost),
               "cudaMemcpy") ||
        !Check(cudaMemcpy(host.data() + front, base + (count - back) * sizeof(float),
                          back * sizeof(float), cudaMemcpyDeviceToHost),
               "cudaMemcpy")) {
      return false;
    }
    return std::all_of(host.begin(), host.end(), [&](float v) { return v == expected; });
  }
};

std::unique_ptr<DeviceBuffer> Allocate(size_t bytes) {
  auto buffer = std::make_unique<DeviceBuffer>();
  buffer->bytes = std::max<size_t>(bytes, sizeof(float));
  if (!Check(cudaMalloc(&buffer->data, buffer->bytes), "cudaMalloc")) return nullptr;
  return buffer;
}

// ---- the anchor: in-process NCCL at world size 1 -----------------------------------------

struct Anchor {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;

  bool Start() {
    int devices[1] = {0};
    return Check(ncclCommInitAll(&comm, 1, devices), "ncclCommInitAll") &&
           Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Anchor() {
    if (comm != nullptr) ncclCommDestroy(comm);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  bool Enqueue(DeviceBuffer& buffer) {
    return Check(ncclAllReduce(buffer.data, buffer.data, buffer.bytes / sizeof(float), ncclFloat,
                               ncclSum, comm, stream),
                 "ncclAllReduce");
  }
  bool AllReduce(DeviceBuffer& buffer) {
    return Enqueue(buffer) && Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
};

// ---- the anchor of two trainers sharing a GPU: the combine and copy alone, in process -----

struct LocalCombine {
  cudaStream_t stream = nullptr;
  bool Start() {
    return Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~LocalCombine() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  // pair[0] = pair[0] + pair[1]; pair[1] = pair[0], enqueued.
  bool Enqueue(std::vector<std::unique_ptr<DeviceBuffer>>& pair) {
    const size_t count = pair[0]->bytes / sizeof(float);
    const int launched =
        device_kernels::Combine(device_kernels::CombinerOf(ReduceOpKind::kSum), DType::kFloat32,
                                pair[0]->data, pair[0]->data, pair[1]->data, count, stream);
    return Check(static_cast<cudaError_t>(launched), "combine kernel") &&
           Check(cudaMemcpyAsync(pair[1]->data, pair[0]->data, pair[0]->bytes,
                                 cudaMemcpyDeviceToDevice, stream),
                 "cudaMemcpyAsync");
  }
  bool AllReduce(std::vector<std::unique_ptr<DeviceBuffer>>& pair) {
    return Enqueue(pair) && Check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
};

// ---- the sidecar path -------------------------------------------------------------------

struct Trainers {
  std::vector<std::unique_ptr<Client>> clients;
  std::string group;

  // `stream_signals`: the clients' WaitStream waits on stream-signal words (ClientOptions).
  // `timeout`: the group's (its ops').
  bool Start(const std::string& address, int world, const std::string& name,
             bool stream_signals = false, milliseconds timeout = kOpTimeout) {
    group = name;
    for (int rank = 0; rank < world; ++rank) {
      ClientOptions options;
      options.address = address;
      options.client_name = "gpu bench rank " + std::to_string(rank);
      options.stream_signals = stream_signals;
      auto client = Client::Connect(options);
      if (!client.ok()) {
        std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
        return false;
      }
      clients.push_back(std::move(*client));
    }
    std::vector<Status> created(world);
    std::vector<std::thread> threads;
    for (int rank = 0; rank < world; ++rank) {
      threads.emplace_back([&, rank] {
        GroupOptions options;
        options.name = name;
        options.rank = rank;
        options.world_size = world;
        options.timeout = timeout;
        options.cuda_device = 0;
        auto info = clients[rank]->CreateGroup(options);
        created[rank] = info.ok() ? Status::Ok() : info.status();
      });
    }
    for (auto& thread : threads) thread.join();
    for (const Status& status : created) {
      if (!status.ok()) {
        std::fprintf(stderr, "create CUDA group: %s\n", status.ToString().c_str());
        return false;
      }
    }
    return true;
  }

  // One allreduce on every trainer at once (buffer per rank), waited for.
  bool AllReduce(std::vector<std::unique_ptr<DeviceBuffer>>& buffers) {
    std::vector<std::shared_ptr<ClientWork>> works;
    for (size_t rank = 0; rank < clients.size(); ++rank) {
      works.push_back(clients[rank]->AllReduce(
          group, ClientTensor::Cuda(buffers[rank]->data, 0, DType::kFloat32,
                                    buffers[rank]->bytes / sizeof(float))));
    }
    bool ok = true;
    for (auto& work : works) {
      Status status = work->Wait(kOpTimeout);
      if (!status.ok()) {
        std::fprintf(stderr, "allreduce: %s\n", status.ToString().c_str());
        ok = false;
      }
    }
    return ok;
  }
};

// ---- back to back: ops issued with no CPU wait for their results -------------------------

// `ops` 8 B inline allreduces on a CPU group, each submitted without waiting, then all waited
// for: the sidecar's and the client's floor per op, with no GPU work and no CUDA call.
double BackToBackOnHost(Client& client, const std::string& group, int ops, bool* ok) {
  std::vector<std::shared_ptr<ClientWork>> works;
  works.reserve(ops);
  std::vector<float> values(2 * static_cast<size_t>(ops), 1.0f);
  const auto start = Clock::now();
  for (int i = 0; i < ops; ++i) {
    works.push_back(
        client.AllReduce(group, ClientTensor::Inline(&values[2 * i], DType::kFloat32, 2)));
  }
  for (auto& work : works) {
    Status status = work->Wait(kOpTimeout);
    if (!status.ok() && *ok) {
      std::fprintf(stderr, "back to back on a CPU group: %s\n", status.ToString().c_str());
      *ok = false;
    }
  }
  return Seconds(Clock::now() - start) / ops;
}

// Where back-to-back ops went at the sidecar: from the last 256 flight records of `group`, the
// median time from one op reaching each stage (arrived, started: agreed; enqueued on the stream,
// gpu done, completed) to the next op reaching it. The stage whose interval matches the time per
// op bounds it: arrived (the trainer's issue), enqueued (the sidecar's CPU), gpu done (the GPU,
// the streams' chain). Prints why where the records cannot be read.
void PrintPacing(const std::string& address, const std::string& group, const char* label) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto admin = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  v1::GetFlightRecorderRequest request;
  request.set_group(group);
  request.set_limit(256);
  v1::FlightRecorder records;
  const grpc::Status read = admin->GetFlightRecorder(&context, request, &records);
  std::vector<v1::OpRecord> ops;
  for (const v1::OpRecord& op : records.ops()) {
    if (op.state() == "completed" && op.enqueued_us() >= 0 && op.device_done_us() >= 0) {
      ops.push_back(op);
    }
  }
  if (!read.ok() || ops.size() < 2) {
    std::printf("%s at the sidecar: not read (%s, %zu completed CUDA records)\n", label,
                read.ok() ? "ok" : read.error_message().c_str(), ops.size());
    return;
  }
  std::sort(ops.begin(), ops.end(), [](const v1::OpRecord& a, const v1::OpRecord& b) {
    return a.sequence_number() < b.sequence_number();
  });
  auto interval = [&ops](int64_t (*after)(const v1::OpRecord&)) {
    std::vector<double> gaps;
    for (size_t i = 1; i < ops.size(); ++i) {
      gaps.push_back(static_cast<double>((ops[i].issued_unix_us() + after(ops[i])) -
                                         (ops[i - 1].issued_unix_us() + after(ops[i - 1]))));
    }
    return Median(gaps);
  };
  std::printf(
      "%s at the sidecar (%zu ops), us from one op to the next: arrived %.1f, started %.1f, "
      "enqueued %.1f, gpu done %.1f, completed %.1f\n",
      label, ops.size(), interval([](const v1::OpRecord&) -> int64_t { return 0; }),
      interval([](const v1::OpRecord& op) { return op.data_started_us(); }),
      interval([](const v1::OpRecord& op) { return op.enqueued_us(); }),
      interval([](const v1::OpRecord& op) { return op.device_done_us(); }),
      interval([](const v1::OpRecord& op) { return op.duration_us(); }));
}

// `ops` allreduces of `trainers` (sharing the GPU), in flight as a trainer keeps them: each
// trainer, on a thread of its own, issues its ops back to back on its stream (buffer
// buffers[rank], streams[rank]), each followed by WaitStream (c10d's wait() of a CUDA op) when
// `wait_each`, else all of them issued first and then waited for in order (DDP's buckets, and
// nccl-tests' way of timing NCCL: no op's input waits on the previous op's result), then
// synchronises its stream. Returns the time per op from the moment they all start until every
// stream drained; every op's completion is then waited for. *signalled: how many ops waited on
// stream-signal words (the others took the event path).
double InFlight(Trainers& trainers, std::vector<std::unique_ptr<DeviceBuffer>>& buffers,
                const std::vector<cudaStream_t>& streams, int ops, bool wait_each, bool* ok,
                int* signalled) {
  const size_t ranks = trainers.clients.size();
  std::vector<std::vector<std::shared_ptr<ClientWork>>> works(ranks);
  std::vector<char> failed(ranks, 0);
  std::latch go(1);
  std::vector<std::thread> threads;
  for (size_t rank = 0; rank < ranks; ++rank) {
    threads.emplace_back([&, rank] {
      Client& client = *trainers.clients[rank];
      DeviceBuffer& buffer = *buffers[rank];
      works[rank].reserve(ops);
      failed[rank] = !Check(cudaSetDevice(0), "cudaSetDevice");
      go.wait();
      // After a failure the ops are still issued (without waits), so that the other trainer's
      // find their partners instead of waiting for the group's timeout.
      auto wait_stream = [&](ClientWork& work) {
        if (failed[rank]) return;
        Status waited = work.WaitStream(streams[rank], kOpTimeout);
        if (!waited.ok()) {
          std::fprintf(stderr, "in flight, rank %zu: %s\n", rank, waited.ToString().c_str());
          failed[rank] = 1;
        }
      };
      for (int i = 0; i < ops; ++i) {
        works[rank].push_back(client.AllReduce(
            trainers.group, ClientTensor::Cuda(buffer.data, 0, DType::kFloat32,
                                               buffer.bytes / sizeof(float), streams[rank])));
        if (wait_each) wait_stream(*works[rank].back());
      }
      if (!wait_each) {
        for (auto& work : works[rank]) wait_stream(*work);
      }
      if (!Check(cudaStreamSynchronize(streams[rank]), "cudaStreamSynchronize")) failed[rank] = 1;
    });
  }
  const auto start = Clock::now();
  go.count_down();
  for (auto& thread : threads) thread.join();
  const double seconds = Seconds(Clock::now() - start) / ops;
  *signalled = 0;
  for (size_t rank = 0; rank < ranks; ++rank) {
    if (failed[rank]) *ok = false;
    for (auto& work : works[rank]) {
      *signalled += work->has_stream_signal() ? 1 : 0;
      Status status = work->Wait(kOpTimeout);
      if (!status.ok() && *ok) {
        std::fprintf(stderr, "in flight, rank %zu: %s\n", rank, status.ToString().c_str());
        *ok = false;
      }
    }
  }
  return seconds;
}

// ---- the table ------------------------------------------------------------------------

struct Row {
  double seconds = 0;
  bool ok = true;
};

// Times `op` (one op, waited for): median over the rounds of the mean per op.
template <typename Op>
Row Time(const Config& config, size_t bytes, Op op) {
  Row row;
  for (int i = 0; i < 3 && row.ok; ++i) row.ok = op();
  std::vector<double> rounds;
  const int iters = ItersFor(config, bytes);
  for (int r = 0; r < config.rounds && row.ok; ++r) {
    const auto start = Clock::now();
    for (int i = 0; i < iters && row.ok; ++i) row.ok = op();
    rounds.push_back(Seconds(Clock::now() - start) / iters);
  }
  row.seconds = Median(rounds);
  return row;
}

void PrintRow(const char* path, int world, size_t bytes, const Row& row, double anchor) {
  const double algbw = row.seconds > 0 ? static_cast<double>(bytes) / row.seconds / 1e9 : 0;
  const double busbw = algbw * 2.0 * (world - 1) / world;
  std::printf("%12zu  %-7s %5d  %11.1f  %8.3f  %8.3f  %10.1f  %6.2f%s\n", bytes, path, world,
              row.seconds * 1e6, algbw, busbw, (row.seconds - anchor) * 1e6,
              row.seconds > 0 ? anchor / row.seconds : 0.0, row.ok ? "" : "  FAILED");
}

int Main(int argc, char** argv) {
  Config config;
  config.sizes = ParseSizes("8:1G:4");
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--sizes") {
      config.sizes = ParseSizes(value());
      if (config.sizes.empty()) {
        std::fprintf(stderr, "gpu_allreduce_bench: malformed --sizes\n");
        return 1;
      }
    } else if (arg == "--rounds") {
      config.rounds = std::max(1, std::atoi(value().c_str()));
    } else if (arg == "--iters") {
      config.iters = std::max(1, std::atoi(value().c_str()));
    } else if (arg == "--daemon") {
      config.daemon = value();
    } else {
      std::fprintf(stderr,
                   "usage: gpu_allreduce_bench [--sizes LIST|MIN:MAX[:F]] [--rounds N] "
                   "[--iters N] [--daemon PATH]\n");
      return 1;
    }
  }
  if (config.daemon.empty()) config.daemon = SelfDirectory() + "/collectived";
  signal(SIGPIPE, SIG_IGN);

  // The sidecar starts before this process touches CUDA (fork after CUDA init is not safe).
  char dir_template[] = "/tmp/cdgpubench-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  auto side = SpawnSidecar(config.daemon, dir_template, 0, {});
  if (!side.ok()) {
    std::fprintf(stderr, "gpu_allreduce_bench: %s\n", side.status().ToString().c_str());
    return 1;
  }
  const GpuInventory& gpus = ProbeGpus();
  std::printf("# %s\n", gpus.Summary().c_str());
  if (gpus.devices.empty()) {
    std::printf("gpu_allreduce_bench: no usable GPU: nothing measured\n");
    StopSidecar(*side);
    return 2;
  }
  bool ok = Check(cudaSetDevice(0), "cudaSetDevice");
  Anchor anchor;
  LocalCombine local;
  Trainers one, two;
  ok = ok && anchor.Start() && local.Start() && one.Start(side->unix_address, 1, "bench-w1") &&
       two.Start(side->unix_address, 2, "bench-w2");

  std::printf("# allreduce float32 SUM on GPU 0; time: median over %d rounds of the mean per op\n",
              config.rounds);
  std::printf("%12s  %-7s %5s  %11s  %8s  %8s  %10s  %6s\n", "size (B)", "path", "world",
              "time (us)", "algbw", "busbw", "overhead", "ratio");
  std::printf("%12s  %-7s %5s  %11s  %8s  %8s  %10s  %6s\n", "", "", "", "", "(GB/s)", "(GB/s)",
              "(us)", "anchor/x");
  for (size_t bytes : config.sizes) {
    if (!ok) break;
    auto buffer = Allocate(bytes);
    std::vector<std::unique_ptr<DeviceBuffer>> single;
    single.push_back(Allocate(bytes));
    std::vector<std::unique_ptr<DeviceBuffer>> pair;
    pair.push_back(Allocate(bytes));
    pair.push_back(Allocate(bytes));
    if (!buffer || !single[0] || !pair[0] || !pair[1]) {
      ok = false;
      break;
    }
    // The checked op of each path: 1s stay 1 at world size 1; 1 + 2 = 3 over two trainers.
    ok = single[0]->Fill(1) && pair[0]->Fill(1) && pair[1]->Fill(2) && one.AllReduce(single) &&
         two.AllReduce(pair);
    if (ok && !(single[0]->Holds(1) && pair[0]->Holds(3) && pair[1]->Holds(3))) {
      std::fprintf(stderr, "gpu_allreduce_bench: wrong result at %zu bytes\n", bytes);
      ok = false;
    }
    const Row nccl = Time(config, bytes, [&] { return anchor.AllReduce(*buffer); });
    const Row w1 = Time(config, bytes, [&] { return one.AllReduce(single); });
    const Row w2 = Time(config, bytes, [&] { return two.AllReduce(pair); });
    const Row kern = Time(config, bytes, [&] { return local.AllReduce(pair); });
    PrintRow("nccl", 1, bytes, nccl, nccl.seconds);
    PrintRow("cd", 1, bytes, w1, nccl.seconds);
    PrintRow("kern", 2, bytes, kern, kern.seconds);
    PrintRow("cd", 2, bytes, w2, kern.seconds);
    ok = ok && nccl.ok && w1.ok && w2.ok && kern.ok;
  }

  // In flight: two trainers sharing the GPU issue allreduces back to back, each followed by a
  // stream-ordered wait (on stream-signal words, then by the event path), and then all issued
  // before any is waited for (the way nccl-tests times NCCL and DDP issues its buckets; stream
  // signals), against the in-process combine issued back to back on one stream. The table above
  // waits for every op, so the sidecar's fixed cost per op shows whole there; here only what the
  // GPU cannot overlap does. With a wait after each op, op N+1's input waits on op N's result
  // through the trainer's stream: two hops between the processes' streams per op, which without
  // MPS cost a time slice each. Every round starts from the same values and checks the result
  // of its ops (1 + 2, doubled by each op after the first), which also checks that ops in
  // flight keep their order.
  if (ok) {
    // Groups of their own with a short timeout: a failure costs seconds, not the budget.
    constexpr milliseconds kInFlightTimeout{15000};
    Trainers signalling, eventing;
    std::vector<cudaStream_t> streams(2, nullptr);
    ok = signalling.Start(side->unix_address, 2, "bench-w2-signals", true, kInFlightTimeout) &&
         eventing.Start(side->unix_address, 2, "bench-w2-events", false, kInFlightTimeout);
    for (cudaStream_t& stream : streams) {
      ok = ok &&
           Check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    }
    constexpr size_t kCheckedBytes = size_t{16} << 20;
    std::printf(
        "\n# in flight: 2 trainers sharing GPU 0 issue N allreduces back to back, each followed "
        "by a stream-ordered wait (signals, events), or all N issued before the waits "
        "(queued, on signals), against the combine issued back to back in process (kern); "
        "time per op (us), median of %d rounds\n",
        config.rounds);
    std::printf("%12s  %5s  %9s  %9s  %6s  %8s  %9s  %6s  %9s  %6s  %8s  %s\n", "size (B)", "N",
                "kern", "signals", "ratio", "busbw", "events", "ratio", "queued", "ratio", "busbw",
                "signalled");
    for (size_t bytes : config.sizes) {
      if (!ok) break;
      if (bytes < (size_t{1} << 20)) continue;
      const int ops = bytes <= (size_t{16} << 20) ? 100 : 20;
      // 3 * 2^(ops - 1): exact in float32 for these counts.
      const float expected = std::ldexp(3.0f, ops - 1);
      std::vector<std::unique_ptr<DeviceBuffer>> pair, start;
      for (int i = 0; i < 2; ++i) {
        pair.push_back(Allocate(bytes));
        start.push_back(Allocate(bytes));
      }
      ok = pair[0] && pair[1] && start[0] && start[1] && start[0]->Fill(1) && start[1]->Fill(2);
      // One round of a path: the start values, `ops` ops, the check. Returns the time per op.
      auto round = [&](const char* path, auto issue) {
        ok = ok && pair[0]->CopyFrom(*start[0]) && pair[1]->CopyFrom(*start[1]);
        if (!ok) return 0.0;
        const double seconds = issue();
        if (ok &&
            !(pair[0]->Holds(expected, kCheckedBytes) && pair[1]->Holds(expected, kCheckedBytes))) {
          std::fprintf(stderr, "gpu_allreduce_bench: in flight, %s: wrong result at %zu bytes\n",
                       path, bytes);
          ok = false;
        }
        return seconds;
      };
      std::vector<double> kern, signals, events, queued;
      int signalled = 0, unused = 0;
      for (int r = 0; r < config.rounds && ok; ++r) {
        kern.push_back(round("kern", [&] {
          const auto begin = Clock::now();
          for (int i = 0; i < ops && ok; ++i) ok = local.Enqueue(pair);
          ok = ok && Check(cudaStreamSynchronize(local.stream), "cudaStreamSynchronize");
          return Seconds(Clock::now() - begin) / ops;
        }));
        signals.push_back(round("signals", [&] {
          return InFlight(signalling, pair, streams, ops, true, &ok, &signalled);
        }));
        events.push_back(round(
            "events", [&] { return InFlight(eventing, pair, streams, ops, true, &ok, &unused); }));
        queued.push_back(round("queued", [&] {
          return InFlight(signalling, pair, streams, ops, false, &ok, &unused);
        }));
      }
      const double anchor_op = Median(kern);
      auto ratio = [&](const std::vector<double>& x) {
        return Median(x) > 0 ? anchor_op / Median(x) : 0.0;
      };
      auto busbw = [&](const std::vector<double>& x) {  // 2 ranks: busbw = algbw
        return Median(x) > 0 ? static_cast<double>(bytes) / Median(x) / 1e9 : 0.0;
      };
      std::printf(
          "%12zu  %5d  %9.1f  %9.1f  %6.2f  %8.3f  %9.1f  %6.2f  %9.1f  %6.2f  %8.3f  %d of %d%s\n",
          bytes, ops, anchor_op * 1e6, Median(signals) * 1e6, ratio(signals), busbw(signals),
          Median(events) * 1e6, ratio(events), Median(queued) * 1e6, ratio(queued), busbw(queued),
          signalled, 2 * ops, ok ? "" : "  FAILED");
    }
    for (cudaStream_t stream : streams) {
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  }

  // Where the fixed cost of one op goes, at world size 1 and 8 B: the trainer's export of the
  // tensor alone; the same op on a CPU group of the same sidecar and client (request, engine and
  // completion with no GPU work); and the CUDA op.
  if (ok) {
    auto tensor = Allocate(8);
    ok = tensor != nullptr && tensor->Fill(1);
    GroupOptions options;
    options.name = "bench-cpu-w1";
    options.rank = 0;
    options.world_size = 1;
    options.timeout = kOpTimeout;
    auto cpu_group = one.clients[0]->CreateGroup(options);
    if (!cpu_group.ok()) {
      std::fprintf(stderr, "create CPU group: %s\n", cpu_group.status().ToString().c_str());
      ok = false;
    }
    constexpr int kSamples = 200;
    std::vector<double> export_alone, cpu_op, cuda_op;
    bool cuda_via_ring = false;
    float host[2] = {1, 1};
    for (int i = 0; i < kSamples && ok; ++i) {
      auto start = Clock::now();
      ok = ExportCudaTensor(tensor->data, 8, 0, nullptr).ok();
      export_alone.push_back(Seconds(Clock::now() - start));
      start = Clock::now();
      ok = ok && one.clients[0]
                     ->AllReduce(options.name, ClientTensor::Inline(host, DType::kFloat32, 2))
                     ->Wait(kOpTimeout)
                     .ok();
      cpu_op.push_back(Seconds(Clock::now() - start));
      start = Clock::now();
      auto work = one.clients[0]->AllReduce(
          one.group, ClientTensor::Cuda(tensor->data, 0, DType::kFloat32, 2));
      ok = ok && work->Wait(kOpTimeout).ok();
      cuda_op.push_back(Seconds(Clock::now() - start));
      cuda_via_ring = work->via_ring();
    }
    std::printf("\n# one 8 B allreduce at world size 1, where the time goes (median of %d)\n",
                kSamples);
    std::printf("trainer's export of the CUDA tensor:  %9.1f us\n", Median(export_alone) * 1e6);
    std::printf("the op on a CPU group (no GPU work):  %9.1f us\n", Median(cpu_op) * 1e6);
    std::printf("the op on the CUDA group:             %9.1f us (%s)\n", Median(cuda_op) * 1e6,
                cuda_via_ring ? "submission ring" : "gRPC stream");
  }

  // Back to back (the torch benchmark's figure (c) without Python): 1,000 allreduces of 1 MiB at
  // world size 1, each followed by WaitStream on the trainer's stream, against in-process NCCL
  // issuing the same on its stream; by the event path (WaitStream waits on the CPU for the
  // sidecar's early response) and by stream signals (it does not wait); and the floor of the
  // sidecar and the client with no GPU work, a CPU group's ops submitted back to back.
  if (ok) {
    constexpr int kBackToBack = 1000;
    Trainers signalling;
    std::vector<cudaStream_t> stream(1, nullptr);
    std::vector<std::unique_ptr<DeviceBuffer>> buffer;
    buffer.push_back(Allocate(size_t{1} << 20));
    ok = buffer[0] != nullptr && buffer[0]->Fill(1) &&
         signalling.Start(side->unix_address, 1, "bench-w1-signals", true) &&
         Check(cudaStreamCreateWithFlags(&stream[0], cudaStreamNonBlocking), "cudaStreamCreate");
    std::vector<double> nccl, events, signals, host;
    int signalled = 0, unused = 0;
    for (int r = 0; r < config.rounds && ok; ++r) {
      const auto start = Clock::now();
      for (int i = 0; i < kBackToBack && ok; ++i) ok = anchor.Enqueue(*buffer[0]);
      ok = ok && Check(cudaStreamSynchronize(anchor.stream), "cudaStreamSynchronize");
      nccl.push_back(Seconds(Clock::now() - start) / kBackToBack);
      events.push_back(InFlight(one, buffer, stream, kBackToBack, true, &ok, &unused));
      signals.push_back(InFlight(signalling, buffer, stream, kBackToBack, true, &ok, &signalled));
      host.push_back(BackToBackOnHost(*one.clients[0], "bench-cpu-w1", kBackToBack, &ok));
    }
    if (stream[0] != nullptr) cudaStreamDestroy(stream[0]);
    ok = ok && buffer[0]->Holds(1);
    const double anchor_op = Median(nccl);
    auto ratio = [&](const std::vector<double>& x) { return Median(x) / anchor_op; };
    std::printf(
        "\n# back to back: %d allreduces of 1 MiB at world size 1, each followed by a "
        "stream-ordered wait (median of %d rounds)\n",
        kBackToBack, config.rounds);
    std::printf("in-process NCCL:                      %9.1f us per op\n", anchor_op * 1e6);
    std::printf("collectived, event path:              %9.1f us per op (%.2fx NCCL's time)\n",
                Median(events) * 1e6, ratio(events));
    std::printf(
        "collectived, stream signals:          %9.1f us per op (%.2fx); %d of %d ops of "
        "the last round waited on a word%s\n",
        Median(signals) * 1e6, ratio(signals), signalled, kBackToBack,
        signalled == 0 ? " (NO stream signals here: all took the event path)" : "");
    std::printf("a CPU group, no GPU work (the floor): %9.1f us per op\n", Median(host) * 1e6);
    PrintPacing(side->unix_address, one.group, "event path");
    PrintPacing(side->unix_address, signalling.group, "stream signals");
  }

  // Where an op's time goes on the sidecar, from its flight recorder, at world size 2 (two
  // trainers sharing the GPU): arrival and agreement, enqueueing the GPU work, the GPU (waiting
  // for the trainers' events, then the kernels), and concluding; the rest of what the trainer
  // saw is the request and the response.
  if (ok) {
    auto channel = grpc::CreateChannel(side->unix_address, grpc::InsecureChannelCredentials());
    auto admin = v1::Admin::NewStub(channel);
    std::printf(
        "\n# where an allreduce's time goes, 2 trainers sharing GPU 0 (median of %d ops; "
        "us)\n",
        kBreakdownOps);
    std::printf("%12s  %9s  %9s  %9s  %9s  %9s  %9s\n", "size (B)", "trainer", "agreed", "enqueued",
                "gpu", "concluded", "rpc+rest");
    for (size_t bytes : {size_t{8}, size_t{64} << 20}) {
      std::vector<std::unique_ptr<DeviceBuffer>> pair;
      pair.push_back(Allocate(bytes));
      pair.push_back(Allocate(bytes));
      if (!pair[0] || !pair[1]) {
        ok = false;
        break;
      }
      std::vector<double> trainer;
      for (int i = 0; i < kBreakdownOps && ok; ++i) {
        const auto start = Clock::now();
        ok = two.AllReduce(pair);
        trainer.push_back(Seconds(Clock::now() - start) * 1e6);
      }
      grpc::ClientContext context;
      v1::GetFlightRecorderRequest request;
      request.set_group(two.group);
      request.set_limit(kBreakdownOps);
      v1::FlightRecorder records;
      const grpc::Status read = admin->GetFlightRecorder(&context, request, &records);
      if (!read.ok() || records.ops_size() < kBreakdownOps) {
        std::fprintf(stderr, "flight recorder: %s (%d records)\n", read.error_message().c_str(),
                     records.ops_size());
        ok = false;
        break;
      }
      std::vector<double> agreed, enqueued, gpu, concluded, rest;
      for (const v1::OpRecord& op : records.ops()) {
        if (op.enqueued_us() < 0 || op.device_done_us() < 0) continue;
        agreed.push_back(static_cast<double>(op.data_started_us()));
        enqueued.push_back(static_cast<double>(op.enqueued_us() - op.data_started_us()));
        gpu.push_back(static_cast<double>(op.device_done_us() - op.enqueued_us()));
        concluded.push_back(static_cast<double>(op.duration_us() - op.device_done_us()));
        rest.push_back(Median(trainer) - static_cast<double>(op.duration_us()));
      }
      std::printf("%12zu  %9.1f  %9.1f  %9.1f  %9.1f  %9.1f  %9.1f\n", bytes, Median(trainer),
                  Median(agreed), Median(enqueued), Median(gpu), Median(concluded), Median(rest));
    }
  }

  // The cost of opening an IPC handle: a new allocation each time, against the same one again.
  if (ok) {
    std::vector<double> first, cached;
    for (int i = 0; i < 20 && ok; ++i) {
      std::vector<std::unique_ptr<DeviceBuffer>> fresh;
      fresh.push_back(Allocate(8));
      ok = fresh[0] != nullptr && fresh[0]->Fill(1);
      auto start = Clock::now();
      ok = ok && one.AllReduce(fresh);
      first.push_back(Seconds(Clock::now() - start));
      start = Clock::now();
      ok = ok && one.AllReduce(fresh);
      cached.push_back(Seconds(Clock::now() - start));
    }
    std::printf("\n# CUDA IPC handle, 8 B allreduce at world size 1 (median of 20)\n");
    std::printf("first use (the sidecar opens it): %9.1f us\n", Median(first) * 1e6);
    std::printf("cached:                            %9.1f us\n", Median(cached) * 1e6);
  }

  // The overlap penalty.
  if (ok) {
    auto compute = Allocate(kComputeBytes);
    auto nccl_buffer = Allocate(kOverlapBytes);
    std::vector<std::unique_ptr<DeviceBuffer>> cd_buffer;
    cd_buffer.push_back(Allocate(kOverlapBytes));
    cudaStream_t compute_stream = nullptr;
    ok = compute && nccl_buffer && cd_buffer[0] &&
         Check(cudaStreamCreateWithFlags(&compute_stream, cudaStreamNonBlocking),
               "cudaStreamCreate") &&
         compute->Fill(1);
    const size_t count = kComputeBytes / sizeof(float);
    auto launch_compute = [&] {
      for (int k = 0; k < 20; ++k) {
        device_kernels::Combine(device_kernels::Combiner::kSum, DType::kFloat32, compute->data,
                                compute->data, compute->data, count, compute_stream);
      }
    };
    auto compute_alone = [&] {
      launch_compute();
      return Check(cudaStreamSynchronize(compute_stream), "compute");
    };
    auto nccl_together = [&] {
      launch_compute();
      bool done = anchor.AllReduce(*nccl_buffer);
      return done && Check(cudaStreamSynchronize(compute_stream), "compute");
    };
    auto cd_together = [&] {
      launch_compute();
      bool done = one.AllReduce(cd_buffer);
      return done && Check(cudaStreamSynchronize(compute_stream), "compute");
    };
    Config overlap = config;
    overlap.iters = 3;
    const Row c = Time(overlap, kOverlapBytes, compute_alone);
    const Row n = Time(overlap, kOverlapBytes, [&] { return anchor.AllReduce(*nccl_buffer); });
    const Row s = Time(overlap, kOverlapBytes, [&] { return one.AllReduce(cd_buffer); });
    const Row nt = Time(overlap, kOverlapBytes, nccl_together);
    const Row st = Time(overlap, kOverlapBytes, cd_together);
    std::printf("\n# overlap: 20 combines over 256 MiB and a 64 MiB allreduce issued together\n");
    std::printf("compute alone %.1f us; allreduce alone: nccl %.1f us, cd %.1f us\n",
                c.seconds * 1e6, n.seconds * 1e6, s.seconds * 1e6);
    std::printf("together: nccl %.1f us (%.2fx the longer alone), cd %.1f us (%.2fx)\n",
                nt.seconds * 1e6, nt.seconds / std::max(c.seconds, n.seconds), st.seconds * 1e6,
                st.seconds / std::max(c.seconds, s.seconds));
    std::printf("MPS: %s\n", std::getenv("CUDA_MPS_PIPE_DIRECTORY") != nullptr
                                 ? "CUDA_MPS_PIPE_DIRECTORY is set"
                                 : "not in use (no CUDA_MPS_PIPE_DIRECTORY)");
    ok = ok && c.ok && n.ok && s.ok && nt.ok && st.ok;
    if (compute_stream != nullptr) cudaStreamDestroy(compute_stream);
  }

  one.clients.clear();
  two.clients.clear();
  const int stopped = StopSidecar(*side);
  if (!ok) std::fprintf(stderr, "sidecar log:\n%s\n", ReadFile(side->log_path).c_str());
  std::printf("\ngpu_allreduce_bench: %s\n", ok && stopped == 0 ? "OK" : "FAILED");
  return ok && stopped == 0 ? 0 : 1;
}

}  // namespace
}  // namespace collectived

int main(int argc, char** argv) {
  return collectived::Main(argc, argv);
}
