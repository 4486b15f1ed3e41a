#include "engine/group/transport/in_process/in_process_backend.h"

#include <cstring>

#include "engine/vocabulary/reduce_kernels.h"
#include "engine/vocabulary/work.h"

namespace collectived {

InProcessBackend::InProcessBackend(std::shared_ptr<InProcessLink> link)
    : HostMemoryBackend(link), link_(std::move(link)) {}

Status InProcessBackend::ReceiveAndCombine(void* data, size_t count, DType dtype,
                                           const ReduceOp& op, uint32_t tag, Ms timeout,
                                           std::string_view what) {
  StatusOr<CombineFn> combine = CombineFunction(op, dtype);
  if (!combine.ok()) return combine.status();
  const int nodes = node_count();
  const int me = node_rank();
  const size_t bytes = count * DTypeSize(dtype);
  contributions_.resize(bytes * nodes);
  const auto deadline = link_->clock().After(timeout);
  for (int node = 0; node < nodes; ++node) {
    std::byte* slot = contributions_.data() + bytes * node;
    if (node == me) {
      std::memcpy(slot, data, bytes);
    } else {
      COLLECTIVED_RETURN_IF_ERROR(link_->Receive(node, tag, slot, bytes, deadline, timeout, what));
    }
  }
  (*combine)(data, contributions_.data(), contributions_.data() + bytes, count);
  for (int node = 2; node < nodes; ++node)
    (*combine)(data, data, contributions_.data() + bytes * node, count);
  return Status::Ok();
}

Status InProcessBackend::AllReduce(void* data, size_t count, DType dtype, const ReduceOp& op,
                                   uint32_t tag, Ms timeout) {
  if (node_count() == 1 || count == 0) return Status::Ok();
  constexpr std::string_view kWhat = "allreduce among sidecars";
  COLLECTIVED_RETURN_IF_ERROR(link_->Delay(kWhat));
  for (int node = 0; node < node_count(); ++node) {
    if (node != node_rank())
      COLLECTIVED_RETURN_IF_ERROR(link_->Send(node, tag, data, count * DTypeSize(dtype), kWhat));
  }
  return ReceiveAndCombine(data, count, dtype, op, tag, timeout, kWhat);
}

Status InProcessBackend::Broadcast(void* data, size_t bytes, int root_node, uint32_t tag,
                                   Ms timeout) {
  if (node_count() == 1 || bytes == 0) return Status::Ok();
  constexpr std::string_view kWhat = "broadcast among sidecars";
  COLLECTIVED_RETURN_IF_ERROR(link_->Delay(kWhat));
  if (node_rank() != root_node) {
    return link_->Receive(root_node, tag, data, bytes, link_->clock().After(timeout), timeout,
                          kWhat);
  }
  for (int node = 0; node < node_count(); ++node) {
    if (node != root_node) COLLECTIVED_RETURN_IF_ERROR(link_->Send(node, tag, data, bytes, kWhat));
  }
  return Status::Ok();
}

Status InProcessBackend::Reduce(void* data, size_t count, DType dtype, const ReduceOp& op,
                                int root_node, uint32_t tag, Ms timeout) {
  if (node_count() == 1 || count == 0) return Status::Ok();
  constexpr std::string_view kWhat = "reduce among sidecars";
  COLLECTIVED_RETURN_IF_ERROR(link_->Delay(kWhat));
  if (node_rank() != root_node) {
    return link_->Send(root_node, tag, data, count * DTypeSize(dtype), kWhat);
  }
  return ReceiveAndCombine(data, count, dtype, op, tag, timeout, kWhat);
}

Status InProcessBackend::AllGatherV(const void* in, void* out,
                                    const std::vector<size_t>& bytes_per_node, uint32_t tag,
                                    Ms timeout) {
  return link_->AllGatherV(in, out, bytes_per_node, tag, timeout, "allgather among sidecars");
}

Status InProcessBackend::AllToAllV(const void* in, const std::vector<int64_t>& send_bytes,
                                   void* out, const std::vector<int64_t>& recv_bytes, uint32_t tag,
                                   Ms timeout) {
  const int nodes = node_count();
  const int me = node_rank();
  constexpr std::string_view kWhat = "alltoall among sidecars";
  if (send_bytes[me] != recv_bytes[me]) {
    std::string what(kWhat);
    return Status::InvalidArgument(what + ": sidecar node " + std::to_string(me) +
                                   " sends itself " + std::to_string(send_bytes[me]) +
                                   " bytes but expects " + std::to_string(recv_bytes[me]));
  }
  const auto* from = static_cast<const std::byte*>(in);
  auto* to = static_cast<std::byte*>(out);
  std::vector<size_t> send_offset(nodes, 0), recv_offset(nodes, 0);
  for (int node = 1; node < nodes; ++node) {
    send_offset[node] = send_offset[node - 1] + static_cast<size_t>(send_bytes[node - 1]);
    recv_offset[node] = recv_offset[node - 1] + static_cast<size_t>(recv_bytes[node - 1]);
  }
  if (nodes > 1) COLLECTIVED_RETURN_IF_ERROR(link_->Delay(kWhat));
  for (int node = 0; node < nodes; ++node) {
    if (node == me) continue;
    COLLECTIVED_RETURN_IF_ERROR(link_->Send(node, tag, from + send_offset[node],
                                            static_cast<size_t>(send_bytes[node]), kWhat));
  }
  if (send_bytes[me] > 0) {
    std::memmove(to + recv_offset[me], from + send_offset[me], static_cast<size_t>(send_bytes[me]));
  }
  const auto deadline = link_->clock().After(timeout);
  for (int node = 0; node < nodes; ++node) {
    if (node == me) continue;
    COLLECTIVED_RETURN_IF_ERROR(link_->Receive(node, tag, to + recv_offset[node],
                                               static_cast<size_t>(recv_bytes[node]), deadline,
                                               timeout, kWhat));
  }
  return Status::Ok();
}

Status InProcessBackend::Barrier(uint32_t tag, Ms timeout) {
  if (node_count() == 1) return Status::Ok();
  return link_->AllGatherV(nullptr, nullptr, std::vector<size_t>(node_count(), 0), tag, timeout,
                           "barrier among sidecars");
}

void InProcessBackend::Abort() {
  link_->Close("sidecar node " + std::to_string(node_rank()) + " aborted its connections");
}

}  // namespace collectived
