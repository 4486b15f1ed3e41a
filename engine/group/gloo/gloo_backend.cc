#include "engine/group/gloo/gloo_backend.h"

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/context.h>
#include <gloo/reduce.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <cstring>
#include <functional>

#include "engine/group/gloo/gloo_errors.h"
#include "engine/reduce_kernels.h"

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

}  // namespace

uint64_t GlooP2PSlot(const DataBackend::P2PKey& key) {
  uint64_t h = std::hash<int64_t>{}(key.tag);
  h ^= (static_cast<uint64_t>(key.source) * 0x9E3779B97F4A7C15ull) +
       (static_cast<uint64_t>(key.destination) << 20);
  // Gloo's collectives use slot prefixes 0x01..0x0f; 0xf1 is ours.
  return gloo::Slot::build(0xf1, static_cast<uint32_t>(h ^ (h >> 32)));
}

GlooBackend::GlooBackend(std::shared_ptr<gloo::Context> context, int node_rank, int node_count)
    : context_(std::move(context)), node_rank_(node_rank), node_count_(node_count) {}

GlooBackend::~GlooBackend() {
  std::list<Transfer> transfers;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    transfers.swap(transfers_);
  }
  for (Transfer& t : transfers) t.thread.join();
}

Status GlooBackend::AllReduce(void* data, size_t count, DType dtype, const ReduceOp& op,
                              uint32_t tag, Ms timeout) {
  if (node_count_ == 1 || count == 0) return Status::Ok();
  StatusOr<CombineFn> combine = CombineFunction(op, dtype);
  if (!combine.ok()) return combine.status();
  return GlooCall("allreduce among sidecars", [&] {
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
  return GlooCall("broadcast among sidecars", [&] {
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
  return GlooCall("reduce among sidecars", [&] {
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

Status GlooAllGatherV(const std::shared_ptr<gloo::Context>& context, int node_rank, int node_count,
                      const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                      uint32_t tag, std::chrono::milliseconds timeout, std::string_view what) {
  if (node_count == 1) {
    if (in != out && bytes_per_node[0] > 0) std::memmove(out, in, bytes_per_node[0]);
    return Status::Ok();
  }
  return GlooCall(what, [&] {
    gloo::AllgathervOptions options(context);
    options.setInput(const_cast<uint8_t*>(static_cast<const uint8_t*>(in)),
                     bytes_per_node[node_rank]);
    options.setOutput(static_cast<uint8_t*>(out), bytes_per_node);
    options.setTag(tag);
    options.setTimeout(timeout);
    gloo::allgatherv(options);
  });
}

Status GlooBackend::AllGatherV(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                               uint32_t tag, Ms timeout) {
  return GlooAllGatherV(context_, node_rank_, node_count_, in, out, bytes_per_node, tag, timeout,
                        "allgather among sidecars");
}

Status GlooBackend::AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                              const std::vector<int64_t>& recv_bytes, uint32_t tag, Ms timeout) {
  if (node_count_ == 1) {
    if (send_bytes[0] > 0) std::memmove(out, in, static_cast<size_t>(send_bytes[0]));
    return Status::Ok();
  }
  return GlooCall("alltoall among sidecars", [&] {
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
  return GlooCall("barrier among sidecars", [&] {
    gloo::BarrierOptions options(context_);
    options.setTag(tag);
    options.setTimeout(timeout);
    gloo::barrier(options);
  });
}

void GlooBackend::StartSend(const void* data, size_t bytes, int node, P2PKey key, Ms timeout,
                            Done done) {
  StartTransfer(true, const_cast<void*>(data), bytes, node, key, timeout, std::move(done));
}

void GlooBackend::StartRecv(void* data, size_t bytes, int node, P2PKey key, Ms timeout, Done done) {
  StartTransfer(false, data, bytes, node, key, timeout, std::move(done));
}

void GlooBackend::StartTransfer(bool is_send, void* data, size_t bytes, int node, P2PKey key,
                                Ms timeout, Done done) {
  ReapFinishedTransfers();
  if (!context_) {
    done(Status::Internal("point-to-point transfer on a group with one sidecar"));
    return;
  }
  const std::string_view what =
      is_send ? "send to another sidecar" : "receive from another sidecar";
  Status refused;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<gloo::transport::UnboundBuffer> buffer;
    if (aborted_) {
      refused = Status::PeerLost(std::string(what) + ": the group's connections were closed");
    } else {
      refused = GlooCall(what, [&] {
        buffer = context_->createUnboundBuffer(data, bytes);
        if (is_send) {
          buffer->send(node, GlooP2PSlot(key));
        } else {
          buffer->recv(node, GlooP2PSlot(key));
        }
      });
    }
    if (refused.ok()) {
      auto finished = std::make_shared<std::atomic<bool>>(false);
      // Registered before the thread starts, so Idle() never misses a transfer whose callback
      // runs.
      Transfer& transfer = transfers_.emplace_back();
      transfer.finished = finished;
      transfer.buffer = buffer;
      transfer.is_send = is_send;
      transfer.thread =
          std::thread([what, is_send, timeout, buffer, done = std::move(done), finished] {
            bool completed = true;
            Status status = GlooCall(what, [&] {
              completed = is_send ? buffer->waitSend(timeout) : buffer->waitRecv(timeout);
            });
            if (status.ok() && !completed) {
              status =
                  Status::PeerLost(std::string(what) + ": the group's connections were closed");
            }
            done(status);
            finished->store(true);
          });
      return;
    }
  }
  done(refused);  // outside the lock: `done` may abort this backend
}

void GlooBackend::ReapFinishedTransfers() {
  std::list<Transfer> finished;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = transfers_.begin(); it != transfers_.end();) {
      auto next = std::next(it);
      if (it->finished->load()) finished.splice(finished.end(), transfers_, it);
      it = next;
    }
  }
  for (Transfer& t : finished) t.thread.join();
}

bool GlooBackend::Idle() const {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Transfer& t : transfers_) {
    if (!t.finished->load()) return false;
  }
  return true;
}

void GlooBackend::Abort() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;
    for (Transfer& t : transfers_) {
      if (t.finished->load()) continue;
      if (t.is_send) {
        t.buffer->abortWaitSend();
      } else {
        t.buffer->abortWaitRecv();
      }
    }
  }
  if (context_) context_->closeConnections();
}

}  // namespace collectived
