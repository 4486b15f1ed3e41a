// alltoall, alltoall_single, gather and scatter: all are "rank a sends block (a -> b) to rank b"
// with some blocks empty. Blocks between local ranks are copied directly; blocks for other nodes
// are packed per node and moved with one alltoallv.
#include "engine/group/algorithms/algorithms.h"

namespace collectived {
namespace {

struct Exchange {
  std::vector<TensorView> send;  // send[b]: block for rank b (count 0 = nothing)
  std::vector<TensorView> recv;  // recv[b]: block from rank b
};

Exchange BlocksOf(const OpRequest& r, int rank, int n) {
  Exchange e;
  e.send.resize(n);
  e.recv.resize(n);
  switch (r.kind) {
    case OpKind::kAllToAll:
      e.send = r.inputs;
      e.recv = r.outputs;
      break;
    case OpKind::kAllToAllSingle: {
      size_t in = 0, out = 0;
      for (int b = 0; b < n; ++b) {
        e.send[b] = r.inputs[0].Slice(in, r.input_splits[b]);
        e.recv[b] = r.outputs[0].Slice(out, r.output_splits[b]);
        in += r.input_splits[b];
        out += r.output_splits[b];
      }
      break;
    }
    case OpKind::kGather:
      e.send[r.root] = r.inputs[0];
      if (rank == r.root) e.recv = r.outputs;
      break;
    default:  // kScatter
      if (rank == r.root) e.send = r.inputs;
      e.recv[r.root] = r.outputs[0];
      break;
  }
  return e;
}

}  // namespace

std::vector<int64_t> SendCounts(const OpRequest& request, int rank, int n) {
  std::vector<int64_t> counts;
  for (const TensorView& t : BlocksOf(request, rank, n).send)
    counts.push_back(static_cast<int64_t>(t.count));
  return counts;
}

std::vector<int64_t> RecvCounts(const OpRequest& request, int rank, int n) {
  std::vector<int64_t> counts;
  for (const TensorView& t : BlocksOf(request, rank, n).recv)
    counts.push_back(static_cast<int64_t>(t.count));
  return counts;
}

Status RunAllToAll(OpContext& op) {
  const GroupTopology& topology = op.topology;
  const int n = topology.group_size;
  const std::vector<int>& local = topology.local_ranks();
  std::vector<Exchange> blocks;
  for (size_t l = 0; l < local.size(); ++l)
    blocks.push_back(BlocksOf(*op.requests[l], local[l], n));

  // Between local ranks: copy.
  for (size_t a = 0; a < local.size(); ++a) {
    for (size_t b = 0; b < local.size(); ++b) {
      const TensorView& from = blocks[a].send[local[b]];
      const TensorView& to = blocks[b].recv[local[a]];
      COLLECTIVED_RETURN_IF_ERROR(op.backend.Copy(to.data, from.data, from.bytes()));
    }
  }
  const int nodes = topology.node_count();
  if (nodes == 1) return Status::Ok();

  // To and from other nodes: pack per node, in (local sender, remote receiver) rank order.
  std::vector<int64_t> send_bytes(nodes, 0), recv_bytes(nodes, 0);
  for (int m = 0; m < nodes; ++m) {
    if (m == topology.my_node) continue;
    for (size_t a = 0; a < local.size(); ++a) {
      for (int b : topology.ranks_of_node[m]) {
        send_bytes[m] += static_cast<int64_t>(blocks[a].send[b].bytes());
        recv_bytes[m] += static_cast<int64_t>(blocks[a].recv[b].bytes());
      }
    }
  }
  int64_t send_total = 0, recv_total = 0;
  for (int m = 0; m < nodes; ++m) {
    send_total += send_bytes[m];
    recv_total += recv_bytes[m];
  }
  COLLECTIVED_ASSIGN_OR_RETURN(std::byte * packed,
                               op.backend.Scratch(0, static_cast<size_t>(send_total)));
  COLLECTIVED_ASSIGN_OR_RETURN(std::byte * received,
                               op.backend.Scratch(1, static_cast<size_t>(recv_total)));
  std::byte* cursor = packed;
  for (int m = 0; m < nodes; ++m) {
    if (m == topology.my_node) continue;
    for (size_t a = 0; a < local.size(); ++a) {
      for (int b : topology.ranks_of_node[m]) {
        const TensorView& t = blocks[a].send[b];
        COLLECTIVED_RETURN_IF_ERROR(op.backend.Copy(cursor, t.data, t.bytes()));
        cursor += t.bytes();
      }
    }
  }
  COLLECTIVED_RETURN_IF_ERROR(op.backend.AllToAllV(packed, send_bytes, received, recv_bytes,
                                                   op.tags.Data<0>(), op.timeout));
  // Node m sent, for each of its ranks a' in order, the blocks for our ranks in order.
  cursor = received;
  for (int m = 0; m < nodes; ++m) {
    if (m == topology.my_node) continue;
    for (int sender : topology.ranks_of_node[m]) {
      for (size_t b = 0; b < local.size(); ++b) {
        const TensorView& t = blocks[b].recv[sender];
        COLLECTIVED_RETURN_IF_ERROR(op.backend.Copy(t.data, cursor, t.bytes()));
        cursor += t.bytes();
      }
    }
  }
  return Status::Ok();
}

}  // namespace collectived
