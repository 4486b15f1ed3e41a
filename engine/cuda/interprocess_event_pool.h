// InterprocessEventPool: CUDA events that another process can open (cudaIpcGetEventHandle), for
// "everything enqueued on this stream so far" markers passed between a trainer and its sidecar
// in both directions. Events are created on first use, reused round-robin per device, and never
// destroyed: a handle another process cached keeps naming the same event for the life of this
// process, so it never aliases a newer one.
//
// Reuse is safe for the waiter as long as the recorder's stream never waits on the waiter's work
// that is not yet enqueued: cudaStreamWaitEvent waits for the recording that precedes the call,
// so a waiter that arrives after a later recording of the same event waits for more work, never
// for less. A sidecar's completion events are safe (a trainer's stream waits on one only once
// its op was enqueued), and so are a trainer's ready events while its streams wait on the
// sidecar only through those completion events. A trainer whose streams wait on stream-signal
// words (for ops the sidecar may not have enqueued yet) must not record a ready event again
// before the sidecar waited on its previous recording, or the two streams can wait on each other
// for ever: it leases its ready events instead (clients/cpp, ReadyEventLease).
//
// Thread-safety: Next may be called from any thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/status.h"

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
  explicit InterprocessEventPool(size_t events_per_device) : per_device_(events_per_device) {}
  InterprocessEventPool(const InterprocessEventPool&) = delete;
  InterprocessEventPool& operator=(const InterprocessEventPool&) = delete;

  // The next event of `device`'s ring, to record. Call with `device` current. InvalidArgument
  // (with CUDA's words) when the driver cannot create or share one.
  StatusOr<InterprocessEvent> Next(int device);

 private:
  struct Ring {
    std::vector<InterprocessEvent> events;
    size_t next = 0;
  };
  const size_t per_device_;
  std::mutex mu_;
  std::map<int, Ring> rings_;  // guarded by mu_
};

}  // namespace collectived
