// The submission ring: a session's shared-memory data path for ops, beside the gRPC control
// plane. The sidecar creates it (a sealed memfd: neither side can shrink it) and hands it to the
// client over the session's fd channel. It holds two RingQueues: submissions (client -> sidecar:
// each record a serialized collectived.v1.CollectiveRequest) and completions (sidecar -> client:
// each a serialized CollectiveResponse), and two doorbells: the sidecar sleeps on one, the
// client on the other. docs/api.md describes the layout for clients in other languages.
//
// The client is not trusted: the sidecar only reads the indices and records the client
// publishes, checks each before use (RingQueue), and copies a record out before it parses it.
// A ring the client broke is closed with a reason; the session itself goes on over gRPC.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "rpc/doorbell.h"
#include "rpc/ring_queue.h"

namespace collectived {

// The ring's first page. Offsets are fixed (static_asserts in the .cc); little-endian.
struct SubmissionRingHeader {
  static constexpr uint32_t kMagic = 0x67726463;  // "cdrg"
  static constexpr uint32_t kVersion = 1;
  static constexpr size_t kBytes = 4096;
  static constexpr size_t kQueueBytes = size_t{1} << 20;        // each direction
  static constexpr size_t kMaxRecordBytes = size_t{256} << 10;  // payload of one record
  static constexpr size_t kTotalBytes = kBytes + 2 * kQueueBytes;
  static constexpr size_t kMaxReasonBytes = 1024;

  uint32_t magic;
  uint32_t version;
  uint32_t queue_bytes;
  uint32_t max_record_bytes;
  uint64_t total_bytes;
  RingQueueIndices submissions;            // at 64
  RingQueueIndices completions;            // at 256
  alignas(64) DoorbellWords sidecar_bell;  // at 448: new submissions, room for completions
  alignas(64) DoorbellWords client_bell;   // at 512: new completions, the ring closed
  alignas(64) uint32_t closed;             // at 576: set by the sidecar, never cleared
  uint32_t reason_bytes;
  char reason[kMaxReasonBytes];  // why the sidecar closed the ring (UTF-8)
};

enum class RingWaitResult { kOk, kTimeout, kClosed };

// The sidecar's end.
//
// Thread-safety: NextSubmission from one thread; PushCompletion, Close and WakeHost from any.
class SubmissionRingHost {
 public:
  // Creates the ring in a new sealed memfd. Returns null and sets *error on failure.
  static std::unique_ptr<SubmissionRingHost> Create(std::string* error);
  ~SubmissionRingHost();
  SubmissionRingHost(const SubmissionRingHost&) = delete;
  SubmissionRingHost& operator=(const SubmissionRingHost&) = delete;

  // The memfd to hand to the client (still owned by the host, which closes it when destroyed).
  int fd() const { return fd_; }

  // Copies the next submission into *payload, waiting up to `timeout` (a bounded spin, then the
  // doorbell). kOk; kTimeout (also when woken by WakeHost or by room for completions, and at
  // once when the bell moved since `since`, a Bell() read before checking for room); kClosed
  // when the ring is closed, or the client broke it (then it is closed with the reason).
  RingWaitResult NextSubmission(std::string* payload, std::chrono::microseconds timeout,
                                std::optional<uint32_t> since = std::nullopt);

  // Appends a completion and wakes the client. kOk; kFull (nothing written: retry once the
  // client made room, it rings the sidecar's bell then); kTooLarge; kCorrupt (the ring is
  // closed with the reason).
  RingQueueResult PushCompletion(const std::string& payload);

  // Closes the ring (idempotent; the first reason stays) and wakes both sides.
  void Close(const std::string& reason);
  bool closed() const;
  std::string reason() const;

  // Wakes NextSubmission.
  void WakeHost();

  // The sidecar's bell, and a sleep until it rings after `seen` (the client submitted or made
  // room for completions, or the ring closed) or `timeout` passes: read the bell, check for
  // work, then sleep since that value, and no ring is lost.
  uint32_t Bell() const;
  void SleepSince(uint32_t seen, std::chrono::microseconds timeout);

 private:
  SubmissionRingHost(int fd, std::byte* base);

  const int fd_;
  std::byte* const base_;
  SubmissionRingHeader* const header_;
  RingQueue submissions_;            // consumer side; the NextSubmission thread only
  mutable std::mutex mutex_;         // guards completions_ and reason_
  RingQueue completions_;            // producer side
  std::atomic<bool> closed_{false};  // private: the client may scribble on the shared flag
  std::string reason_;
};

// A client's end.
//
// Thread-safety: Submit from any threads (serialized inside); NextCompletion from any threads
// (serialized inside); the two sides run concurrently.
class SubmissionRingClient {
 public:
  // Maps the ring behind `fd` (not taken). Returns null and sets *error when it is not a ring
  // of this version.
  static std::unique_ptr<SubmissionRingClient> Attach(int fd, std::string* error);
  ~SubmissionRingClient();
  SubmissionRingClient(const SubmissionRingClient&) = delete;
  SubmissionRingClient& operator=(const SubmissionRingClient&) = delete;

  size_t max_record_bytes() const { return SubmissionRingHeader::kMaxRecordBytes; }

  // Appends a submission and rings the sidecar; waits up to `timeout` for room (asleep: the
  // sidecar rings this side's bell once it took a submission from a full queue). kOk, kFull
  // (timed out), kTooLarge, kCorrupt (then closed() says why).
  RingQueueResult Submit(const void* payload, size_t size, std::chrono::microseconds timeout);
  // Submit without any wait: kFull also where another thread is submitting (it may be waiting
  // for room). For a caller that must not block, such as one holding Python's GIL.
  RingQueueResult TrySubmit(const void* payload, size_t size);

  // Copies the next completion into *payload, waiting up to `timeout`. kOk, kTimeout, kClosed
  // (the sidecar closed the ring and every completion it wrote was taken, or the sidecar broke
  // it).
  RingWaitResult NextCompletion(std::string* payload, std::chrono::microseconds timeout);

  // Waits up to `timeout` until a completion is published or the ring closed, without taking
  // one: several threads may wait while one takes (TryNextCompletion), so the thread that
  // needs a completion can take it itself. Returns whether one is there.
  bool WaitForCompletion(std::chrono::microseconds timeout);
  // Takes the next completion if one is there: kOk, kTimeout (none now), kClosed.
  RingWaitResult TryNextCompletion(std::string* payload);

  // For a thread that waits for something a completion brings (its op done, whoever took the
  // completion): read CompletionBell(), check, then SleepSince() that value; a thread that took
  // completions for others calls Kick() to wake them. The sidecar rings the same bell.
  uint32_t CompletionBell() const;
  void SleepSince(uint32_t seen, std::chrono::microseconds timeout);
  void Kick();

  bool closed() const;
  // Why the ring is closed: the sidecar's reason, or the corruption this side found.
  std::string reason() const;

 private:
  SubmissionRingClient(std::byte* base);

  std::byte* const base_;
  SubmissionRingHeader* const header_;
  mutable std::mutex submit_mutex_;
  RingQueue submissions_;  // producer side
  mutable std::mutex complete_mutex_;
  RingQueue completions_;     // consumer side
  std::string local_reason_;  // guarded by complete_mutex_
};

}  // namespace collectived
