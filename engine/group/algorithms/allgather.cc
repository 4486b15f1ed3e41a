// allgather, allgather_into_tensor, allgather_coalesced and reduce_scatter(_tensor): every local
// input is packed into one node buffer laid out node-major; allgatherv (or alltoallv plus a local
// reduction: a backend need not offer reduce_scatter) moves one buffer per node.
#include "engine/group/algorithms/algorithms.h"

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
  DataBackend& backend = op.backend;
  const int n = topology.group_size;
  const size_t local = op.requests.size();
  std::vector<std::vector<Blocks>> items;
  for (OpRequest* request : op.requests) items.push_back(GatherItems(*request, n));
  // Every item of a rank goes in one contribution (its items back to back), so the op is one
  // network call whatever the number of tensors. Ranks agreed on the total (the signature).
  std::vector<size_t> item_offset;
  size_t per_rank = 0;
  for (const Blocks& item : items[0]) {
    item_offset.push_back(per_rank);
    per_rank += item.single.bytes();
  }
  if (per_rank == 0) return Status::Ok();
  COLLECTIVED_ASSIGN_OR_RETURN(std::byte * packed, backend.Scratch(0, local * per_rank));
  for (size_t l = 0; l < local; ++l) {
    for (size_t item = 0; item < items[l].size(); ++item) {
      const TensorView& in = items[l][item].single;
      COLLECTIVED_RETURN_IF_ERROR(
          backend.Copy(packed + l * per_rank + item_offset[item], in.data, in.bytes()));
    }
  }
  COLLECTIVED_ASSIGN_OR_RETURN(std::byte * gathered, backend.Scratch(1, n * per_rank));
  std::vector<size_t> bytes_per_node;
  for (const auto& ranks : topology.ranks_of_node)
    bytes_per_node.push_back(ranks.size() * per_rank);
  COLLECTIVED_RETURN_IF_ERROR(
      backend.AllGatherV(packed, gathered, bytes_per_node, op.tags.Data<0>(), op.timeout));
  for (size_t l = 0; l < local; ++l) {
    for (size_t item = 0; item < items[l].size(); ++item) {
      for (int rank = 0; rank < n; ++rank) {
        const TensorView& out = items[l][item].per_rank[rank];
        COLLECTIVED_RETURN_IF_ERROR(backend.Copy(
            out.data, gathered + topology.node_major_position[rank] * per_rank + item_offset[item],
            out.bytes()));
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
  const ReduceOp& reduce_op = first.reduce_op;
  DataBackend& backend = op.backend;
  std::vector<Blocks> items;
  for (OpRequest* request : op.requests) items.push_back(ScatterItem(*request, n));

  // Local reduction of every rank's block, laid out node-major so each node's blocks are
  // contiguous for the alltoallv.
  COLLECTIVED_ASSIGN_OR_RETURN(std::byte * acc, backend.Scratch(0, n * bytes));
  for (int rank = 0; rank < n && bytes > 0; ++rank) {
    std::byte* block = acc + topology.node_major_position[rank] * bytes;
    COLLECTIVED_RETURN_IF_ERROR(backend.Copy(block, items[0].per_rank[rank].data, bytes));
    for (size_t l = 1; l < items.size(); ++l) {
      COLLECTIVED_RETURN_IF_ERROR(
          backend.Combine(reduce_op, dtype, block, block, items[l].per_rank[rank].data, count));
    }
  }
  COLLECTIVED_RETURN_IF_ERROR(backend.PreScale(reduce_op, dtype, acc, n * count));

  const int nodes = topology.node_count();
  const size_t local = topology.local_ranks().size();
  std::vector<int64_t> send_bytes, recv_bytes;
  for (int m = 0; m < nodes; ++m) {
    send_bytes.push_back(static_cast<int64_t>(topology.ranks_of_node[m].size() * bytes));
    recv_bytes.push_back(static_cast<int64_t>(local * bytes));
  }
  COLLECTIVED_ASSIGN_OR_RETURN(std::byte * received, backend.Scratch(1, nodes * local * bytes));
  COLLECTIVED_RETURN_IF_ERROR(
      backend.AllToAllV(acc, send_bytes, received, recv_bytes, op.tags.Data<0>(), op.timeout));

  for (size_t l = 0; l < local && bytes > 0; ++l) {
    std::byte* out = items[l].single.data;
    COLLECTIVED_RETURN_IF_ERROR(backend.Copy(out, received + l * bytes, bytes));
    for (int m = 1; m < nodes; ++m) {
      COLLECTIVED_RETURN_IF_ERROR(
          backend.Combine(reduce_op, dtype, out, out, received + (m * local + l) * bytes, count));
    }
    COLLECTIVED_RETURN_IF_ERROR(backend.Finalize(reduce_op, dtype, out, count, n));
  }
  return Status::Ok();
}

}  // namespace collectived
