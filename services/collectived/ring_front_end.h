// RingFrontEnd: serves one session's submission ring (rpc/submission_ring.h), the data path
// beside the session's Attach stream. Its thread takes the client's submissions from shared
// memory and submits them exactly as the stream would (SubmitOrRefuse: the same checks, quotas
// and errors); completions are written back to the ring, and kept in order while the client has
// no room for them (bounded by the session's quota of pending ops: a completion per op, and a
// CUDA op's early response when it asked for one).
//
// A client that breaks the ring (impossible indices, a record that is not a CollectiveRequest)
// has its ring closed with the reason; its session goes on over gRPC. The ring also closes when
// the session ends or the front end is destroyed (the client's fd-channel connection closed).
//
// A client that rings the sidecar's doorbell with nothing to take costs a bounded share of a
// core: past a few hundred such wake-ups in a row the thread sleeps (up to 10 ms) before it
// listens again, and a ring that goes on ringing for nothing for seconds is closed with a reason
// the client sees (collectived_resource_refusals_total{resource="doorbells"}). Any record taken
// or completion written ends the back-off: a client that submits is never slowed (constants and
// reasons in the .cc).
//
// Thread-safety: created and destroyed by one thread; completions arrive on engine threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "engine/sidecar/sidecar.h"
#include "engine/vocabulary/status.h"
#include "services/collectived/metrics.h"

namespace collectived {

class RingFrontEnd {
 public:
  // Creates the ring for `session` (named `label` in logs) and starts serving it.
  static StatusOr<std::unique_ptr<RingFrontEnd>> Start(Sidecar& sidecar, Metrics& metrics,
                                                       SessionRef session, std::string label);
  // Closes the ring with `why_closed` ("the fd channel closed" unless set) and joins the
  // thread. Ops in flight still complete; their completions are dropped.
  ~RingFrontEnd();
  RingFrontEnd(const RingFrontEnd&) = delete;
  RingFrontEnd& operator=(const RingFrontEnd&) = delete;

  // The ring's memfd, to hand to the client (owned by the ring).
  int fd() const;

  struct Shared;  // the ring and the completions waiting for room (outlives the front end)

 private:
  RingFrontEnd(Sidecar& sidecar, Metrics& metrics, SessionRef session, std::string label,
               std::shared_ptr<Shared> shared);
  void Serve();
  // Closes the ring of a client that rang for nothing `wake_ups` times `during` (a reason it
  // sees) and counts the refusal.
  void CloseForRingingInVain(uint64_t wake_ups, std::chrono::duration<double> during);

  Sidecar& sidecar_;
  Metrics& metrics_;
  const SessionRef session_;
  const std::string label_;
  const std::shared_ptr<Shared> shared_;
  // Whose end closes the ring; not kept alive by it (an ended session frees its buffers).
  std::weak_ptr<Session> live_session_;
  uint64_t session_ended_watch_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace collectived
