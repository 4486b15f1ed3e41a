#include "engine/group/node_comm.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/reduce.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <cstring>
#include <functional>

namespace collectived {
namespace {

// Gloo learns the element size from the pointer type; these stand in for dtypes of that size.
template <size_t N>
struct Element {
  unsigned char bytes[N];
};

Status FromGlooException(const std::exception& error, std::string_view what) {
  std::string message = std::string(what) + ": " + error.what();
  if (message.find("Timed out") != std::string::npos ||
      message.find("timed out") != std::string::npos) {
    return Status::Timeout("Timeout in " + message);
  }
  return Status::PeerLost(message);
}

template <typename Fn>
Status Guard(std::string_view what, Fn&& fn) {
  try {
    fn();
    return Status::Ok();
  } catch (const std::exception& error) {
    return FromGlooException(error, what);
  }
}

// Calls fn.template operator()<Element<size>>() for the dtype's element size.
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

}  // namespace

uint64_t P2PSlot(int src_rank, int dst_rank, int64_t tag) {
  uint64_t h = std::hash<int64_t>{}(tag);
  h ^= (static_cast<uint64_t>(src_rank) * 0x9E3779B97F4A7C15ull) +
       (static_cast<uint64_t>(dst_rank) << 20);
  // Gloo's collectives use slot prefixes 0x01..0x0f; 0xf1 is ours.
  return gloo::Slot::build(0xf1, static_cast<uint32_t>(h ^ (h >> 32)));
}

NodeComm::NodeComm(std::shared_ptr<gloo::Context> context, int node_rank, int node_count)
    : context_(std::move(context)), node_rank_(node_rank), node_count_(node_count) {}

NodeComm::~NodeComm() = default;

void NodeComm::Close() {
  if (context_) context_->closeConnections();
}

Status NodeComm::AllReduce(void* data, size_t count, DType dtype, CombineFn combine, uint32_t tag,
                           Ms timeout) {
  if (node_count_ == 1 || count == 0) return Status::Ok();
  return Guard("allreduce among sidecars", [&] {
    gloo::AllreduceOptions options(context_);
    WithElementType(dtype, [&](auto element) {
      using T = decltype(element);
      options.setOutput(static_cast<T*>(data), count);
    });
    options.setReduceFunction(gloo::AllreduceOptions::Func(combine));
    options.setTag(tag);
    options.setTimeout(timeout);
    gloo::allreduce(options);
  });
}

Status NodeComm::Broadcast(void* data, size_t bytes, int root_node, uint32_t tag, Ms timeout) {
  if (node_count_ == 1 || bytes == 0) return Status::Ok();
  return Guard("broadcast among sidecars", [&] {
    gloo::BroadcastOptions options(context_);
    options.setOutput(static_cast<uint8_t*>(data), bytes);
    options.setRoot(root_node);
    options.setTag(tag);
    options.setTimeout(timeout);
    gloo::broadcast(options);
  });
}

Status NodeComm::Reduce(void* data, size_t count, DType dtype, CombineFn combine, int root_node,
                        uint32_t tag, Ms timeout) {
  if (node_count_ == 1 || count == 0) return Status::Ok();
  return Guard("reduce among sidecars", [&] {
    gloo::ReduceOptions options(context_);
    WithElementType(dtype, [&](auto element) {
      using T = decltype(element);
      options.setOutput(static_cast<T*>(data), count);
    });
    options.setReduceFunction(gloo::ReduceOptions::Func(combine));
    options.setRoot(root_node);
    options.setTag(tag);
    options.setTimeout(timeout);
    gloo::reduce(options);
  });
}

Status NodeComm::AllGatherV(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                            uint32_t tag, Ms timeout) {
  if (node_count_ == 1) {
    if (in != out && bytes_per_node[0] > 0) std::memmove(out, in, bytes_per_node[0]);
    return Status::Ok();
  }
  return Guard("allgather among sidecars", [&] {
    gloo::AllgathervOptions options(context_);
    options.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)),
                     bytes_per_node[node_rank_]);
    options.setOutput(static_cast<uint8_t*>(out), bytes_per_node);
    options.setTag(tag);
    options.setTimeout(timeout);
    gloo::allgatherv(options);
  });
}

Status NodeComm::AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                           const std::vector<int64_t>& recv_bytes, uint32_t tag, Ms timeout) {
  if (node_count_ == 1) {
    if (send_bytes[0] > 0) std::memmove(out, in, static_cast<size_t>(send_bytes[0]));
    return Status::Ok();
  }
  return Guard("alltoall among sidecars", [&] {
    gloo::AlltoallvOptions options(context_);
    options.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)), send_bytes);
    options.setOutput(static_cast<uint8_t*>(out), recv_bytes);
    options.setTag(tag);
    options.setTimeout(timeout);
    gloo::alltoallv(options);
  });
}

Status NodeComm::Barrier(uint32_t tag, Ms timeout) {
  if (node_count_ == 1) return Status::Ok();
  return Guard("barrier among sidecars", [&] {
    gloo::BarrierOptions options(context_);
    options.setTag(tag);
    options.setTimeout(timeout);
    gloo::barrier(options);
  });
}

Status NodeComm::Send(const void* data, size_t bytes, int node, uint64_t slot, Ms timeout) {
  return Guard("send to another sidecar", [&] {
    auto buffer = context_->createUnboundBuffer(const_cast<void*>(data), bytes);
    buffer->send(node, slot);
    buffer->waitSend(timeout);
  });
}

Status NodeComm::Recv(void* data, size_t bytes, int node, uint64_t slot, Ms timeout) {
  return Guard("receive from another sidecar", [&] {
    auto buffer = context_->createUnboundBuffer(data, bytes);
    buffer->recv(node, slot);
    buffer->waitRecv(timeout);
  });
}

}  // namespace collectived
