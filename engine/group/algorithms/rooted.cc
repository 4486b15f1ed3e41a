// broadcast and reduce: rooted ops whose network step is a broadcast/reduce among nodes.
#include "engine/group/algorithms/algorithms.h"

namespace collectived {

Status RunBroadcast(OpContext& op) {
  const GroupTopology& topology = op.topology;
  std::vector<OpRequest*>& requests = op.requests;
  const int root = requests[0]->root;
  const int root_node = topology.node_of_rank[root];
  const size_t bytes = requests[0]->inputs[0].bytes();
  // The root's tensor on the root's node; the first local tensor elsewhere receives it.
  int source = root_node == topology.my_node ? topology.LocalIndex(root) : 0;
  std::byte* data = requests[source]->inputs[0].data;
  COLLECTIVED_RETURN_IF_ERROR(
      op.backend.Broadcast(data, bytes, root_node, op.tags.Data<0>(), op.timeout));
  for (size_t l = 0; l < requests.size(); ++l) {
    if (static_cast<int>(l) != source) {
      COLLECTIVED_RETURN_IF_ERROR(op.backend.Copy(requests[l]->inputs[0].data, data, bytes));
    }
  }
  return Status::Ok();
}

Status RunReduce(OpContext& op) {
  const GroupTopology& topology = op.topology;
  DataBackend& backend = op.backend;
  std::vector<OpRequest*>& requests = op.requests;
  const OpRequest& first = *requests[0];
  const DType dtype = first.inputs[0].dtype;
  const size_t count = first.inputs[0].count;
  const size_t bytes = first.inputs[0].bytes();
  const ReduceOp& reduce_op = first.reduce_op;
  // Inputs of non-root ranks stay untouched: accumulate in scratch.
  COLLECTIVED_ASSIGN_OR_RETURN(std::byte * acc, backend.Scratch(0, bytes));
  COLLECTIVED_RETURN_IF_ERROR(backend.Copy(acc, first.inputs[0].data, bytes));
  for (size_t l = 1; l < requests.size(); ++l) {
    COLLECTIVED_RETURN_IF_ERROR(
        backend.Combine(reduce_op, dtype, acc, acc, requests[l]->inputs[0].data, count));
  }
  COLLECTIVED_RETURN_IF_ERROR(backend.PreScale(reduce_op, dtype, acc, count));
  const int root_node = topology.node_of_rank[first.root];
  COLLECTIVED_RETURN_IF_ERROR(
      backend.Reduce(acc, count, dtype, reduce_op, root_node, op.tags.Data<0>(), op.timeout));
  if (root_node == topology.my_node) {
    COLLECTIVED_RETURN_IF_ERROR(
        backend.Finalize(reduce_op, dtype, acc, count, topology.group_size));
    int root_index = topology.LocalIndex(first.root);
    COLLECTIVED_RETURN_IF_ERROR(backend.Copy(requests[root_index]->inputs[0].data, acc, bytes));
  }
  return Status::Ok();
}

}  // namespace collectived
