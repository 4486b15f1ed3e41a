// InProcessDeviceBackend: a simulated device for the in-process fabric, so that everything the
// engine does with an asynchronous (CUDA) backend is tested without a GPU. It serves
// DeviceKind::kCuda groups whose tensors are host memory labelled as device memory, and behaves
// as NcclBackend does: every memory operation and collective is enqueued on the backend's stream
// and returns at once, the stream runs them in order on a thread of its own (the device),
// WhenComplete reports when the stream got past everything enqueued before it, and Abort ends
// what is queued with PeerLost. Ready events (SimulatedDeviceEvent) hold the stream until the
// "trainer" signals them; completion events are handles the test can read.
//
// The fabric's device controls (InProcessFabric::SetDeviceDelay, HoldDevice,
// AllowDeviceCompletions, ReleaseDevice) make the device slow or stop it before an op's
// completion, to test ordering, bounded depth, back-pressure, aborts and timeouts with many ops
// in flight.
//
// Thread-safety: as DataBackend.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/transport/data_backend.h"
#include "engine/group/transport/in_process/in_process_backend.h"
#include "engine/group/transport/in_process/in_process_fabric.h"

namespace collectived {

// A trainer's "ready" event on the simulated device: the stream waits at AwaitReady until
// Signal.
class SimulatedDeviceEvent final : public DeviceEvent {
 public:
  void Signal();
  // Blocks until signalled or `abandoned()` (checked whenever woken). Returns whether signalled.
  bool Wait(const std::function<bool()>& abandoned);
  // Wakes waiters so that they check `abandoned` again.
  void Nudge();

 private:
  std::mutex mutex_;
  std::condition_variable signalled_;
  bool done_ = false;
};

class InProcessDeviceBackend final : public DataBackend {
 public:
  explicit InProcessDeviceBackend(std::shared_ptr<InProcessLink> link);
  // Stops the stream: what is still queued is dropped, its completions fail with PeerLost.
  ~InProcessDeviceBackend() override;

  DeviceKind device_kind() const override { return DeviceKind::kCuda; }
  BackendCapabilities capabilities() const override { return {false, true}; }
  int node_rank() const override { return link_->node(); }
  int node_count() const override { return link_->node_count(); }

  StatusOr<std::byte*> Scratch(int slot, size_t bytes) override;
  Status Copy(void* dst, const void* src, size_t bytes) override;
  StatusOr<std::byte*> KeptMemory(size_t bytes) override;
  // On the stream, as NcclBackend's: after what is queued before it, also once aborted.
  Status RestoreKept(void* dst, const void* src, size_t bytes) override;
  Status Combine(const ReduceOp& op, DType dtype, void* out, const void* a, const void* b,
                 size_t count) override;
  Status PreScale(const ReduceOp& op, DType dtype, void* data, size_t count) override;
  Status Finalize(const ReduceOp& op, DType dtype, void* data, size_t count,
                  int contributions) override;
  // InvalidArgument for a ready event that is not a SimulatedDeviceEvent.
  Status AwaitReady(const TensorView& tensor) override;
  // "simulated-event:<n>", n counting from 1; the stream marks it reached in order
  // (EventsReached). Its slot in a ring per stream (the fabric's SetCompletionEventRing) says
  // whether it is recorded again while watched (the fabric's DeviceWatchesOf).
  StatusOr<CompletionEvent> RecordCompletionEvent() override;
  // The stream stores the value (a release store) when it gets there; nothing once it failed.
  // Unavailable once the fabric made the device refuse them (RefuseStreamSignals).
  Status EnqueueSignal(const StreamSignal& signal) override;
  void WhenComplete(Done done) override;
  void WhenCompleteAt(const CompletionEvent& event, Done done) override;

  Status AllReduce(void* data, size_t count, DType dtype, const ReduceOp& op, uint32_t tag,
                   Ms timeout) override;
  Status Broadcast(void* data, size_t bytes, int root_node, uint32_t tag, Ms timeout) override;
  Status Reduce(void* data, size_t count, DType dtype, const ReduceOp& op, int root_node,
                uint32_t tag, Ms timeout) override;
  Status AllGatherV(const void* in, void* out, const std::vector<size_t>& bytes_per_node,
                    uint32_t tag, Ms timeout) override;
  Status AllToAllV(const void* in, const std::vector<int64_t>& send_bytes, void* out,
                   const std::vector<int64_t>& recv_bytes, uint32_t tag, Ms timeout) override;
  Status Barrier(uint32_t tag, Ms timeout) override;

  void StartSend(const void* data, size_t bytes, int node, const P2PKey& key, Done done) override;
  void StartRecv(void* data, size_t bytes, int node, const P2PKey& key, Done done) override;
  bool Idle() const override { return link_->Idle(); }

  void Abort() override;

  // Completion events the stream got past, in order (for tests).
  std::vector<std::string> EventsReached() const;

 private:
  // One entry of the stream: work, or an op's completion (done set).
  struct Item {
    std::function<Status()> work;
    Done done;
    bool runs_once_aborted = false;  // RestoreKept's copy: the stream outlives the abort
  };
  void Enqueue(Item item);
  // Enqueues an op's `work`, unless the fabric makes this launch fail (FailDeviceCall).
  Status Launch(std::function<Status()> work);
  void StreamLoop();

  const std::shared_ptr<InProcessLink> link_;
  // The host half the stream's work runs (its collectives over the same link), one call at a
  // time: the stream's own.
  const std::unique_ptr<InProcessBackend> host_;
  std::vector<std::byte> scratch_[3];  // the op's own
  std::vector<std::byte> kept_;        // KeptMemory's

  mutable std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<Item> items_;   // guarded by mutex_
  Status failure_;           // guarded by mutex_: the first error of the stream
  bool aborted_ = false;     // guarded by mutex_
  bool stopping_ = false;    // guarded by mutex_
  uint64_t next_event_ = 1;  // guarded by mutex_
  // The ring of completion events: whether each slot's last recording is being watched.
  std::vector<char> watched_slots_;   // guarded by mutex_; a slot's address is its event
  std::vector<std::string> reached_;  // guarded by mutex_
  std::shared_ptr<SimulatedDeviceEvent> waiting_on_;  // guarded by mutex_: AwaitReady's, now
  std::thread stream_;
};

}  // namespace collectived
