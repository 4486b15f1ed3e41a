#include "rpc/submission_ring.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "rpc/client_environment.h"

namespace collectived {
namespace {

using Header = SubmissionRingHeader;

static_assert(offsetof(Header, submissions) == 64);
static_assert(offsetof(Header, completions) == 256);
static_assert(offsetof(Header, sidecar_bell) == 448);
static_assert(offsetof(Header, client_bell) == 512);
static_assert(offsetof(Header, closed) == 576);
static_assert(offsetof(Header, reason) == 584);
static_assert(sizeof(Header) <= Header::kBytes);
static_assert(Header::kMaxRecordBytes + RingQueue::kRecordHeaderBytes <= Header::kQueueBytes / 2);

// How long a waiter polls before it sleeps on the futex (the poll yields the core as it goes,
// so a thread that has work on it runs). Waking a sleeping thread costs tens of microseconds
// on a virtual machine, more than a small op takes: a client that waits for an op polls a
// little longer than a small op's round trip, and the sidecar's ring thread, once it took a
// submission, polls for the next one (a trainer in a loop of small ops issues it within one
// round trip). Past the poll both sleep, so an idle session costs no CPU. On a 2-core VM this
// took a world-1 8-byte allreduce from the C++ client from 50-60 to about 20 us.
// A client polls 300 us: with 4 ranks sharing 2 cores a small op's round trip is often 150-250
// us, and a client thread asleep on the bell also makes the sidecar pay a futex wake for each
// completion (through torch, 4 ranks went from 0.43-0.51x gloo's latency with 100 us to
// 0.35-0.39x, two runs each, and 2 ranks from 0.54-0.70x to 0.36-0.39x).
// COLLECTIVED_RING_SPIN_US (clients) and COLLECTIVED_RING_HOST_SPIN_US (the sidecar) override
// them; 0 turns polling off.
std::chrono::microseconds PollFromEnvironment(TabledVariable name,
                                              std::chrono::microseconds fallback) {
  const std::optional<std::string> value = ClientSetting(name);
  if (!value) return fallback;
  char* end = nullptr;
  const long micros = std::strtol(value->c_str(), &end, 10);
  if (*end != '\0' || micros < 0 || micros > 100000) return fallback;  // at most 100 ms
  return std::chrono::microseconds(micros);
}
const std::chrono::microseconds kClientPoll =
    PollFromEnvironment("COLLECTIVED_RING_SPIN_US", std::chrono::microseconds(300));
const std::chrono::microseconds kHostPoll =
    PollFromEnvironment("COLLECTIVED_RING_HOST_SPIN_US", std::chrono::microseconds(200));

std::byte* SubmissionRegion(std::byte* base) {
  return base + Header::kBytes;
}
std::byte* CompletionRegion(std::byte* base) {
  return base + Header::kBytes + Header::kQueueBytes;
}

bool SharedClosed(const Header* header) {
  return std::atomic_ref<const uint32_t>(header->closed).load(std::memory_order_acquire) != 0;
}

}  // namespace

// ---- The sidecar's end ---------------------------------------------------------------------

std::unique_ptr<SubmissionRingHost> SubmissionRingHost::Create(std::string* error) {
  const int fd = memfd_create("collectived-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    *error = std::string("memfd_create: ") + std::strerror(errno);
    return nullptr;
  }
  if (ftruncate(fd, Header::kTotalBytes) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    *error = std::string("cannot size and seal the ring: ") + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  void* mapped = mmap(nullptr, Header::kTotalBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) {
    *error = std::string("cannot map the ring: ") + std::strerror(errno);
    close(fd);
    return nullptr;
  }
  auto* header = static_cast<Header*>(mapped);
  header->magic = Header::kMagic;
  header->version = Header::kVersion;
  header->queue_bytes = static_cast<uint32_t>(Header::kQueueBytes);
  header->max_record_bytes = static_cast<uint32_t>(Header::kMaxRecordBytes);
  header->total_bytes = Header::kTotalBytes;
  return std::unique_ptr<SubmissionRingHost>(
      new SubmissionRingHost(fd, static_cast<std::byte*>(mapped)));
}

SubmissionRingHost::SubmissionRingHost(int fd, std::byte* base)
    : fd_(fd),
      base_(base),
      header_(reinterpret_cast<Header*>(base)),
      submissions_(&header_->submissions, SubmissionRegion(base), Header::kQueueBytes,
                   Header::kMaxRecordBytes),
      completions_(&header_->completions, CompletionRegion(base), Header::kQueueBytes,
                   Header::kMaxRecordBytes) {}

SubmissionRingHost::~SubmissionRingHost() {
  munmap(base_, Header::kTotalBytes);
  close(fd_);
}

RingWaitResult SubmissionRingHost::NextSubmission(std::string* payload,
                                                  std::chrono::microseconds timeout,
                                                  std::optional<uint32_t> since) {
  if (closed()) return RingWaitResult::kClosed;
  WaitForDoorbell(
      &header_->sidecar_bell,
      [&] {
        return submissions_.HasRecord() || closed() ||
               (since && ReadDoorbell(&header_->sidecar_bell) != *since);
      },
      timeout, kHostPoll);
  if (closed()) return RingWaitResult::kClosed;
  switch (submissions_.Pop(payload)) {
    case RingQueueResult::kOk:
      // A client that found the queue full sleeps until room is made: this made some.
      if (submissions_.TakeProducerWaiting()) RingDoorbell(&header_->client_bell);
      return RingWaitResult::kOk;
    case RingQueueResult::kCorrupt:
      Close("the client broke the submission queue: " + submissions_.corruption());
      return RingWaitResult::kClosed;
    default:
      return RingWaitResult::kTimeout;
  }
}

RingQueueResult SubmissionRingHost::PushCompletion(const std::string& payload) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (closed_.load(std::memory_order_acquire)) return RingQueueResult::kCorrupt;
  RingQueueResult pushed = completions_.Push(payload.data(), payload.size());
  if (pushed == RingQueueResult::kFull) {
    // Ask the client to ring once it made room, then look again: it may have made room
    // before it could see the request.
    completions_.SetProducerWaiting();
    pushed = completions_.Push(payload.data(), payload.size());
  }
  if (pushed == RingQueueResult::kOk) {
    RingDoorbell(&header_->client_bell);
  } else if (pushed == RingQueueResult::kCorrupt) {
    const std::string why = "the client broke the completion queue: " + completions_.corruption();
    lock.unlock();
    Close(why);
  }
  return pushed;
}

void SubmissionRingHost::Close(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_.load(std::memory_order_relaxed)) return;
    reason_ = reason;
    const size_t bytes = std::min(reason.size(), Header::kMaxReasonBytes);
    std::memcpy(header_->reason, reason.data(), bytes);
    std::atomic_ref<uint32_t>(header_->reason_bytes)
        .store(static_cast<uint32_t>(bytes), std::memory_order_relaxed);
    std::atomic_ref<uint32_t>(header_->closed).store(1, std::memory_order_release);
    closed_.store(true, std::memory_order_release);
  }
  RingDoorbell(&header_->client_bell);
  RingDoorbell(&header_->sidecar_bell);
}

bool SubmissionRingHost::closed() const {
  return closed_.load(std::memory_order_acquire);
}

std::string SubmissionRingHost::reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return reason_;
}

void SubmissionRingHost::WakeHost() {
  RingDoorbell(&header_->sidecar_bell);
}

uint32_t SubmissionRingHost::Bell() const {
  return ReadDoorbell(&header_->sidecar_bell);
}

void SubmissionRingHost::SleepSince(uint32_t seen, std::chrono::microseconds timeout) {
  if (closed()) return;
  SleepOnDoorbell(&header_->sidecar_bell, seen, timeout);
}

// ---- A client's end ------------------------------------------------------------------------

std::unique_ptr<SubmissionRingClient> SubmissionRingClient::Attach(int fd, std::string* error) {
  struct stat info {};
  if (fstat(fd, &info) != 0 || !S_ISREG(info.st_mode) ||
      static_cast<uint64_t>(info.st_size) != Header::kTotalBytes) {
    *error = "the descriptor is not a submission ring of " + std::to_string(Header::kTotalBytes) +
             " bytes";
    return nullptr;
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    *error = "the submission ring is not sealed against shrinking";
    return nullptr;
  }
  void* mapped = mmap(nullptr, Header::kTotalBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) {
    *error = std::string("cannot map the submission ring: ") + std::strerror(errno);
    return nullptr;
  }
  const auto* header = static_cast<const Header*>(mapped);
  if (header->magic != Header::kMagic || header->version != Header::kVersion ||
      header->queue_bytes != Header::kQueueBytes ||
      header->max_record_bytes != Header::kMaxRecordBytes) {
    *error = "the submission ring has another format (magic " + std::to_string(header->magic) +
             ", version " + std::to_string(header->version) + ")";
    munmap(mapped, Header::kTotalBytes);
    return nullptr;
  }
  return std::unique_ptr<SubmissionRingClient>(
      new SubmissionRingClient(static_cast<std::byte*>(mapped)));
}

SubmissionRingClient::SubmissionRingClient(std::byte* base)
    : base_(base),
      header_(reinterpret_cast<Header*>(base)),
      submissions_(&header_->submissions, SubmissionRegion(base), Header::kQueueBytes,
                   Header::kMaxRecordBytes),
      completions_(&header_->completions, CompletionRegion(base), Header::kQueueBytes,
                   Header::kMaxRecordBytes) {}

SubmissionRingClient::~SubmissionRingClient() {
  munmap(base_, Header::kTotalBytes);
}

RingQueueResult SubmissionRingClient::Submit(const void* payload, size_t size,
                                             std::chrono::microseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::lock_guard<std::mutex> lock(submit_mutex_);
  for (;;) {
    if (SharedClosed(header_)) return RingQueueResult::kCorrupt;
    const uint32_t seen = ReadDoorbell(&header_->client_bell);
    RingQueueResult pushed = submissions_.Push(payload, size);
    if (pushed == RingQueueResult::kFull) {
      // The sidecar is behind by a megabyte of submissions (rare): ask it to ring once it took
      // one, then look again (it may have taken one before it could see the request).
      submissions_.SetProducerWaiting();
      pushed = submissions_.Push(payload, size);
    }
    if (pushed == RingQueueResult::kOk) RingDoorbell(&header_->sidecar_bell);
    if (pushed != RingQueueResult::kFull) return pushed;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return RingQueueResult::kFull;
    // Woken by the sidecar's ring (room, a completion, the close), or the deadline.
    SleepOnDoorbell(&header_->client_bell, seen,
                    std::chrono::duration_cast<std::chrono::microseconds>(deadline - now));
  }
}

RingQueueResult SubmissionRingClient::TrySubmit(const void* payload, size_t size) {
  std::unique_lock<std::mutex> lock(submit_mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return RingQueueResult::kFull;
  if (SharedClosed(header_)) return RingQueueResult::kCorrupt;
  const RingQueueResult pushed = submissions_.Push(payload, size);
  if (pushed == RingQueueResult::kOk) RingDoorbell(&header_->sidecar_bell);
  return pushed;
}

RingWaitResult SubmissionRingClient::NextCompletion(std::string* payload,
                                                    std::chrono::microseconds timeout) {
  const RingWaitResult taken = TryNextCompletion(payload);
  if (taken != RingWaitResult::kTimeout) return taken;
  WaitForCompletion(timeout);
  return TryNextCompletion(payload);
}

bool SubmissionRingClient::WaitForCompletion(std::chrono::microseconds timeout) {
  return WaitForDoorbell(
      &header_->client_bell,
      [this] { return completions_.SharedIndicesShowRecord() || SharedClosed(header_); }, timeout,
      kClientPoll);
}

RingWaitResult SubmissionRingClient::TryNextCompletion(std::string* payload) {
  std::lock_guard<std::mutex> lock(complete_mutex_);
  if (!local_reason_.empty()) return RingWaitResult::kClosed;
  switch (completions_.Pop(payload)) {
    case RingQueueResult::kOk:
      if (completions_.TakeProducerWaiting()) RingDoorbell(&header_->sidecar_bell);
      return RingWaitResult::kOk;
    case RingQueueResult::kCorrupt:
      local_reason_ = "the completion queue is corrupt: " + completions_.corruption();
      return RingWaitResult::kClosed;
    default:
      return SharedClosed(header_) ? RingWaitResult::kClosed : RingWaitResult::kTimeout;
  }
}

uint32_t SubmissionRingClient::CompletionBell() const {
  return ReadDoorbell(&header_->client_bell);
}

void SubmissionRingClient::SleepSince(uint32_t seen, std::chrono::microseconds timeout) {
  // A poll first (kClientPoll): the completion is usually microseconds away.
  if (WaitForDoorbell(
          &header_->client_bell, [&] { return ReadDoorbell(&header_->client_bell) != seen; },
          std::chrono::microseconds(0), kClientPoll)) {
    return;
  }
  SleepOnDoorbell(&header_->client_bell, seen, timeout);
}

void SubmissionRingClient::Kick() {
  RingDoorbell(&header_->client_bell);
}

bool SubmissionRingClient::closed() const {
  return SharedClosed(header_);
}

std::string SubmissionRingClient::reason() const {
  {
    std::lock_guard<std::mutex> lock(complete_mutex_);
    if (!local_reason_.empty()) return local_reason_;
  }
  {
    std::lock_guard<std::mutex> lock(submit_mutex_);
    if (!submissions_.corruption().empty()) {
      return "the submission queue is corrupt: " + submissions_.corruption();
    }
  }
  if (!SharedClosed(header_)) return "";
  const uint32_t bytes = std::min<uint32_t>(
      std::atomic_ref<const uint32_t>(header_->reason_bytes).load(std::memory_order_relaxed),
      Header::kMaxReasonBytes);
  return std::string(header_->reason, bytes);
}

}  // namespace collectived
