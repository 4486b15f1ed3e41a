// MappingFaultGuard: keeps a client that shrinks its memory from killing the sidecar.
//
// A client hands the sidecar a file descriptor and the sidecar maps it. If the client truncates
// the file afterwards (only a memfd sealed with F_SEAL_SHRINK cannot be), touching the pages past
// the new end raises SIGBUS, whose default action kills the whole sidecar and every trainer it
// serves. The guard owns a SIGBUS handler: a fault inside a guarded mapping replaces that mapping
// with private zero pages (so the faulting access, and every later one, completes) and marks the
// mapping faulted; its owner then fails the op that used it. A SIGBUS anywhere else is passed to
// the handler that was installed before (the default one kills the process, as it should).
//
// The handler only reads a fixed table of atomics and calls mmap, both async-signal-safe.
// Thread-safety: every member may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/vocabulary/status.h"

namespace collectived {

class MappingFaultGuard {
 public:
  // How many mappings may be guarded at once (each registered, unsealed buffer is one).
  static constexpr size_t kCapacity = 16384;

  // Guards [base, base + size), a MAP_SHARED mapping of a client's file. Returns the slot that
  // Faulted and Release take; ResourceExhausted when kCapacity mappings are already guarded.
  // Installs the handler on first use.
  static StatusOr<size_t> Guard(void* base, size_t size);

  // Whether a fault hit the mapping of `slot` since it was guarded: its contents are zeros
  // from then on, whatever the client's file holds.
  static bool Faulted(size_t slot);

  // Stops guarding `slot`; call before unmapping it.
  static void Release(size_t slot);

  // Faults handled since the process started (for tests and logs).
  static uint64_t FaultsHandled();
};

}  // namespace collectived
