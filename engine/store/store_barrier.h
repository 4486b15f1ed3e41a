// StoreBasedBarrier: c10d's _store_based_barrier, which makes the ranks of a new process group
// meet in the rendezvous store before the group is used, and names the ranks that never came.
#pragma once

#include <chrono>
#include <string_view>

#include "engine/store/store.h"
#include "engine/vocabulary/status.h"

namespace collectived {

// Blocks until all `world_size` ranks have called StoreBasedBarrier with the same
// `barrier_name` on (a view of) the same store, or until `timeout` passes (kNoTimeout: no
// deadline). Each rank marks its arrival under its own key, then increments a counter; the
// rank whose increment completes the count sets a "done" key that everyone waits on, so no one
// polls. The keys live under "<barrier_name>/" in `store` and are left there (removing them
// would race with ranks still waiting); use a new name for each barrier.
//
// Returns OK once every rank has arrived. Returns Timeout with a message that contains
// "Timed out initializing process group in store based barrier" and names this rank, the
// barrier, the world size, how many ranks arrived and which did not, e.g.
//   "Timed out initializing process group in store based barrier on rank 0 for key 'x'
//    (world_size=4, arrived=3, missing ranks: [3], timeout=1000 ms)".
// Returns InvalidArgument if world_size < 1, rank is outside [0, world_size), the name is
// empty, the timeout is invalid (see Store), or the barrier already had world_size arrivals
// (the name was reused). Other store errors are returned with the barrier named as context.
//
// Thread-safety: safe to call concurrently from many threads (one per rank) on a shared store.
Status StoreBasedBarrier(Store& store, int rank, int world_size, std::string_view barrier_name,
                         std::chrono::milliseconds timeout);

}  // namespace collectived
