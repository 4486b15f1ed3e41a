// allreduce and allreduce_coalesced: local ranks are combined chunk by chunk while the chunk is
// in cache, one contribution per node goes through the network, and the result is copied back
// to every local rank.
#include <algorithm>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/concurrency/parallel_for.h"
#include "engine/group/algorithms/algorithms.h"

namespace collectived {
namespace {

// Elements per chunk of the local passes: small enough to stay in L2 across the passes.
constexpr size_t kChunkBytes = 128 * 1024;
// Local passes over at least this many bytes are split into tasks on the executor.
constexpr size_t kParallelPassBytes = size_t{4} << 20;
constexpr size_t kMaxPassWorkers = 4;

// Elements per chunk of a local pass: kChunkBytes on host memory; on a device the whole tensor,
// since each chunk costs a kernel launch (microseconds) and the GPU's caches gain nothing.
size_t LocalChunkElements(const DataBackend& backend, size_t element, size_t count) {
  if (!backend.capabilities().cpu_accessible) return std::max<size_t>(1, count);
  return std::max<size_t>(1, kChunkBytes / element);
}

// out = out (op) in_1 (op) ... (op) in_k, chunk by chunk.
Status CombineLocal(DataBackend& backend, const ReduceOp& op, DType dtype, std::byte* out,
                    const std::vector<const std::byte*>& inputs, size_t count) {
  if (inputs.empty()) return Status::Ok();
  const size_t element = DTypeSize(dtype);
  const size_t chunk = LocalChunkElements(backend, element, count);
  for (size_t first = 0; first < count; first += chunk) {
    size_t n = std::min(chunk, count - first);
    size_t offset = first * element;
    for (const std::byte* input : inputs) {
      COLLECTIVED_RETURN_IF_ERROR(
          backend.Combine(op, dtype, out + offset, out + offset, input + offset, n));
    }
  }
  return Status::Ok();
}

// How many tasks run the local passes of `bytes` in `chunks` chunks: one below
// kParallelPassBytes, for device memory or without an executor, else up to the executor's threads
// (at most kMaxPassWorkers).
size_t LocalPassWorkers(const OpContext& op, size_t bytes, size_t chunks) {
  if (!op.backend.capabilities().cpu_accessible || bytes < kParallelPassBytes || !op.executor) {
    return 1;
  }
  return std::min({op.executor->threads(), kMaxPassWorkers, chunks});
}

// Large allreduces across nodes with several ranks on a node are pipelined: the network
// reduces chunk c while the local ranks' chunk c + 1 is combined and chunk c - 1 is copied back.
// Every node must cut the same chunks, so the choice depends only on what all nodes know alike:
// the op's size and the group's topology.
constexpr size_t kPipelineMinBytes = size_t{16} << 20;
constexpr size_t kPipelineChunkBytes = size_t{4} << 20;

bool ShouldPipeline(const OpContext& op, size_t bytes) {
  if (!op.backend.capabilities().cpu_accessible || op.topology.node_count() < 2 ||
      bytes < kPipelineMinBytes) {
    return false;
  }
  for (const std::vector<int>& ranks : op.topology.ranks_of_node) {
    if (ranks.size() >= 2) return true;  // some node has copies to overlap with the network
  }
  return false;
}

// The network half of a pipelined allreduce, shared by the op and the executor task that runs
// it (or the op itself, when no thread took the task before the op needed it).
struct Pipeline {
  std::mutex mutex;
  std::condition_variable changed;
  size_t combined = 0;    // guarded by mutex: chunks ready for the network
  size_t reduced = 0;     // guarded by mutex: chunks the network finished
  bool stop = false;      // guarded by mutex: the op is over; no more network calls
  Status network;         // guarded by mutex: the network half's failure
  bool claimed = false;   // guarded by mutex: someone runs (or ran) the network half
  bool finished = false;  // guarded by mutex: the network half returned
};

// The multi-node allreduce of one tensor per rank, pipelined (see ShouldPipeline): `acc` is the
// first local rank's tensor, `others` the other local ranks'. This thread combines and copies;
// a task of the executor makes the network calls, one per chunk, in order, each with its own tag.
Status PipelinedAllReduce(OpContext& op, std::byte* acc,
                          const std::vector<const std::byte*>& others, size_t total) {
  const OpRequest& first = *op.requests[0];
  const DType dtype = first.inputs[0].dtype;
  const size_t element = DTypeSize(dtype);
  const ReduceOp& reduce_op = first.reduce_op;
  DataBackend& backend = op.backend;
  size_t chunk = std::max<size_t>(1, kPipelineChunkBytes / element);
  // At most kMaxDataSteps network calls per op: bigger chunks for very large tensors.
  chunk = std::max(chunk, (total + OpTags::kMaxDataSteps - 1) / OpTags::kMaxDataSteps);
  const size_t chunks = (total + chunk - 1) / chunk;
  auto range = [chunk, total](size_t c) {
    return std::make_pair(c * chunk, std::min(chunk, total - c * chunk));
  };

  auto pipeline = std::make_shared<Pipeline>();
  Pipeline& p = *pipeline;
  // Runs only once claimed, and a claim happens before this function returns: the references
  // it captures hold.
  auto network_half = [&] {
    for (size_t c = 0; c < chunks; ++c) {
      {
        std::unique_lock<std::mutex> lock(p.mutex);
        p.changed.wait(lock, [&] { return p.stop || p.combined > c; });
        if (p.stop) break;
      }
      const auto [begin, n] = range(c);
      Status status = backend.AllReduce(acc + begin * element, n, dtype, reduce_op,
                                        op.tags.DataStep(static_cast<uint32_t>(c)), op.timeout);
      std::lock_guard<std::mutex> lock(p.mutex);
      if (!status.ok()) {
        p.network = status;
        break;
      }
      p.reduced = c + 1;
      p.changed.notify_all();
    }
    std::lock_guard<std::mutex> lock(p.mutex);
    p.finished = true;
    p.changed.notify_all();
  };
  auto claim = [pipeline] {
    std::lock_guard<std::mutex> lock(pipeline->mutex);
    return !std::exchange(pipeline->claimed, true);
  };
  if (op.executor != nullptr) {
    std::function<void()> run_network = network_half;
    op.executor->Post([claim, run_network] {
      if (claim()) run_network();
    });
  }
  size_t copied = 0;  // chunks finalized and copied back to the other local ranks
  // Finalizes and copies back every chunk the network finished (waits for one if `wait`; runs
  // the network half here if no thread took it yet).
  auto copy_back = [&](bool wait) -> Status {
    if (wait && claim()) network_half();
    size_t ready;
    {
      std::unique_lock<std::mutex> lock(p.mutex);
      if (wait) p.changed.wait(lock, [&] { return !p.network.ok() || p.reduced > copied; });
      if (!p.network.ok()) return p.network;
      ready = p.reduced;
    }
    for (; copied < ready; ++copied) {
      const auto [begin, n] = range(copied);
      std::byte* out = acc + begin * element;
      COLLECTIVED_RETURN_IF_ERROR(
          backend.Finalize(reduce_op, dtype, out, n, op.topology.group_size));
      for (size_t l = 1; l < op.requests.size(); ++l) {
        COLLECTIVED_RETURN_IF_ERROR(
            backend.Copy(op.requests[l]->inputs[0].data + begin * element, out, n * element));
      }
    }
    return Status::Ok();
  };
  Status status;
  for (size_t c = 0; c < chunks && status.ok(); ++c) {
    const auto [begin, n] = range(c);
    std::vector<const std::byte*> inputs;
    for (const std::byte* other : others) inputs.push_back(other + begin * element);
    status = CombineLocal(backend, reduce_op, dtype, acc + begin * element, inputs, n);
    if (status.ok()) status = backend.PreScale(reduce_op, dtype, acc + begin * element, n);
    if (!status.ok()) break;
    {
      std::lock_guard<std::mutex> lock(p.mutex);
      p.combined = c + 1;
    }
    p.changed.notify_all();
    status = copy_back(/*wait=*/false);
  }
  while (status.ok() && copied < chunks) status = copy_back(/*wait=*/true);
  // The network half must be over (or never start) before its references go.
  std::unique_lock<std::mutex> lock(p.mutex);
  p.stop = true;
  p.changed.notify_all();
  if (std::exchange(p.claimed, true)) p.changed.wait(lock, [&] { return p.finished; });
  return status;
}

}  // namespace

Status RunAllReduce(OpContext& op) {
  std::vector<OpRequest*>& requests = op.requests;
  const OpRequest& first = *requests[0];
  const DType dtype = first.inputs[0].dtype;
  const size_t element = DTypeSize(dtype);
  const ReduceOp& reduce_op = first.reduce_op;
  DataBackend& backend = op.backend;
  const int group_size = op.topology.group_size;

  // One tensor: accumulate in place in the first local rank's tensor (it is an output too).
  // Several: pack them into scratch so a single network call carries them all.
  const size_t tensors = first.inputs.size();
  std::byte* acc;
  size_t total = 0;
  for (const TensorView& t : first.inputs) total += t.count;
  if (tensors == 1) {
    acc = first.inputs[0].data;
    std::vector<const std::byte*> others;
    for (size_t l = 1; l < requests.size(); ++l) others.push_back(requests[l]->inputs[0].data);
    if (backend.node_count() == 1) {
      // Nothing crosses the network: finish each chunk and copy it to the other ranks while it
      // is still in cache, instead of re-reading the whole result afterwards.
      const size_t chunk = LocalChunkElements(backend, element, total);
      const size_t chunks = (total + chunk - 1) / chunk;
      // Chunks first, first + stride, ... (one worker's share).
      auto finish_chunks = [&](size_t first_chunk, size_t stride) -> Status {
        for (size_t c = first_chunk; c < chunks; c += stride) {
          const size_t begin = c * chunk;
          const size_t n = std::min(chunk, total - begin);
          std::byte* out = acc + begin * element;
          for (const std::byte* input : others) {
            COLLECTIVED_RETURN_IF_ERROR(
                backend.Combine(reduce_op, dtype, out, out, input + begin * element, n));
          }
          COLLECTIVED_RETURN_IF_ERROR(backend.PreScale(reduce_op, dtype, out, n));
          COLLECTIVED_RETURN_IF_ERROR(backend.Finalize(reduce_op, dtype, out, n, group_size));
          for (size_t l = 1; l < requests.size(); ++l) {
            COLLECTIVED_RETURN_IF_ERROR(
                backend.Copy(requests[l]->inputs[0].data + begin * element, out, n * element));
          }
        }
        return Status::Ok();
      };
      const size_t workers = LocalPassWorkers(op, total * element, chunks);
      if (workers <= 1) return finish_chunks(0, 1);
      // The trainers wait while their sidecar reduces: its passes over large host tensors are
      // split into tasks on the executor (see DataBackend: host memory functions may run there),
      // this thread taking part.
      return ParallelFor(op.executor, workers, workers - 1,
                         [&](size_t w) { return finish_chunks(w, workers); });
    }
    if (ShouldPipeline(op, total * element)) return PipelinedAllReduce(op, acc, others, total);
    COLLECTIVED_RETURN_IF_ERROR(CombineLocal(backend, reduce_op, dtype, acc, others, total));
  } else {
    COLLECTIVED_ASSIGN_OR_RETURN(acc, backend.Scratch(0, total * element));
    size_t offset = 0;
    for (size_t i = 0; i < tensors; ++i) {
      const TensorView& t = first.inputs[i];
      COLLECTIVED_RETURN_IF_ERROR(backend.Copy(acc + offset, t.data, t.bytes()));
      std::vector<const std::byte*> others;
      for (size_t l = 1; l < requests.size(); ++l) others.push_back(requests[l]->inputs[i].data);
      COLLECTIVED_RETURN_IF_ERROR(
          CombineLocal(backend, reduce_op, dtype, acc + offset, others, t.count));
      offset += t.bytes();
    }
  }
  // PREMUL_SUM: s * (x1 + ... + xk) per node, summed over nodes, is s * the total.
  COLLECTIVED_RETURN_IF_ERROR(backend.PreScale(reduce_op, dtype, acc, total));
  COLLECTIVED_RETURN_IF_ERROR(
      backend.AllReduce(acc, total, dtype, reduce_op, op.tags.Data<0>(), op.timeout));
  COLLECTIVED_RETURN_IF_ERROR(backend.Finalize(reduce_op, dtype, acc, total, group_size));

  size_t offset = 0;
  for (size_t i = 0; i < tensors; ++i) {
    size_t bytes = first.inputs[i].bytes();
    for (size_t l = (tensors == 1 ? 1 : 0); l < requests.size(); ++l) {
      COLLECTIVED_RETURN_IF_ERROR(backend.Copy(requests[l]->inputs[i].data, acc + offset, bytes));
    }
    offset += bytes;
  }
  return Status::Ok();
}

bool PackSmallAllReduce(DataBackend& backend, const std::vector<const OpRequest*>& requests,
                        std::byte* payload, size_t capacity) {
  const OpRequest& first = *requests[0];
  if (first.kind != OpKind::kAllReduce || first.inputs.size() != 1 ||
      !backend.capabilities().cpu_accessible || first.inputs[0].bytes() > capacity) {
    return false;
  }
  const TensorView& mine = first.inputs[0];
  std::vector<const std::byte*> others;
  for (size_t l = 1; l < requests.size(); ++l) {
    const TensorView& other = requests[l]->inputs[0];
    if (other.bytes() != mine.bytes() || other.dtype != mine.dtype) return false;  // a desync
    others.push_back(other.data);
  }
  if (!backend.Copy(payload, mine.data, mine.bytes()).ok()) return false;
  // As the multi-node path does: each node's partial result, PREMUL_SUM's scale applied.
  return CombineLocal(backend, first.reduce_op, mine.dtype, payload, others, mine.count).ok() &&
         backend.PreScale(first.reduce_op, mine.dtype, payload, mine.count).ok();
}

Status FinishSmallAllReduce(OpContext& op, const std::byte* payloads, size_t stride,
                            int payload_count) {
  const OpRequest& first = *op.requests[0];
  const TensorView& out = first.inputs[0];
  DataBackend& backend = op.backend;
  COLLECTIVED_RETURN_IF_ERROR(backend.Copy(out.data, payloads, out.bytes()));
  for (int node = 1; node < payload_count; ++node) {
    COLLECTIVED_RETURN_IF_ERROR(backend.Combine(first.reduce_op, out.dtype, out.data, out.data,
                                                payloads + node * stride, out.count));
  }
  COLLECTIVED_RETURN_IF_ERROR(
      backend.Finalize(first.reduce_op, out.dtype, out.data, out.count, op.topology.group_size));
  for (size_t l = 1; l < op.requests.size(); ++l) {
    COLLECTIVED_RETURN_IF_ERROR(
        backend.Copy(op.requests[l]->inputs[0].data, out.data, out.bytes()));
  }
  return Status::Ok();
}

Status RunBarrier(OpContext& op) {
  // On host memory the signature exchange that precedes every op already waited for every
  // rank: that is the whole barrier. A device backend also orders its streams.
  if (op.backend.capabilities().cpu_accessible) return Status::Ok();
  return op.backend.Barrier(op.tags.Data<0>(), op.timeout);
}

}  // namespace collectived
