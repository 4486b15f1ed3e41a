// NcclBackend's point-to-point transfers, staged through pinned host memory over the group's
// mesh (MessageTransport) rather than NCCL, which matches sends and receives by call order per
// peer. Apart from the collectives (nccl_backend.cc): no NCCL call is made here.
#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "engine/cuda/cuda_errors.h"
#include "engine/cuda/stream_completions.h"
#include "engine/group/transport/nccl/nccl_backend_internal.h"

namespace collectived {

void NcclBackend::Impl::SendStaged(const std::shared_ptr<StagedSend>& send, const Status& status) {
  std::vector<std::shared_ptr<StagedSend>> failed;
  {
    std::lock_guard<std::mutex> lock(staged_sends_mutex);
    send->copied = status;
    if (status.ok()) send->copy_may_run = false;
    while (!staged_sends.empty() && staged_sends.front()->copied) {
      std::shared_ptr<StagedSend> next = std::move(staged_sends.front());
      staged_sends.pop_front();
      if (staging_failed.ok()) staging_failed = *next->copied;
      if (!staging_failed.ok()) {
        if (next->copied->ok()) next->copied = staging_failed;  // a failed one keeps its own
        failed.push_back(std::move(next));
        continue;
      }
      // The mesh only queues it; its completion comes on the mesh's thread, which must not
      // wait for the device (a cudaFreeHost may): on the executor. That completion may end
      // the group, and this Impl with it, once `done` ran: it first waits for this lock, so
      // that this thread is done with the Impl by then.
      p2p->StartSend(next->staging.data, next->bytes, next->node, next->key,
                     [this, next](const Status& sent) {
                       executor->Post([this, next, sent] {
                         GivePinned(next->staging);
                         { std::lock_guard<std::mutex> released(staged_sends_mutex); }
                         Finish(next->done, sent);
                       });
                     });
    }
  }
  // Each failed send holds its own activity until its `done`: the Impl outlives this loop.
  for (const std::shared_ptr<StagedSend>& unsent : failed) {
    if (unsent->copy_may_run) {
      RetirePinned(unsent->staging.data);  // a copy may still be reading it
    } else if (unsent->staging.data != nullptr) {
      GivePinned(unsent->staging);
    }
    Finish(unsent->done, *unsent->copied);
  }
}

StatusOr<cudaStream_t> NcclBackend::Impl::TakeReceiveStream() {
  std::lock_guard<std::mutex> lock(receive_streams_mutex);
  if (!free_receive_streams.empty()) {
    cudaStream_t taken = free_receive_streams.back();
    free_receive_streams.pop_back();
    return taken;
  }
  cudaStream_t made = nullptr;
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&made, cudaStreamNonBlocking),
                                         Where("cudaStreamCreateWithFlags (receive)")));
  receive_streams.push_back(made);
  return made;
}

void NcclBackend::Impl::GiveReceiveStream(cudaStream_t given) {
  std::lock_guard<std::mutex> lock(receive_streams_mutex);
  free_receive_streams.push_back(given);
}

Status NcclBackend::Impl::StagingAfterStream() {
  std::lock_guard<std::mutex> lock(staging_mutex);
  if (stream_tail == nullptr) {
    COLLECTIVED_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&stream_tail, cudaEventDisableTiming),
                   Where("cudaEventCreateWithFlags (staging)")));
  }
  COLLECTIVED_RETURN_IF_ERROR(
      CudaStatus(cudaEventRecord(stream_tail, stream), Where("cudaEventRecord (staging)")));
  return CudaStatus(cudaStreamWaitEvent(staging_stream, stream_tail, 0),
                    Where("cudaStreamWaitEvent (staging)"));
}

// Point to point: device -> pinned host -> the group's mesh -> pinned host -> device. The staging
// copies are watched by the completion poller, never waited for on a CPU thread: the group's
// stream may be waiting (through a trainer's stream on a stream-signal word) for an op that
// this executor has yet to enqueue.
void NcclBackend::StartSend(const void* data, size_t bytes, int node, const P2PKey& key,
                            Done done) {
  if (!impl_->p2p) {
    done(Status::Internal(impl_->Where("point-to-point transfer with one node")));
    return;
  }
  Impl* impl = impl_.get();
  impl->transfers.fetch_add(1);
  auto send = std::make_shared<Impl::StagedSend>();
  send->bytes = bytes;
  send->node = node;
  send->key = key;
  send->done = std::move(done);
  {
    // In the queue before anything can fail: the peer already has this send's envelope, so a
    // failure here must fail every later send of the queue too (see SendStaged).
    std::lock_guard<std::mutex> lock(impl->staged_sends_mutex);
    impl->staged_sends.push_back(send);
  }
  StatusOr<Impl::PinnedBuffer> pinned = impl->TakePinned(bytes);
  Status staged = pinned.status();
  if (staged.ok()) {
    send->staging = *pinned;
    staged = impl->SetDevice();
  }
  if (staged.ok()) staged = impl->StagingAfterStream();
  if (staged.ok()) {
    staged = CudaStatus(cudaMemcpyAsync(send->staging.data, data, bytes, cudaMemcpyDeviceToHost,
                                        impl->staging_stream),
                        impl->Where("staging a send"));
    std::lock_guard<std::mutex> lock(impl->staged_sends_mutex);
    send->copy_may_run = true;  // also after a failed enqueue: as good as unknown
  }
  if (staged.ok()) {
    // Once the bytes are on the host (on the executor: the poller's callbacks must not block).
    staged = StreamCompletions::Instance().Watch(
        impl->device, impl->staging_stream, nullptr, [impl, send](const Status& copied) {
          impl->executor->Post([impl, send, copied] {
            impl->SendStaged(send, copied.WithContext(impl->Where("staging a send")));
          });
        });
  }
  if (!staged.ok()) impl->SendStaged(send, staged);  // ends it, in its turn
}

void NcclBackend::StartRecv(void* data, size_t bytes, int node, const P2PKey& key, Done done) {
  if (!impl_->p2p) {
    done(Status::Internal(impl_->Where("point-to-point transfer with one node")));
    return;
  }
  Impl* impl = impl_.get();
  impl->transfers.fetch_add(1);
  StatusOr<Impl::PinnedBuffer> pinned = impl->TakePinned(bytes);
  if (!pinned.ok()) {
    impl->Finish(done, pinned.status());
    return;
  }
  const Impl::PinnedBuffer staging = *pinned;
  // The copy to the device goes after what the stream holds now (the tensor's owner's last use:
  // AwaitReady), not after what it holds when the bytes arrive: a later op may wait, through a
  // trainer's stream, for this receive. Bytes to drop (`data` null) are copied nowhere.
  cudaEvent_t posted = nullptr;
  Status marked = impl->SetDevice();
  if (marked.ok() && data != nullptr) {
    marked = CudaStatus(cudaEventCreateWithFlags(&posted, cudaEventDisableTiming),
                        impl->Where("cudaEventCreateWithFlags (receive)"));
    if (marked.ok()) {
      marked = CudaStatus(cudaEventRecord(posted, impl->stream),
                          impl->Where("cudaEventRecord (receive)"));
    }
  }
  if (!marked.ok()) {
    if (posted != nullptr) cudaEventDestroy(posted);
    impl->GivePinned(staging);
    impl->Finish(done, marked);
    return;
  }
  impl->p2p->StartRecv(
      staging.data, bytes, node, key,
      [impl, staging, data, bytes, posted, done = std::move(done)](const Status& status) {
        // The bytes arrived on the mesh's thread, which must not make CUDA calls that may wait:
        // on the executor, with the device current (none is, on its threads).
        impl->executor->Post([impl, staging, data, bytes, posted, status, done] {
          Status result = CudaStatus(cudaSetDevice(impl->device), impl->Where("cudaSetDevice"));
          cudaStream_t copying = nullptr;
          if (result.ok() && status.ok() && data != nullptr) {
            StatusOr<cudaStream_t> taken = impl->TakeReceiveStream();
            result = taken.status();
            if (taken.ok()) copying = *taken;
          }
          if (posted != nullptr) {
            if (copying != nullptr) {
              result = CudaStatus(cudaStreamWaitEvent(copying, posted, 0),
                                  impl->Where("cudaStreamWaitEvent (receive)"));
            }
            cudaEventDestroy(posted);  // released once the wait enqueued on it is past
          }
          if (!status.ok() || data == nullptr) {
            impl->GivePinned(staging);  // no copy was made from it
            impl->Finish(done, status);
            return;
          }
          const bool copy_may_run = result.ok();
          if (copy_may_run) {
            result = CudaStatus(
                cudaMemcpyAsync(data, staging.data, bytes, cudaMemcpyHostToDevice, copying),
                impl->Where("unstaging a receive"));
          }
          // Done once the bytes are on the device (on the executor: see StartSend). The stream
          // serves other receives afterwards, behind whatever of this one it still holds.
          auto copied = [impl, staging, copying, done](const Status& unstaged) {
            impl->executor->Post([impl, staging, copying, done, unstaged] {
              impl->GiveReceiveStream(copying);
              if (unstaged.ok()) {
                impl->GivePinned(staging);
                impl->Finish(done, unstaged);
                return;
              }
              impl->RetirePinned(staging.data);  // a copy may still be writing from it
              impl->Finish(done, unstaged.WithContext(impl->Where("unstaging a receive")));
            });
          };
          if (result.ok()) {
            result = StreamCompletions::Instance().Watch(impl->device, copying, nullptr,
                                                         std::move(copied));
          }
          if (!result.ok()) {
            if (copying != nullptr) impl->GiveReceiveStream(copying);
            if (copy_may_run) {
              impl->RetirePinned(staging.data);  // a copy may still be writing from it
            } else {
              impl->GivePinned(staging);
            }
            impl->Finish(done, result);
          }
        });
      });
}

bool NcclBackend::Idle() const {
  // A transfer counts until just before its `done` runs.
  return impl_->transfers.load() == 0 && (!impl_->p2p || impl_->p2p->Idle());
}

}  // namespace collectived
