// StreamCompletions: tells when the work enqueued on a CUDA stream so far has run, for many
// streams and many ops in flight, with one poller thread per process. Each Watch records an event
// on the stream; the poller queries the pending events in order and hands each completion to its
// callback.
//
// Why not a host function on the stream (cudaLaunchHostFunc): CUDA runs those on a thread of its
// own, and on an H100 the stream reaching one and the callback running were 250 us apart, most
// of a small op's cost. The poller spins (yielding) while a completion arrived or was asked for in
// the last 300 us, then sleeps 1/16 of how long the newest watch it waits on has waited (5 to
// 100 us, with a timer slack of 1 us: see PollPacing), so a burst of ops is seen at once, an op
// is seen late by a bounded share of its time, and a long wait costs little CPU. With no watch
// left it stays awake through the rest of that spin too (an op issued right after the last one
// completed needs no wake-up), then blocks until the next watch.
//
// A watch also carries a health check (may be empty), run at most once a millisecond while it is
// the oldest watch of its stream still waiting (NCCL's asynchronous error: a peer that died
// leaves the stream waiting forever); a non-OK status ends the watch with that status, and the
// caller is expected to abort what the stream waits for. The watches of one stream complete in
// the order they were made, so only the oldest waiting one of each stream is queried.
//
// Thread-safety: Watch may be called from any thread. Callbacks run on the poller thread and must
// not block (hand the work to an executor).
#pragma once

#include <cuda_runtime_api.h>

#include <functional>

#include "engine/vocabulary/status.h"

namespace collectived {

class StreamCompletions {
 public:
  using Health = std::function<Status()>;
  using Done = std::function<void(const Status&)>;

  // The process's poller (started on first use, never destroyed).
  static StreamCompletions& Instance();

  // Calls `done` once everything enqueued on `stream` (of CUDA device `device`, current on the
  // calling thread) before this call has run: OK; the error cudaEventQuery reported; or the first
  // non-OK status of `health`. Returns an error (and never calls `done`) when no event can be
  // recorded.
  Status Watch(int device, cudaStream_t stream, Health health, Done done);

  // As Watch, on `event`, which the caller recorded on `stream` after the work to watch (no
  // second recording): `done` once the stream got there. The caller keeps the event, and must not
  // record it again before `done` ran. Watches complete in the order they were made; one made
  // here after another thread's Watch recorded later on the same stream completes after it.
  void WatchRecorded(int device, cudaStream_t stream, cudaEvent_t event, Health health, Done done);

 private:
  StreamCompletions();
  struct State;
  State* const state_;  // never freed: the poller thread may outlive static destruction
};

}  // namespace collectived
