// NodeComm: the communicator among the sidecars (nodes) of one group, over a Gloo context built
// with the option-style API only (mixing in old algorithm classes slows a context down 100x).
// With one node there is no context and every collective is a no-op.
//
// Every call takes a timeout and turns Gloo's exceptions into a Status (PeerLost when a peer
// closed its connection, Timeout when Gloo timed out). Collectives must be issued in the same
// order on every node (the group executor guarantees it); Send/Recv may run concurrently with
// them on other threads.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/dtype.h"
#include "engine/reduce_kernels.h"
#include "engine/status.h"

namespace gloo {
class Context;
}

namespace collectived {

class NodeComm {
 public:
  // `context` may be null when the group lives on one node.
  NodeComm(std::shared_ptr<gloo::Context> context, int node_rank, int node_count);
  ~NodeComm();

  int rank() const { return node_rank_; }
  int size() const { return node_count_; }

  using Ms = std::chrono::milliseconds;

  // In place: data (count elements of dtype) becomes the combination over all nodes.
  Status AllReduce(void* data, size_t count, DType dtype, CombineFn combine, uint32_t tag,
                   Ms timeout);
  // In place: the root node's bytes are copied to every node.
  Status Broadcast(void* data, size_t bytes, int root_node, uint32_t tag, Ms timeout);
  // In place: on root_node, data becomes the combination over all nodes; elsewhere it is scratch.
  Status Reduce(void* data, size_t count, DType dtype, CombineFn combine, int root_node,
                uint32_t tag, Ms timeout);
  // Node i contributes bytes_per_node[i] bytes; out receives them concatenated in node order.
  Status AllGatherV(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                    uint32_t tag, Ms timeout);
  // Sends send_bytes[i] bytes (consecutive in `in`) to node i and receives recv_bytes[i] bytes
  // from node i into consecutive ranges of `out`.
  Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                   const std::vector<int64_t>& recv_bytes, uint32_t tag, Ms timeout);
  Status Barrier(uint32_t tag, Ms timeout);
  // Point to point on a slot chosen by the caller (see P2PSlot); blocking until done.
  Status Send(const void* data, size_t bytes, int node, uint64_t slot, Ms timeout);
  Status Recv(void* data, size_t bytes, int node, uint64_t slot, Ms timeout);

  // Closes every connection: blocked calls on this node and on the peers fail at once.
  void Close();

 private:
  const std::shared_ptr<gloo::Context> context_;
  const int node_rank_;
  const int node_count_;
};

// A Gloo slot for point-to-point messages that cannot collide with Gloo's collectives.
uint64_t P2PSlot(int src_rank, int dst_rank, int64_t tag);

}  // namespace collectived
