// allgather, allgather_into_tensor, allgather_coalesced and reduce_scatter(_tensor): every local
// input is packed into one node buffer laid out node-major; allgatherv (or alltoallv plus a local
// reduction, since this Gloo has no reduce_scatter) moves one buffer per node.
#include <cstring>

#include "engine/group/algorithms.h"
#include "engine/reduce_kernels.h"

namespace collectived {
namespace {

// One (input, per-rank outputs) pair of an allgather-family request, or one (per-rank inputs,
// output) pair of a reduce_scatter-family request.
struct Blocks {
  std::vector<TensorView> per_rank;
  TensorView single;
};

std::vector<Blocks> GatherItems(const OpRequest& r, int n) {
  std::vector<Blocks> items;
  switch (r.kind) {
    case OpKind::kAllGather:
      items.push_back({r.outputs, r.inputs[0]});
      break;
    case OpKind::kAllGatherIntoTensor: {
      Blocks b{{}, r.inputs[0]};
      for (int i = 0; i < n; ++i)
        b.per_rank.push_back(r.outputs[0].Slice(i * r.inputs[0].count, r.inputs[0].count));
      items.push_back(b);
      break;
    }
    default:  // kAllGatherCoalesced
      for (size_t i = 0; i < r.inputs.size(); ++i) {
        Blocks b{{}, r.inputs[i]};
        for (int k = 0; k < n; ++k) b.per_rank.push_back(r.outputs[i * n + k]);
        items.push_back(b);
      }
  }
  return items;
}

Blocks ScatterItem(const OpRequest& r, int n) {
  if (r.kind == OpKind::kReduceScatter) return {r.inputs, r.outputs[0]};
  Blocks b{{}, r.outputs[0]};
  for (int i = 0; i < n; ++i)
    b.per_rank.push_back(r.inputs[0].Slice(i * r.outputs[0].count, r.outputs[0].count));
  return b;
}

}  // namespace

Status RunAllGather(OpContext& op) {
  const GroupTopology& topology = op.topology;
  const int n = topology.group_size;
  const size_t local = op.requests.size();
  std::vector<std::vector<Blocks>> items;
  for (OpRequest* request : op.requests) items.push_back(GatherItems(*request, n));
  for (size_t item = 0; item < items[0].size(); ++item) {
    const size_t bytes = items[0][item].single.bytes();
    if (bytes == 0) continue;
    std::byte* packed = op.scratch.Get(0, local * bytes);
    for (size_t l = 0; l < local; ++l)
      std::memcpy(packed + l * bytes, items[l][item].single.data, bytes);
    std::byte* gathered = op.scratch.Get(1, n * bytes);
    std::vector<size_t> bytes_per_node;
    for (const auto& ranks : topology.ranks_of_node) bytes_per_node.push_back(ranks.size() * bytes);
    COLLECTIVED_RETURN_IF_ERROR(
        op.comm.AllGatherV(packed, gathered, bytes_per_node, op.tag + item, op.timeout));
    for (size_t l = 0; l < local; ++l) {
      for (int rank = 0; rank < n; ++rank) {
        std::memcpy(items[l][item].per_rank[rank].data,
                    gathered + topology.node_major_position[rank] * bytes, bytes);
      }
    }
  }
  return Status::Ok();
}

Status RunReduceScatter(OpContext& op) {
  const GroupTopology& topology = op.topology;
  const int n = topology.group_size;
  const OpRequest& first = *op.requests[0];
  const DType dtype = first.outputs[0].dtype;
  const size_t count = first.outputs[0].count;
  const size_t bytes = first.outputs[0].bytes();
  StatusOr<CombineFn> combine = CombineFunction(first.reduce_op, dtype);
  if (!combine.ok()) return combine.status();
  std::vector<Blocks> items;
  for (OpRequest* request : op.requests) items.push_back(ScatterItem(*request, n));

  // Local reduction of every rank's block, laid out node-major so each node's blocks are
  // contiguous for the alltoallv.
  std::byte* acc = op.scratch.Get(0, n * bytes);
  for (int rank = 0; rank < n && bytes > 0; ++rank) {
    std::byte* block = acc + topology.node_major_position[rank] * bytes;
    std::memcpy(block, items[0].per_rank[rank].data, bytes);
    for (size_t l = 1; l < items.size(); ++l)
      (*combine)(block, block, items[l].per_rank[rank].data, count);
  }
  COLLECTIVED_RETURN_IF_ERROR(PreScale(first.reduce_op, dtype, acc, n * count));

  const int nodes = topology.node_count();
  const size_t local = topology.local_ranks().size();
  std::vector<int64_t> send_bytes, recv_bytes;
  for (int m = 0; m < nodes; ++m) {
    send_bytes.push_back(static_cast<int64_t>(topology.ranks_of_node[m].size() * bytes));
    recv_bytes.push_back(static_cast<int64_t>(local * bytes));
  }
  std::byte* received = op.scratch.Get(1, nodes * local * bytes);
  COLLECTIVED_RETURN_IF_ERROR(
      op.comm.AllToAllV(acc, send_bytes, received, recv_bytes, op.tag, op.timeout));

  for (size_t l = 0; l < local && bytes > 0; ++l) {
    std::byte* out = items[l].single.data;
    std::memcpy(out, received + l * bytes, bytes);
    for (int m = 1; m < nodes; ++m) (*combine)(out, out, received + (m * local + l) * bytes, count);
    COLLECTIVED_RETURN_IF_ERROR(Finalize(first.reduce_op, dtype, out, count, n));
  }
  return Status::Ok();
}

}  // namespace collectived
