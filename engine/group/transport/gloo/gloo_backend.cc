#include "engine/group/transport/gloo/gloo_backend.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/reduce.h>
#include <gloo/types.h>

#include <cstring>

#include "engine/concurrency/executor.h"
#include "engine/group/transport/gloo/gloo_algorithm_peers.h"
#include "engine/group/transport/gloo/gloo_errors.h"
#include "engine/vocabulary/reduce_kernels.h"

namespace collectived {
namespace {

// Gloo learns the element size from the pointer type; these stand in for dtypes of that size.
template <size_t N>
struct Element {
  unsigned char bytes[N];
};

// Calls fn(Element<size>{}) for the dtype's element size.
template <typename Fn>
void WithElementType(DType dtype, Fn&& fn) {
  switch (DTypeSize(dtype)) {
    case 1:
      fn(Element<1>{});
      break;
    case 2:
      fn(Element<2>{});
      break;
    case 4:
      fn(Element<4>{});
      break;
    case 8:
      fn(Element<8>{});
      break;
    default:
      fn(Element<16>{});
      break;
  }
}

// Connects `peers` (those the Gloo algorithm of the call uses; see gloo_algorithm_peers.h) on
// first use, then runs `fn` (the Gloo call) as GlooCall does. Both wait for peer sidecars, in
// GlooCall's one Executor::Blocking scope. Returns the connection's error, else the call's.
template <typename Fn>
Status ConnectAndCall(GlooPairs& context, const std::vector<int>& peers,
                      std::chrono::milliseconds timeout, std::string_view what, Fn&& fn) {
  Status connected;
  Status called = GlooCall(what, [&] {
    connected = context.Connect(peers, timeout);
    if (connected.ok()) fn();
  });
  return connected.ok() ? called : connected;
}

}  // namespace

GlooBackend::GlooBackend(std::shared_ptr<GlooPairs> context, int node_rank, int node_count,
                         std::shared_ptr<MessageTransport> transfers)
    : HostMemoryBackend(std::move(transfers)),
      context_(std::move(context)),
      node_rank_(node_rank),
      node_count_(node_count) {}

Status GlooBackend::AllReduce(void* data, size_t count, DType dtype, const ReduceOp& op,
                              uint32_t tag, Ms timeout) {
  if (node_count_ == 1 || count == 0) return Status::Ok();
  StatusOr<CombineFn> combine = CombineFunction(op, dtype);
  if (!combine.ok()) return combine.status();
  return ConnectAndCall(*context_, GlooRingPeers(node_rank_, node_count_), timeout,
                        "allreduce among sidecars", [&] {
                          gloo::AllreduceOptions options(context_);
                          WithElementType(dtype, [&](auto element) {
                            using T = decltype(element);
                            options.setOutput(static_cast<T*>(data), count);
                          });
                          options.setReduceFunction(gloo::AllreduceOptions::Func(*combine));
                          options.setTag(tag);
                          options.setTimeout(timeout);
                          gloo::allreduce(options);
                        });
}

Status GlooBackend::Broadcast(void* data, size_t bytes, int root_node, uint32_t tag, Ms timeout) {
  if (node_count_ == 1 || bytes == 0) return Status::Ok();
  return ConnectAndCall(*context_, GlooBroadcastPeers(node_rank_, node_count_, root_node), timeout,
                        "broadcast among sidecars", [&] {
                          gloo::BroadcastOptions options(context_);
                          options.setOutput(static_cast<uint8_t*>(data), bytes);
                          options.setRoot(root_node);
                          options.setTag(tag);
                          options.setTimeout(timeout);
                          gloo::broadcast(options);
                        });
}

Status GlooBackend::Reduce(void* data, size_t count, DType dtype, const ReduceOp& op, int root_node,
                           uint32_t tag, Ms timeout) {
  if (node_count_ == 1 || count == 0) return Status::Ok();
  StatusOr<CombineFn> combine = CombineFunction(op, dtype);
  if (!combine.ok()) return combine.status();
  return ConnectAndCall(*context_, GlooReducePeers(node_rank_, node_count_, root_node), timeout,
                        "reduce among sidecars", [&] {
                          gloo::ReduceOptions options(context_);
                          WithElementType(dtype, [&](auto element) {
                            using T = decltype(element);
                            options.setOutput(static_cast<T*>(data), count);
                          });
                          options.setReduceFunction(gloo::ReduceOptions::Func(*combine));
                          options.setRoot(root_node);
                          options.setTag(tag);
                          options.setTimeout(timeout);
                          gloo::reduce(options);
                        });
}

Status GlooBackend::AllGatherV(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                               uint32_t tag, Ms timeout) {
  if (node_count_ == 1) {
    if (in != out && bytes_per_node[0] > 0) std::memmove(out, in, bytes_per_node[0]);
    return Status::Ok();
  }
  return ConnectAndCall(*context_, GlooRingPeers(node_rank_, node_count_), timeout,
                        "allgather among sidecars", [&] {
                          gloo::AllgathervOptions options(context_);
                          options.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)),
                                           bytes_per_node[node_rank_]);
                          options.setOutput(static_cast<uint8_t*>(out), bytes_per_node);
                          options.setTag(tag);
                          options.setTimeout(timeout);
                          gloo::allgatherv(options);
                        });
}

Status GlooBackend::AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                              const std::vector<int64_t>& recv_bytes, uint32_t tag, Ms timeout) {
  if (node_count_ == 1) {
    if (send_bytes[0] > 0) std::memmove(out, in, static_cast<size_t>(send_bytes[0]));
    return Status::Ok();
  }
  return ConnectAndCall(
      *context_, GlooAllPeers(node_rank_, node_count_), timeout, "alltoall among sidecars", [&] {
        gloo::AlltoallvOptions options(context_);
        options.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), send_bytes);
        options.setOutput(static_cast<uint8_t*>(out), recv_bytes);
        options.setTag(tag);
        options.setTimeout(timeout);
        gloo::alltoallv(options);
      });
}

Status GlooBackend::Barrier(uint32_t tag, Ms timeout) {
  if (node_count_ == 1) return Status::Ok();
  return ConnectAndCall(*context_, GlooBarrierPeers(node_rank_, node_count_), timeout,
                        "barrier among sidecars", [&] {
                          gloo::BarrierOptions options(context_);
                          options.setTag(tag);
                          options.setTimeout(timeout);
                          gloo::barrier(options);
                        });
}

void GlooBackend::Abort() {
  if (context_) context_->Close();
}

}  // namespace collectived
