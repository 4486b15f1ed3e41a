#include "services/collectived/ring_front_end.h"

#include <chrono>
#include <deque>
#include <mutex>

#include "engine/logging.h"
#include "rpc/submission_ring.h"
#include "services/collectived/collective_calls.h"
#include "services/collectived/translate.h"

namespace collectived {

struct RingFrontEnd::Shared {
  std::unique_ptr<SubmissionRingHost> ring;
  std::mutex mutex;
  std::deque<std::string> waiting;  // guarded by mutex: completions the ring had no room for
  size_t waiting_bytes = 0;         // guarded by mutex

  // Writes the waiting completions while the ring has room. Call with `mutex` held.
  void FlushLocked() {
    while (!waiting.empty()) {
      const RingQueueResult pushed = ring->PushCompletion(waiting.front());
      if (pushed == RingQueueResult::kFull) return;
      waiting_bytes -= waiting.front().size();
      waiting.pop_front();  // written, or undeliverable (a closed ring; too large is answered)
    }
  }

  void Deliver(const v1::CollectiveResponse& completion) {
    std::string payload = completion.SerializeAsString();
    if (payload.size() > SubmissionRingHeader::kMaxRecordBytes) {
      // The inline result does not fit in a record: answer with an error the client can act on.
      v1::CollectiveResponse refused;
      refused.set_client_op_id(completion.client_op_id());
      refused.set_group(completion.group());
      refused.set_op(completion.op());
      refused.set_sequence_number(completion.sequence_number());
      FillError(Status::InvalidArgument(
                    "the result of " + completion.op() + " on group '" + completion.group() +
                    "' (" + std::to_string(payload.size()) +
                    " bytes inline) does not fit in a submission-ring record (" +
                    std::to_string(SubmissionRingHeader::kMaxRecordBytes) +
                    " bytes): put large outputs in registered memory or submit the op "
                    "on the session stream"),
                refused.mutable_error());
      payload = refused.SerializeAsString();
    }
    std::lock_guard<std::mutex> lock(mutex);
    waiting_bytes += payload.size();
    waiting.push_back(std::move(payload));
    FlushLocked();
  }
};

namespace {

// The ring's thread sleeps until the client rings (a submission, room for completions) or the
// ring closes (the session ended, the front end stops): this bounds one sleep as every doorbell
// sleep is bounded, it is not a poll.
constexpr auto kIdleSleep = std::chrono::hours(1);
// Completions kept for a client with no room for them, beyond which its ring takes no new
// submission (the ones of ops in flight still complete: the session's op quota bounds those).
constexpr size_t kMaxWaitingCompletions = 4096;
constexpr size_t kMaxWaitingBytes = size_t{16} << 20;

}  // namespace

StatusOr<std::unique_ptr<RingFrontEnd>> RingFrontEnd::Start(Sidecar& sidecar, Metrics& metrics,
                                                            SessionRef session, std::string label) {
  std::string error;
  auto shared = std::make_shared<Shared>();
  shared->ring = SubmissionRingHost::Create(&error);
  if (!shared->ring) {
    return Status::ResourceExhausted("cannot create a submission ring for session " + label + ": " +
                                     error);
  }
  StatusOr<std::shared_ptr<Session>> live = sidecar.FindSession(session);
  if (!live.ok()) return live.status();
  std::unique_ptr<RingFrontEnd> front_end(
      new RingFrontEnd(sidecar, metrics, std::move(session), std::move(label), shared));
  // The session's end closes the ring, which wakes its thread (at once, here, when it already
  // ended).
  front_end->live_session_ = *live;
  front_end->session_ended_watch_ =
      (*live)->ended().OnCancel([weak = std::weak_ptr<Shared>(shared)](const Status& why) {
        if (auto alive = weak.lock()) alive->ring->Close(why.message());
      });
  front_end->thread_ = std::thread([raw = front_end.get()] { raw->Serve(); });
  return front_end;
}

RingFrontEnd::RingFrontEnd(Sidecar& sidecar, Metrics& metrics, SessionRef session,
                           std::string label, std::shared_ptr<Shared> shared)
    : sidecar_(sidecar),
      metrics_(metrics),
      session_(std::move(session)),
      label_(std::move(label)),
      shared_(std::move(shared)) {}

RingFrontEnd::~RingFrontEnd() {
  stop_.store(true);
  if (auto live = live_session_.lock()) live->ended().Remove(session_ended_watch_);
  shared_->ring->Close("the session's fd-channel connection closed");
  if (thread_.joinable()) thread_.join();
}

int RingFrontEnd::fd() const {
  return shared_->ring->fd();
}

void RingFrontEnd::Serve() {
  SubmissionRingHost& ring = *shared_->ring;
  const SessionEventSink deliver = [shared = shared_](const v1::SessionEvent& event) {
    if (event.has_completion()) shared->Deliver(event.completion());
  };
  std::string payload;
  v1::CollectiveRequest request;
  for (uint64_t index = 0; !stop_.load() && !ring.closed();) {
    // Read before looking for room: a ring for room that comes meanwhile is not lost.
    const uint32_t bell = ring.Bell();
    bool backlogged;
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->FlushLocked();  // the client may have made room (it rings when asked to)
      backlogged = shared_->waiting.size() >= kMaxWaitingCompletions ||
                   shared_->waiting_bytes >= kMaxWaitingBytes;
    }
    if (backlogged) {
      // A client that does not take its completions (refusals cost no quota) submits no more
      // until it does: its submissions stay in its queue, the sidecar's memory stays bounded.
      // It rings once it made room.
      ring.SleepSince(bell, kIdleSleep);
      continue;
    }
    // Returns on a submission, on the client's ring for room, or on the close.
    const RingWaitResult next = ring.NextSubmission(&payload, kIdleSleep, bell);
    if (next == RingWaitResult::kClosed) break;
    if (next == RingWaitResult::kTimeout) continue;
    ++index;
    request.Clear();
    if (!request.ParseFromString(payload)) {
      ring.Close("submission " + std::to_string(index) + " of session " + label_ +
                 " is not a valid collectived.v1.CollectiveRequest (malformed protobuf); the "
                 "ring is closed, the session goes on over gRPC");
      metrics_.CountRefusedCall("Ring.Submit", ErrorKind::kInvalidArgument);
      break;
    }
    const Status accepted = SubmitOrRefuse(sidecar_, session_, std::move(request), deliver);
    if (!accepted.ok()) metrics_.CountRefusedCall("Ring.Submit", accepted.kind());
  }
  if (ring.closed()) {
    LogInfo("submission ring closed", {{"session", label_}, {"why", ring.reason()}});
  }
}

}  // namespace collectived
