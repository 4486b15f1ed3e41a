// SessionQuotas: what one client session may hold in the sidecar that every trainer of the node
// shares. A request beyond a quota is refused with ResourceExhausted naming the quota; nothing
// of it is allocated.
#pragma once

#include <cstddef>

namespace collectived {

struct SessionQuotas {
  // Asynchronous ops submitted and not yet completed. c10d programs keep a few dozen in flight
  // (DDP buckets); a runaway loop that never waits hits this.
  size_t max_pending_ops = 16384;
  // Bytes those ops hold in the sidecar (inline tensors, inputs and outputs).
  size_t max_pending_bytes = size_t{1} << 30;
  // Completed asynchronous ops remembered for a late Wait, and the bytes they hold (their inline
  // outputs); the oldest are forgotten first when either bound is passed.
  size_t completed_ops_kept = 1024;
  size_t max_completed_bytes = size_t{256} << 20;
  // Registered shared-memory buffers (each holds a mapping and a file descriptor).
  size_t max_buffers = 1024;
};

}  // namespace collectived
