// A C interface to a client's end of the submission ring (rpc/submission_ring.h), for the
// Python client (collectived/ring.py loads it with ctypes: no build against Python's headers,
// and the waits release the GIL). Every call is thread-safe as SubmissionRingClient is.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>

#include "rpc/submission_ring.h"

using collectived::RingQueueResult;
using collectived::RingWaitResult;
using collectived::SubmissionRingClient;

namespace {

size_t CopyOut(const std::string& text, char* out, size_t capacity) {
  if (capacity == 0) return 0;
  const size_t bytes = std::min(text.size(), capacity - 1);
  std::memcpy(out, text.data(), bytes);
  out[bytes] = '\0';
  return bytes;
}

// A submission's outcome as the C interface numbers it.
int SubmitCode(RingQueueResult result) {
  switch (result) {
    case RingQueueResult::kOk:
      return 0;
    case RingQueueResult::kFull:
      return 1;
    case RingQueueResult::kTooLarge:
      return 2;
    default:
      return 3;
  }
}

}  // namespace

extern "C" {

// Maps the ring behind `fd` (not taken). Null on failure, with the reason in `error`.
void* collectived_ring_attach(int fd, char* error, size_t error_capacity) {
  std::string why;
  std::unique_ptr<SubmissionRingClient> ring = SubmissionRingClient::Attach(fd, &why);
  if (!ring) CopyOut(why, error, error_capacity);
  return ring.release();
}

void collectived_ring_detach(void* ring) {
  delete static_cast<SubmissionRingClient*>(ring);
}

uint64_t collectived_ring_max_record(void* ring) {
  return static_cast<SubmissionRingClient*>(ring)->max_record_bytes();
}

// 0: submitted; 1: no room within the timeout; 2: too large; 3: the ring is closed or broken.
int collectived_ring_submit(void* ring, const void* payload, uint64_t size, int64_t timeout_us) {
  return SubmitCode(static_cast<SubmissionRingClient*>(ring)->Submit(
      payload, size, std::chrono::microseconds(timeout_us)));
}

// As collectived_ring_submit, without any wait: 1 also while another thread submits. For calls
// that keep the GIL.
int collectived_ring_try_submit(void* ring, const void* payload, uint64_t size) {
  return SubmitCode(static_cast<SubmissionRingClient*>(ring)->TrySubmit(payload, size));
}

// Takes the next completion if one is there: >= 0, its size, copied to `out` (`capacity` must
// be at least collectived_ring_max_record); -1: none now; -2: the ring is closed or broken.
int64_t collectived_ring_try_completion(void* ring, char* out, uint64_t capacity) {
  static thread_local std::string payload;
  switch (static_cast<SubmissionRingClient*>(ring)->TryNextCompletion(&payload)) {
    case RingWaitResult::kOk:
      if (payload.size() > capacity) return -2;
      std::memcpy(out, payload.data(), payload.size());
      return static_cast<int64_t>(payload.size());
    case RingWaitResult::kTimeout:
      return -1;
    default:
      return -2;
  }
}

uint32_t collectived_ring_bell(void* ring) {
  return static_cast<SubmissionRingClient*>(ring)->CompletionBell();
}

// Sleeps (GIL released: ctypes) until the completion bell moves from `seen`, or the timeout.
void collectived_ring_sleep_since(void* ring, uint32_t seen, int64_t timeout_us) {
  static_cast<SubmissionRingClient*>(ring)->SleepSince(seen, std::chrono::microseconds(timeout_us));
}

void collectived_ring_kick(void* ring) {
  static_cast<SubmissionRingClient*>(ring)->Kick();
}

// Why the ring is closed ("" while open); returns the length written.
uint64_t collectived_ring_reason(void* ring, char* out, uint64_t capacity) {
  return CopyOut(static_cast<SubmissionRingClient*>(ring)->reason(), out, capacity);
}

}  // extern "C"
