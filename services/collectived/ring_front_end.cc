#include "services/collectived/ring_front_end.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>

#include "engine/concurrency/clock.h"
#include "engine/vocabulary/logging.h"
#include "rpc/submission_ring.h"
#include "services/collectived/collective_calls.h"
#include "services/collectived/translate.h"

namespace collectived {

struct RingFrontEnd::Shared {
  std::unique_ptr<SubmissionRingHost> ring;
  std::mutex mutex;
  std::deque<std::string> waiting;  // guarded by mutex: completions the ring had no room for
  size_t waiting_bytes = 0;         // guarded by mutex
  uint64_t written = 0;             // guarded by mutex: completions written to the ring so far

  // Writes the waiting completions while the ring has room. Call with `mutex` held.
  void FlushLocked() {
    while (!waiting.empty()) {
      const RingQueueResult pushed = ring->PushCompletion(waiting.front());
      if (pushed == RingQueueResult::kFull) return;
      if (pushed == RingQueueResult::kOk) ++written;
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

// A bell rung with nothing to take. A client rings the sidecar's bell once per record it
// publishes, and once after taking a completion when the sidecar asked it for room: each ring of
// a working client brings a record or lets a completion be written, and at most one or two
// wake-ups in a row find neither (the ring of a record that the previous wake-up's poll already
// took). A client that rings in a loop with nothing to take would cost the ring's thread a
// wake-up per ring: a whole core. So past kFreeEmptyWakeUps wake-ups in a row that took no
// record and saw no completion written, the thread sleeps before it listens again, from
// kFirstBackOff doubling per wake-up to kMaxBackOff: at the cap a bell rung in a loop wakes it
// about a hundred times a second, a few microseconds each (well under 1% of a core). The sleep is
// not on the bell, so ringing cannot cut it short; the ring's close and the front end's stop are
// seen when it ends. A record taken or a completion written ends the back-off at once, and so
// does a quiet spell of kQuietSpell between two empty wake-ups (a stray ring now and then is not
// a loop). A trainer never gets near these: it would have to ring hundreds of times without
// submitting anything.
constexpr uint32_t kFreeEmptyWakeUps = 256;
constexpr auto kFirstBackOff = std::chrono::microseconds(100);
constexpr auto kMaxBackOff = std::chrono::microseconds(10000);
constexpr auto kQuietSpell = std::chrono::seconds(1);
// A ring the sidecar is ready to serve whose bell still rings for nothing after this long at the
// cap is closed with the reason, so that its client learns what it does wrong (its session goes
// on over gRPC). Not while the ring holds submissions back for a client that does not take its
// completions: that client's rings may bring records the sidecar does not take yet (they are
// still backed off: it is not served meanwhile anyway, and its ring for room is seen within
// kMaxBackOff).
constexpr auto kCloseAfterAtCap = std::chrono::seconds(3);

// The empty wake-ups of one ring's thread: how long to sleep after each, and when to give up.
class EmptyWakeUps {
 public:
  // A record was taken or a completion written: the ring is working.
  void Progress() {
    count_ = 0;
    back_off_ = std::chrono::microseconds(0);
    at_cap_ = false;
  }

  // A wake-up at `now` that found nothing to do. Returns how long to sleep before the next wait
  // on the bell (zero within the free wake-ups).
  std::chrono::microseconds Empty(Clock::TimePoint now) {
    if (count_ > 0 && now - last_ >= kQuietSpell) Progress();
    if (count_ == 0) first_ = now;
    last_ = now;
    ++count_;
    if (count_ <= kFreeEmptyWakeUps) return std::chrono::microseconds(0);
    back_off_ = back_off_.count() == 0 ? kFirstBackOff : std::min(2 * back_off_, kMaxBackOff);
    if (back_off_ == kMaxBackOff && !at_cap_) {
      at_cap_ = true;
      at_cap_since_ = now;
    }
    return back_off_;
  }

  // Whether the wake-ups have been empty at the cap for kCloseAfterAtCap.
  bool Hopeless(Clock::TimePoint now) const {
    return at_cap_ && now - at_cap_since_ >= kCloseAfterAtCap;
  }

  // The empty wake-ups in a row, and since when.
  uint64_t count() const { return count_; }
  Clock::TimePoint first() const { return first_; }

 private:
  uint64_t count_ = 0;
  Clock::TimePoint first_;
  Clock::TimePoint last_;
  std::chrono::microseconds back_off_{0};
  bool at_cap_ = false;
  Clock::TimePoint at_cap_since_;
};

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
  try {
    front_end->thread_ = std::thread([raw = front_end.get()] { raw->Serve(); });
  } catch (const std::system_error& error) {
    // Out of threads or address space: the session goes on over gRPC (the destructor closes
    // the ring and finds no thread to join).
    return Status::ResourceExhausted("cannot start the thread of the submission ring of session " +
                                     front_end->label_ + ": " + error.what() +
                                     " (the session goes on without a ring)");
  }
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
  EmptyWakeUps empty_wake_ups;
  const Clock& clock = sidecar_.runtime().clock();
  uint64_t written_seen = 0;  // completions written when the previous pass began
  bool woke_empty = false;    // the previous pass woke without taking a record
  for (uint64_t index = 0; !stop_.load() && !ring.closed();) {
    // Read before looking for room: a ring for room that comes meanwhile is not lost.
    const uint32_t bell = ring.Bell();
    bool backlogged;
    uint64_t written;
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->FlushLocked();  // the client may have made room (it rings when asked to)
      backlogged = shared_->waiting.size() >= kMaxWaitingCompletions ||
                   shared_->waiting_bytes >= kMaxWaitingBytes;
      written = shared_->written;
    }
    if (woke_empty) {
      // Did that wake-up bring anything: a completion written since (here or by the engine)?
      woke_empty = false;
      if (written != written_seen) {
        empty_wake_ups.Progress();
      } else {
        const Clock::TimePoint now = clock.Now();
        const std::chrono::microseconds back_off = empty_wake_ups.Empty(now);
        if (!backlogged && empty_wake_ups.Hopeless(now)) {
          CloseForRingingInVain(empty_wake_ups.count(),
                                std::chrono::duration<double>(now - empty_wake_ups.first()));
          break;
        }
        if (back_off.count() > 0) {
          written_seen = written;
          clock.SleepFor(back_off);
          continue;  // then read the bell and look for room again
        }
      }
    }
    written_seen = written;
    if (backlogged) {
      // A client that does not take its completions (refusals cost no quota) submits no more
      // until it does: its submissions stay in its queue, the sidecar's memory stays bounded.
      // It rings once it made room.
      ring.SleepSince(bell, kIdleSleep);
      woke_empty = true;
      continue;
    }
    // Returns on a submission, on the client's ring for room, or on the close.
    const RingWaitResult next = ring.NextSubmission(&payload, kIdleSleep, bell);
    if (next == RingWaitResult::kClosed) break;
    if (next == RingWaitResult::kTimeout) {
      woke_empty = true;
      continue;
    }
    empty_wake_ups.Progress();
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

void RingFrontEnd::CloseForRingingInVain(uint64_t wake_ups, std::chrono::duration<double> during) {
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.1f", during.count());
  shared_->ring->Close("session " + label_ + " rang the sidecar's doorbell with nothing to take: " +
                       std::to_string(wake_ups) + " wake-ups in " + seconds +
                       " s found no submission published and no room made for a completion; "
                       "the submission ring is closed, the session goes on over gRPC");
  metrics_.CountResourceRefusal("doorbells");
}

}  // namespace collectived
