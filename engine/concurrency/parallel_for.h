// ParallelFor: splits a large local pass (a combine or copy over many megabytes) into tasks on
// the sidecar's Executor instead of threads of its own. The calling thread takes part: it runs
// items itself and waits only for items another thread already started, so a pass never waits
// for a task still queued behind others (and works on a pool with every thread busy).
#pragma once

#include <cstddef>
#include <functional>

#include "engine/concurrency/executor.h"
#include "engine/vocabulary/status.h"

namespace collectived {

// Runs body(i) for every i in [0, items), on the calling thread and on up to `helpers` tasks of
// `executor` (null: all on the calling thread). Returns OK, or the first error a body returned
// (items not yet started are then skipped). Returns once no body is running.
Status ParallelFor(Executor* executor, size_t items, size_t helpers,
                   const std::function<Status(size_t)>& body);

}  // namespace collectived
