#include "engine/vocabulary/work.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace collectived {

namespace internal {

std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::milliseconds timeout) {
  return Clock::Real().After(timeout);
}

void ContractViolation(const char* what, const Status& status) {
  std::fprintf(stderr, "collectived: contract violation: %s (status: %s)\n", what,
               status.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace internal

std::string OpInfo::Describe() const {
  return op + " (seq " + std::to_string(sequence_number) + ") on group '" + group + "'";
}

Work::Work(OpInfo info, std::chrono::milliseconds timeout, const Clock& clock)
    : info_(std::move(info)),
      timeout_(timeout),
      clock_(clock),
      created_(clock.Now()),
      deadline_(Clock::Saturating(created_, timeout)),
      future_(promise_.future()) {}

Work::~Work() {
  if (!IsCompleted()) {
    Complete(Status::Internal("promise abandoned: " + info_.Describe() +
                              " was destroyed before it completed"));
  }
}

Status Work::Wait(std::optional<std::chrono::milliseconds> timeout) const {
  const std::chrono::milliseconds waited = timeout.value_or(timeout_);
  const std::chrono::steady_clock::time_point deadline =
      timeout.has_value() ? clock_.After(*timeout) : deadline_;
  // Only the readiness matters here: the Future's own Timeout status is replaced by ours, and
  // a completion that races with the deadline still reports the op's real outcome.
  (void)future_.WaitUntil(deadline, clock_);
  if (future_.IsReady()) return future_.status();
  return TimeoutError(std::max(waited, std::chrono::milliseconds::zero()));
}

WorkTimes Work::times() const {
  std::lock_guard<std::mutex> lock(mu_);
  return WorkTimes{created_, started_, finished_};
}

Status Work::TimeoutError(std::chrono::milliseconds waited) const {
  return Status::Timeout("Timeout: " + info_.Describe() + " Timed out after " +
                         std::to_string(waited.count()) + " ms: it did not complete");
}

Work::EpochStamp Work::epoch_stamp() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_stamp_;
}

void Work::SetEpochStamp(EpochStamp stamp) {
  std::lock_guard<std::mutex> lock(mu_);
  epoch_stamp_ = stamp;
}

int Work::source_rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return source_rank_;
}

void Work::SetSourceRank(int group_rank) {
  std::lock_guard<std::mutex> lock(mu_);
  source_rank_ = group_rank;
}

void Work::MarkStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!started_.has_value() && !finished_.has_value()) {
    started_ = clock_.Now();
  }
}

bool Work::Complete(Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_.has_value()) return false;
    finished_ = clock_.Now();
  }
  // Only Complete() completes promise_, and only the call that set finished_ gets here, so the
  // promise is completed exactly once and after finished_ is visible to callbacks.
  return status.ok() ? promise_.SetValue() : promise_.SetError(std::move(status));
}

}  // namespace collectived
