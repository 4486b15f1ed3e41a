// ClientWork: the handle of one op a client submitted, completed by the session's readers.
#include <algorithm>

#include "clients/cpp/client_impl.h"
#include "clients/cpp/cuda_tensor_export.h"
#include "engine/vocabulary/op_traits.h"

namespace collectived {

using client_detail::DescribeWork;
using std::chrono::milliseconds;

ClientWork::ClientWork(std::string group, CollectiveType type, uint64_t client_op_id,
                       std::vector<ClientTensor> writeback)
    : group_(std::move(group)),
      type_(type),
      client_op_id_(client_op_id),
      writeback_(std::move(writeback)),
      future_(promise_.future()) {}

Status ClientWork::Wait(std::optional<milliseconds> timeout) const {
  if (!timeout.has_value()) return future_.Wait();
  static_cast<void>(future_.Wait(*timeout));
  // The op's own failure may be a Timeout too; only a wait that ended first gets this message.
  if (IsCompleted()) return future_.status();
  return WaitTimedOut(*timeout);
}

Status ClientWork::WaitStream(void* cuda_stream, std::optional<milliseconds> timeout) const {
  if (cuda_device_ < 0) return Wait(timeout);
  if (signal_words_ != nullptr) {
    // Completed: its GPU work ran (or it failed); Wait returns at once.
    if (IsCompleted()) return Wait(timeout);
    Status ordered = WaitForSignal(cuda_device_, cuda_stream, signal_.word, signal_.value);
    if (ordered.ok()) return ordered;
    if (ordered.kind() != ErrorKind::kUnavailable) {
      return ordered.WithContext(DescribeWork(op(), client_op_id_, group_));
    }
    signal_words_->Disable();  // the driver cannot wait on a word: later ops take events
    return Wait(timeout);      // and this one waits on the CPU, as host ops
  }
  std::string event;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [this] { return completing_ || !completion_event_.empty(); };
    if (!timeout.has_value()) {
      enqueued_cv_.wait(lock, ready);
    } else if (!enqueued_cv_.wait_for(lock, std::max(*timeout, milliseconds(0)), ready)) {
      return WaitTimedOut(*timeout);
    }
    // Completed: its GPU work ran (the sidecar saw its stream finish); Wait returns at once.
    if (!completing_) event = completion_event_;
  }
  if (event.empty()) return Wait(timeout);
  Status ordered = WaitForSidecarEvent(cuda_device_, cuda_stream, event);
  return ordered.ok() ? ordered : ordered.WithContext(DescribeWork(op(), client_op_id_, group_));
}

void ClientWork::MarkEnqueued(const std::string& completion_event) {
  ReleaseReadyEvents();  // enqueued: the sidecar's stream waited on them
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completing_ || completion_event.empty()) return;
    completion_event_ = completion_event;
  }
  enqueued_cv_.notify_all();
}

void ClientWork::ReleaseReadyEvents() {
  OpReadyLeases leases = TakeReadyEvents();
  // Given back as `leases` goes.
}

OpReadyLeases ClientWork::TakeReadyEvents() {
  OpReadyLeases leases;
  std::lock_guard<std::mutex> lock(mu_);
  std::swap(leases, ready_leases_);
  return leases;
}

Status ClientWork::WaitTimedOut(milliseconds timeout) const {
  return Status::Timeout("Timeout: " + DescribeWork(op(), client_op_id_, group_) +
                         " Timed out: it did not complete within " +
                         std::to_string(std::max<int64_t>(timeout.count(), 0)) +
                         " ms; the op keeps running until it completes or its own timeout "
                         "passes");
}

uint64_t ClientWork::sequence_number() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sequence_number_;
}

int ClientWork::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_;
}

uint64_t ClientWork::epoch_first_sequence_number() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_first_sequence_;
}

int ClientWork::source_rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return source_rank_;
}

uint64_t ClientWork::inline_result_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inline_result_bytes_;
}

std::chrono::microseconds ClientWork::duration() const {
  std::lock_guard<std::mutex> lock(mu_);
  return duration_;
}

bool ClientWork::CompleteFrom(const v1::CollectiveResponse& response) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completing_) return false;
    completing_ = true;
    sequence_number_ = response.sequence_number();
    epoch_ = static_cast<int>(response.epoch());
    epoch_first_sequence_ = std::max<uint64_t>(1, response.epoch_first_sequence_number());
    if (type_ == CollectiveType::kRecv) source_rank_ = response.source_rank();
    duration_ = std::chrono::microseconds(response.duration_us());
    for (const std::string& output : response.outputs()) inline_result_bytes_ += output.size();
  }
  enqueued_cv_.notify_all();
  ReleaseReadyEvents();
  Status status = client_internal::StatusFromProto(response.error());
  if (status.ok()) {
    status = client_internal::ApplyInlineOutputs(type_, writeback_, response);
    if (!status.ok()) status = status.WithContext(DescribeWork(op(), client_op_id_, group_));
  }
  ReleaseSignal(status.ok());
  if (status.ok()) return promise_.SetValue();
  return promise_.SetError(std::move(status));
}

bool ClientWork::Fail(Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completing_) return false;
    completing_ = true;
  }
  enqueued_cv_.notify_all();
  ReleaseReadyEvents();
  ReleaseSignal(/*succeeded=*/false);
  return promise_.SetError(std::move(status));
}

void ClientWork::ReleaseSignal(bool succeeded) {
  if (signal_words_ != nullptr) signal_words_->Completed(signal_, succeeded);
}

}  // namespace collectived
