#include "engine/group/transport/in_process/in_process_device_backend.h"

#include <future>
#include <new>

namespace collectived {

void SimulatedDeviceEvent::Signal() {
  std::lock_guard<std::mutex> lock(mutex_);
  done_ = true;
  signalled_.notify_all();
}

bool SimulatedDeviceEvent::Wait(const std::function<bool()>& abandoned) {
  std::unique_lock<std::mutex> lock(mutex_);
  signalled_.wait(lock, [&] { return done_ || abandoned(); });
  return done_;
}

void SimulatedDeviceEvent::Nudge() {
  std::lock_guard<std::mutex> lock(mutex_);
  signalled_.notify_all();
}

InProcessDeviceBackend::InProcessDeviceBackend(std::shared_ptr<InProcessLink> link)
    : link_(std::move(link)), host_(std::make_unique<InProcessBackend>(link_)) {
  stream_ = std::thread([this] { StreamLoop(); });
}

InProcessDeviceBackend::~InProcessDeviceBackend() {
  std::shared_ptr<SimulatedDeviceEvent> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    aborted_ = true;
    waiting = waiting_on_;
  }
  queued_.notify_all();
  if (waiting) waiting->Nudge();
  stream_.join();
}

Status InProcessDeviceBackend::Launch(std::function<Status()> work) {
  COLLECTIVED_RETURN_IF_ERROR(link_->NextDeviceLaunch());
  Enqueue(Item{std::move(work), nullptr});
  return Status::Ok();
}

void InProcessDeviceBackend::Enqueue(Item item) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    items_.push_back(std::move(item));
  }
  queued_.notify_all();
}

void InProcessDeviceBackend::StreamLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    queued_.wait(lock, [&] { return stopping_ || !items_.empty(); });
    if (items_.empty()) break;
    Item item = std::move(items_.front());
    items_.pop_front();
    const bool aborted = aborted_;
    const Status failed = failure_;
    lock.unlock();
    if (item.done) {
      Status result = aborted ? Status::PeerLost("the simulated device of sidecar node " +
                                                 std::to_string(link_->node()) + " was aborted")
                              : failed;
      // The device may be slow or stopped before an op's completion (the fabric's controls).
      if (result.ok()) result = link_->AwaitDeviceCompletion();
      item.done(result);
    } else if (item.runs_once_aborted || (!aborted && failed.ok())) {
      Status status = item.work();
      if (!status.ok()) {
        std::lock_guard<std::mutex> relock(mutex_);
        if (failure_.ok()) failure_ = status;
      }
    }
    item = Item{};  // what it holds goes before the next item runs
    lock.lock();
  }
}

StatusOr<std::byte*> InProcessDeviceBackend::Scratch(int slot, size_t bytes) {
  if (slot < 0 || slot >= 3) return Status::Internal("scratch slot " + std::to_string(slot));
  std::vector<std::byte>& buffer = scratch_[slot];
  if (buffer.size() < bytes) {
    std::vector<std::byte> larger;
    try {
      larger.resize(bytes);
    } catch (const std::bad_alloc&) {
      return Status::ResourceExhausted("the sidecar cannot allocate " + std::to_string(bytes) +
                                       " bytes of scratch memory for the op");
    }
    // Work still queued may use the old buffer: it goes once the stream got past that work.
    auto retired = std::make_shared<std::vector<std::byte>>(std::move(buffer));
    Enqueue(Item{[retired]() mutable {
                   retired.reset();
                   return Status::Ok();
                 },
                 nullptr});
    buffer = std::move(larger);
  }
  return buffer.data();
}

Status InProcessDeviceBackend::Copy(void* dst, const void* src, size_t bytes) {
  return Launch([this, dst, src, bytes] { return host_->Copy(dst, src, bytes); });
}

StatusOr<std::byte*> InProcessDeviceBackend::KeptMemory(size_t bytes) {
  // The previous op of a committing group is done with it: it runs one op at a time.
  if (kept_.size() < bytes) {
    try {
      kept_.resize(bytes);
    } catch (const std::bad_alloc&) {
      return Status::ResourceExhausted("the sidecar cannot allocate " + std::to_string(bytes) +
                                       " bytes to keep the op's outputs");
    }
  }
  return kept_.data();
}

Status InProcessDeviceBackend::RestoreKept(void* dst, const void* src, size_t bytes) {
  auto copied = std::make_shared<std::promise<Status>>();
  std::future<Status> done = copied->get_future();
  Item item{[this, dst, src, bytes, copied] {
              copied->set_value(host_->Copy(dst, src, bytes));
              return Status::Ok();
            },
            nullptr, /*runs_once_aborted=*/true};
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return Status::Aborted("the simulated device is stopping");
    items_.push_back(std::move(item));
  }
  queued_.notify_all();
  return done.get();
}

Status InProcessDeviceBackend::Combine(const ReduceOp& op, DType dtype, void* out, const void* a,
                                       const void* b, size_t count) {
  // Refused at once, as a kernel launch for an invalid pair is.
  COLLECTIVED_RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  return Launch(
      [this, op, dtype, out, a, b, count] { return host_->Combine(op, dtype, out, a, b, count); });
}

Status InProcessDeviceBackend::PreScale(const ReduceOp& op, DType dtype, void* data, size_t count) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  return Launch([this, op, dtype, data, count] { return host_->PreScale(op, dtype, data, count); });
}

Status InProcessDeviceBackend::Finalize(const ReduceOp& op, DType dtype, void* data, size_t count,
                                        int contributions) {
  COLLECTIVED_RETURN_IF_ERROR(ValidateReduceOp(op, dtype));
  return Launch([this, op, dtype, data, count, contributions] {
    return host_->Finalize(op, dtype, data, count, contributions);
  });
}

Status InProcessDeviceBackend::AwaitReady(const TensorView& tensor) {
  if (!tensor.ready) return Status::Ok();
  link_->NoteDeviceCall();  // NcclBackend's may open an interprocess event
  auto event = std::dynamic_pointer_cast<SimulatedDeviceEvent>(tensor.ready);
  if (!event) {
    return Status::InvalidArgument(
        "a tensor's ready event is not an event of the simulated device");
  }
  Enqueue(Item{[this, event] {
                 {
                   std::lock_guard<std::mutex> lock(mutex_);
                   waiting_on_ = event;
                 }
                 const bool signalled = event->Wait([this] {
                   std::lock_guard<std::mutex> lock(mutex_);
                   return aborted_;
                 });
                 std::lock_guard<std::mutex> lock(mutex_);
                 waiting_on_.reset();
                 return signalled ? Status::Ok()
                                  : Status::PeerLost(
                                        "the simulated device was aborted while "
                                        "waiting for a trainer's event");
               },
               nullptr});
  return Status::Ok();
}

StatusOr<CompletionEvent> InProcessDeviceBackend::RecordCompletionEvent() {
  std::string name;
  char* slot;
  size_t ring;
  bool recorded_while_watched;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Sized once: pending watches hold their slots' addresses.
    if (watched_slots_.empty()) watched_slots_.assign(link_->CompletionEventRing(), 0);
    ring = watched_slots_.size();
    slot = &watched_slots_[(next_event_ - 1) % ring];
    recorded_while_watched = *slot != 0;
    name = "simulated-event:" + std::to_string(next_event_++);
  }
  if (recorded_while_watched) link_->CountDeviceWatches({0, 0, 1});
  Enqueue(Item{[this, name] {
                 std::lock_guard<std::mutex> lock(mutex_);
                 reached_.push_back(name);
                 return Status::Ok();
               },
               nullptr});
  return CompletionEvent{name, slot, ring};
}

Status InProcessDeviceBackend::EnqueueSignal(const StreamSignal& signal) {
  if (link_->DeviceRefusesSignals()) {
    return Status::Unavailable("the simulated device refuses stream signals");
  }
  Enqueue(Item{[signal] {
                 StoreSignal(signal);
                 return Status::Ok();
               },
               nullptr});
  return Status::Ok();
}

std::vector<std::string> InProcessDeviceBackend::EventsReached() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reached_;
}

void InProcessDeviceBackend::WhenComplete(Done done) {
  link_->CountDeviceWatches({0, 1, 0});
  Enqueue(Item{nullptr, std::move(done)});
}

void InProcessDeviceBackend::WhenCompleteAt(const CompletionEvent& event, Done done) {
  link_->CountDeviceWatches({1, 0, 0});
  char* slot = static_cast<char*>(event.native);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    *slot = 1;
  }
  // The stream reaches the event before this mark: nothing of the op comes after it.
  Enqueue(Item{nullptr, [this, slot, done = std::move(done)](const Status& status) {
                 {
                   std::lock_guard<std::mutex> lock(mutex_);
                   *slot = 0;
                 }
                 done(status);
               }});
}

Status InProcessDeviceBackend::AllReduce(void* data, size_t count, DType dtype, const ReduceOp& op,
                                         uint32_t tag, Ms timeout) {
  return Launch([this, data, count, dtype, op, tag, timeout] {
    return host_->AllReduce(data, count, dtype, op, tag, timeout);
  });
}

Status InProcessDeviceBackend::Broadcast(void* data, size_t bytes, int root_node, uint32_t tag,
                                         Ms timeout) {
  return Launch([this, data, bytes, root_node, tag, timeout] {
    return host_->Broadcast(data, bytes, root_node, tag, timeout);
  });
}

Status InProcessDeviceBackend::Reduce(void* data, size_t count, DType dtype, const ReduceOp& op,
                                      int root_node, uint32_t tag, Ms timeout) {
  return Launch([this, data, count, dtype, op, root_node, tag, timeout] {
    return host_->Reduce(data, count, dtype, op, root_node, tag, timeout);
  });
}

Status InProcessDeviceBackend::AllGatherV(const void* in, void* out,
                                          const std::vector<size_t>& bytes_per_node, uint32_t tag,
                                          Ms timeout) {
  return Launch([this, in, out, bytes_per_node, tag, timeout] {
    return host_->AllGatherV(in, out, bytes_per_node, tag, timeout);
  });
}

Status InProcessDeviceBackend::AllToAllV(const void* in, const std::vector<int64_t>& send_bytes,
                                         void* out, const std::vector<int64_t>& recv_bytes,
                                         uint32_t tag, Ms timeout) {
  return Launch([this, in, send_bytes, out, recv_bytes, tag, timeout] {
    return host_->AllToAllV(in, send_bytes, out, recv_bytes, tag, timeout);
  });
}

Status InProcessDeviceBackend::Barrier(uint32_t tag, Ms timeout) {
  if (node_count() == 1) return Status::Ok();
  return Launch([this, tag, timeout] {
    // The signature exchange ran on the CPU; the device orders its streams too.
    return host_->Barrier(tag, timeout);
  });
}

void InProcessDeviceBackend::StartSend(const void* data, size_t bytes, int node, const P2PKey& key,
                                       Done done) {
  link_->NoteDeviceCall();  // NcclBackend's enqueues a staging copy
  link_->StartSend(data, bytes, node, key, std::move(done));
}

void InProcessDeviceBackend::StartRecv(void* data, size_t bytes, int node, const P2PKey& key,
                                       Done done) {
  link_->NoteDeviceCall();  // NcclBackend's records an event on its stream
  if (data != nullptr) {
    link_->StartRecv(data, bytes, node, key, std::move(done));
    return;
  }
  // Bytes to drop: into memory of the transfer's own, as NcclBackend's staging buffer.
  auto dropped = std::make_shared<std::vector<std::byte>>(bytes);
  link_->StartRecv(dropped->data(), bytes, node, key,
                   [dropped, done = std::move(done)](const Status& status) { done(status); });
}

void InProcessDeviceBackend::Abort() {
  std::shared_ptr<SimulatedDeviceEvent> waiting;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    aborted_ = true;
    waiting = waiting_on_;
  }
  link_->Close("sidecar node " + std::to_string(node_rank()) + " aborted its connections");
  queued_.notify_all();
  if (waiting) waiting->Nudge();
}

}  // namespace collectived
