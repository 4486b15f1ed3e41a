// InterprocessEventPool: CUDA events that another process can open (cudaIpcGetEventHandle), for
// "everything enqueued on this stream so far" markers passed between a trainer and its sidecar
// in both directions. Events are created on first use and never destroyed: a handle another
// process cached keeps naming the same event for the life of this process, so it never aliases
// a newer one.
//
// Each stream has a ring of its own, reused round-robin, so that an event is recorded again only
// on the stream of its earlier recording, after it: cudaStreamWaitEvent waits for the recording
// that precedes the call, so a waiter that arrives after a later recording waits for more of the
// same stream's work, never for less and never for another stream's (one ring per device, shared
// by the streams, let a trainer wait on another group's op, or a sidecar on the wrong producer).
// That is safe as long as the recorder's stream never waits on the waiter's work that is not yet
// enqueued. A sidecar's completion events are safe (a trainer's stream waits on one only once its
// op was enqueued), and so are a trainer's ready events while its streams wait on the sidecar
// only through those completion events. A trainer whose streams wait on stream-signal words (for
// ops the sidecar may not have enqueued yet) must not record a ready event again before the
// sidecar waited on its previous recording, or the two streams can wait on each other for ever:
// it leases its ready events instead (clients/cpp, ReadyEventLease).
//
// A ring's events go back to the pool, for other streams' rings, when its stream ends (Release)
// or, past `streams_per_device` rings of a device, when it is the one used least recently; then
// a waiter that had not waited on its last recording yet would wait on the new stream's work, so
// `streams_per_device` is to be well above the streams a process uses at once.
//
// Thread-safety: Next and Release may be called from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/vocabulary/status.h"

namespace collectived {

struct InterprocessEvent {
  cudaEvent_t event = nullptr;
  std::string handle;  // cudaIpcEventHandle_t, 64 bytes
};

// A new interprocess event (cudaEventDisableTiming | cudaEventInterprocess) of the current
// device, with its handle. InvalidArgument (with CUDA's words) when the driver cannot create or
// share one.
StatusOr<InterprocessEvent> CreateInterprocessEvent();

class InterprocessEventPool {
 public:
  // Makes an event of the current device: CreateInterprocessEvent, or a test's.
  using Maker = std::function<StatusOr<InterprocessEvent>()>;

  InterprocessEventPool(size_t events_per_stream, size_t streams_per_device,
                        Maker make = CreateInterprocessEvent)
      : per_stream_(events_per_stream),
        streams_per_device_(streams_per_device),
        make_(std::move(make)) {}
  InterprocessEventPool(const InterprocessEventPool&) = delete;
  InterprocessEventPool& operator=(const InterprocessEventPool&) = delete;

  // The next event of `stream`'s ring (a stream of `device`), to record on that stream. Call
  // with `device` current. InvalidArgument (with CUDA's words) when the driver cannot create or
  // share one.
  StatusOr<InterprocessEvent> Next(int device, const void* stream);

  // `stream` ended (drained, about to be destroyed): its ring's events serve other streams.
  void Release(int device, const void* stream);

  // How many events of `device` the pool holds (in rings and free), for tests.
  size_t EventsOf(int device) const;

 private:
  struct Ring {
    std::vector<InterprocessEvent> events;  // an entry is empty until made or taken
    size_t next = 0;
    uint64_t last_use = 0;
  };
  using Key = std::pair<int, uintptr_t>;  // device, stream

  void ReleaseLocked(std::map<Key, Ring>::iterator ring);

  const size_t per_stream_;
  const size_t streams_per_device_;
  const Maker make_;
  mutable std::mutex mu_;
  std::map<Key, Ring> rings_;                           // guarded by mu_
  std::map<int, std::vector<InterprocessEvent>> free_;  // guarded by mu_
  uint64_t uses_ = 0;                                   // guarded by mu_
};

}  // namespace collectived
