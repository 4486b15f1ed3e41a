// allreduce and allreduce_coalesced: local ranks are combined chunk by chunk while the chunk is
// in cache, one contribution per node goes through the network, and the result is copied back
// to every local rank.
#include <algorithm>
#include <thread>
#include <vector>

#include "engine/group/algorithms.h"

namespace collectived {
namespace {

// Elements per chunk of the local passes: small enough to stay in L2 across the passes.
constexpr size_t kChunkBytes = 128 * 1024;
// Local passes over at least this many bytes are split among threads.
constexpr size_t kParallelPassBytes = size_t{4} << 20;
constexpr size_t kMaxPassWorkers = 4;

// out = out (op) in_1 (op) ... (op) in_k, chunk by chunk.
Status CombineLocal(DataBackend& backend, const ReduceOp& op, DType dtype, std::byte* out,
                    const std::vector<const std::byte*>& inputs, size_t count) {
  if (inputs.empty()) return Status::Ok();
  const size_t element = DTypeSize(dtype);
  size_t chunk = std::max<size_t>(1, kChunkBytes / element);
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

// How many threads run the local passes of `bytes` in `chunks` chunks: one below
// kParallelPassBytes or for device memory, else up to the cores (at most kMaxPassWorkers).
size_t LocalPassWorkers(const DataBackend& backend, size_t bytes, size_t chunks) {
  if (backend.device_kind() != DeviceKind::kCpu || bytes < kParallelPassBytes) return 1;
  const size_t cores = std::max<size_t>(1, std::thread::hardware_concurrency());
  return std::min({cores, kMaxPassWorkers, chunks});
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
      const size_t chunk = std::max<size_t>(1, kChunkBytes / element);
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
            backend.Copy(requests[l]->inputs[0].data + begin * element, out, n * element);
          }
        }
        return Status::Ok();
      };
      const size_t workers = LocalPassWorkers(backend, total * element, chunks);
      if (workers <= 1) return finish_chunks(0, 1);
      // The trainers wait while their sidecar reduces: its passes over large host tensors run
      // on several cores (see DataBackend: host memory functions may run on helper threads).
      std::vector<Status> results(workers);
      std::vector<std::thread> helpers;
      for (size_t w = 1; w < workers; ++w) {
        helpers.emplace_back([&, w] { results[w] = finish_chunks(w, workers); });
      }
      results[0] = finish_chunks(0, workers);
      for (std::thread& helper : helpers) helper.join();
      for (const Status& result : results) COLLECTIVED_RETURN_IF_ERROR(result);
      return Status::Ok();
    }
    COLLECTIVED_RETURN_IF_ERROR(CombineLocal(backend, reduce_op, dtype, acc, others, total));
  } else {
    acc = backend.Scratch(0, total * element);
    size_t offset = 0;
    for (size_t i = 0; i < tensors; ++i) {
      const TensorView& t = first.inputs[i];
      backend.Copy(acc + offset, t.data, t.bytes());
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
      backend.Copy(requests[l]->inputs[i].data, acc + offset, bytes);
    }
    offset += bytes;
  }
  return Status::Ok();
}

bool PackSmallAllReduce(DataBackend& backend, const std::vector<const OpRequest*>& requests,
                        std::byte* payload, size_t capacity) {
  const OpRequest& first = *requests[0];
  if (first.kind != OpKind::kAllReduce || first.inputs.size() != 1 ||
      backend.device_kind() != DeviceKind::kCpu || first.inputs[0].bytes() > capacity) {
    return false;
  }
  const TensorView& mine = first.inputs[0];
  std::vector<const std::byte*> others;
  for (size_t l = 1; l < requests.size(); ++l) {
    const TensorView& other = requests[l]->inputs[0];
    if (other.bytes() != mine.bytes() || other.dtype != mine.dtype) return false;  // a desync
    others.push_back(other.data);
  }
  backend.Copy(payload, mine.data, mine.bytes());
  // As the multi-node path does: each node's partial result, PREMUL_SUM's scale applied.
  return CombineLocal(backend, first.reduce_op, mine.dtype, payload, others, mine.count).ok() &&
         backend.PreScale(first.reduce_op, mine.dtype, payload, mine.count).ok();
}

Status FinishSmallAllReduce(OpContext& op, const std::byte* payloads, size_t stride) {
  const OpRequest& first = *op.requests[0];
  const TensorView& out = first.inputs[0];
  DataBackend& backend = op.backend;
  backend.Copy(out.data, payloads, out.bytes());
  for (int node = 1; node < op.topology.node_count(); ++node) {
    COLLECTIVED_RETURN_IF_ERROR(backend.Combine(first.reduce_op, out.dtype, out.data, out.data,
                                                payloads + node * stride, out.count));
  }
  COLLECTIVED_RETURN_IF_ERROR(
      backend.Finalize(first.reduce_op, out.dtype, out.data, out.count, op.topology.group_size));
  for (size_t l = 1; l < op.requests.size(); ++l) {
    backend.Copy(op.requests[l]->inputs[0].data, out.data, out.bytes());
  }
  return Status::Ok();
}

Status RunBarrier(OpContext& op) {
  // On host memory the signature exchange that precedes every op already waited for every
  // rank: that is the whole barrier. A device backend also orders its streams.
  if (op.backend.device_kind() == DeviceKind::kCpu) return Status::Ok();
  return op.backend.Barrier(op.tags.Data<0>(), op.timeout);
}

}  // namespace collectived
