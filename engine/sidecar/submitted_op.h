// SubmittedOp: one asynchronous op a session submitted through the Sidecar, as remembered for a
// later Wait by the client's op id. (Not the flight recorder's OpRecord: that one describes an
// op of a group; this one is a session's handle on its own op.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "engine/vocabulary/work.h"

namespace collectived {

struct SubmittedOp {
  // The id the client gave the op; unique among the session's ops that are still remembered.
  uint64_t client_op_id = 0;
  // The engine's handle: completion, status, sequence number, timings.
  std::shared_ptr<Work> work;
  // Memory the op holds in the sidecar (inline tensors), counted against the session's quotas.
  size_t held_bytes = 0;
  // Opaque to the engine: what the front end that submitted the op needs to answer for it (the
  // gRPC services keep the translated request: which outputs travel back inline). May be null.
  std::shared_ptr<const void> frontend_state;
};

// Called once when a submitted op completes (success, failure or timeout), on the thread that
// completed it (or at once, on the submitting thread, if it completed before Submit returned).
// Must be short and must not throw.
using OpCompletionCallback = std::function<void(const SubmittedOp& op)>;

}  // namespace collectived
