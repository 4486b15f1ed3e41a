// InterprocessEventPool: CUDA events that another process can open (cudaIpcGetEventHandle), for
// "everything enqueued on this stream so far" markers passed between a trainer and its sidecar
// in both directions. Events are created on first use, reused round-robin per device, and never
// destroyed: a handle another process cached keeps naming the same event for the life of this
// process, so it never aliases a newer one.
//
// Reuse is safe for the waiter: cudaStreamWaitEvent waits for the recording that precedes the
// call, so a waiter that arrives after a later recording of the same event waits for more work,
// never for less, and only for work already enqueued (no cycle can form).
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
