// Group: its deadlines: one timer armed for the earliest op timeout or stuck report, and what
// it finds when it fires. Apart from the pipeline (group.cc), which re-arms it as ops move.
#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "engine/group/core/group.h"
#include "engine/group/core/group_internal.h"
#include "engine/vocabulary/logging.h"

namespace collectived {

Clock::TimePoint Group::NextDeadlineLocked() const {
  Clock::TimePoint next = Clock::TimePoint::max();
  // The stuck report of the oldest op not checked yet (ops arrive in sequence order, so the
  // first one after the last checked is the oldest).
  if (spec_.stuck_threshold.count() > 0) {
    const PendingOp* oldest = nullptr;
    for (const auto& started : started_) {
      if (started->op.sequence_number > stuck_checked_through_ && !started->outcome) {
        oldest = &started->op;
        break;
      }
    }
    if (!oldest) {
      auto it = pending_.upper_bound(stuck_checked_through_);
      if (it != pending_.end()) oldest = &it->second;
    }
    if (oldest)
      next = std::min(next, Clock::Saturating(oldest->first_arrival, spec_.stuck_threshold));
  }
  // The next op, while a local rank has not issued it.
  if (auto it = pending_.find(next_to_start_);
      it != pending_.end() && it->second.arrived < topology_.local_ranks().size()) {
    next = std::min(next, Clock::Saturating(it->second.first_arrival, it->second.timeout));
  }
  // Ops waiting for their peers' agreement or for their device work.
  for (const auto& started : started_) {
    if (started->outcome) continue;
    if (started->phase == Phase::kAgreeing || started->phase == Phase::kEnqueued) {
      next = std::min(next, started->deadline);
    }
  }
  return next;
}

void Group::ArmTimerLocked() {
  if (!failure_.ok() || failing_) return;
  timer_.Arm(NextDeadlineLocked());
}

void Group::OnTimer() {
  std::vector<OpRecord> stuck;
  std::optional<Status> failure;
  bool abort_backend = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    timer_.Fired();
    const Clock::TimePoint now = clock_.Now();
    if (failure_.ok() && !failing_) {
      if (spec_.stuck_threshold.count() > 0) {
        // Each op is reported once: the check moves past it.
        auto report = [&](const PendingOp& op, const auto& record_of) {
          if (now < Clock::Saturating(op.first_arrival, spec_.stuck_threshold)) return false;
          stuck_checked_through_ = op.sequence_number;
          OpRecord late = record_of();
          late.duration =
              std::chrono::duration_cast<std::chrono::microseconds>(now - op.first_arrival);
          stuck.push_back(std::move(late));
          return true;
        };
        bool more = true;
        for (const auto& started : started_) {
          if (!more) break;
          if (started->op.sequence_number <= stuck_checked_through_ || started->outcome) continue;
          more = report(started->op, [&] { return started->running.record; });
        }
        for (auto it = pending_.upper_bound(stuck_checked_through_); more && it != pending_.end();
             ++it) {
          more = report(it->second, [&] {
            return accounting_.Of(it->second, OpRecord::State::kWaitingForPeers, Status::Ok());
          });
        }
      }
      const size_t local_count = topology_.local_ranks().size();
      if (auto it = pending_.find(next_to_start_);
          it != pending_.end() && it->second.arrived < local_count &&
          now >= Clock::Saturating(it->second.first_arrival, it->second.timeout)) {
        const PendingOp& waiting = it->second;
        std::vector<int> missing;
        for (size_t l = 0; l < local_count; ++l) {
          if (!waiting.requests[l]) missing.push_back(topology_.local_ranks()[l]);
        }
        failure = Status::Timeout("Timeout: " + Describe(waiting) + " Timed out after " +
                                  std::to_string(waiting.timeout.count()) + " ms: ranks " +
                                  FormatRanks(missing) + " never issued it");
      }
      for (const auto& started : started_) {
        if (failure || started->outcome || now < started->deadline) continue;
        const PendingOp& op = started->op;
        if (started->phase == Phase::kAgreeing) {
          // Every local rank issued the op, so the ones that did not are among the other
          // sidecars' ranks; the exchange tells which sidecars have not answered.
          std::vector<int> remote;
          for (int rank = 0; rank < topology_.group_size; ++rank) {
            if (topology_.LocalIndex(rank) < 0) remote.push_back(rank);
          }
          std::string silent;
          for (int node : control_->AwaitedNodes()) {
            silent += (silent.empty() ? "" : ", ") + std::to_string(node);
          }
          failure = Status::Timeout("Timeout: " + Describe(op) + " Timed out after " +
                                    std::to_string(op.timeout.count()) + " ms waiting for ranks " +
                                    FormatRanks(remote) +
                                    " of the other sidecars (one or more never issued it): no "
                                    "answer from sidecar nodes [" +
                                    silent + "]");
        } else if (started->phase == Phase::kEnqueued) {
          failure = Status::Timeout("Timeout: " + Describe(op) + " Timed out after " +
                                    std::to_string(op.timeout.count()) +
                                    " ms: its device work did not complete");
          abort_backend = true;
        }
      }
      if (failure) failing_ = true;
      ArmTimerLocked();
    }
  }
  for (const OpRecord& record : stuck) {
    LogWarning(
        "collective stuck",
        {{"group", record.group},
         {"seq", std::to_string(record.sequence_number)},
         {"op", std::string(OpKindName(record.kind))},
         {"state", std::string(OpStateName(record.state))},
         {"age_ms", std::to_string(record.duration.count() / 1000)},
         {"missing_local_ranks", FormatRanks(record.missing_ranks)},
         {"hint", record.missing_ranks.empty()
                      ? "waiting for ranks on other sidecars: run collectivectl describe there"
                      : "these ranks of this sidecar have not issued the op"}});
    if (spec_.observer) spec_.observer->OnOpStuck(record);
  }
  if (failure) {
    if (abort_backend) accounting_.BackendError(ErrorKind::kTimeout);
    // Failing publishes the reason through the store: not on the timer's thread.
    Post([this, reason = *failure] {
      Fail(reason);
      std::lock_guard<std::mutex> lock(mutex_);
      failing_ = false;
    });
  }
  activities_.Exit();  // this timer's
}

}  // namespace collectived
