// Group: the end of a shrinking group's epoch at a cut (docs/fault-tolerance.md). Apart from the
// pipeline (group.cc), which only tells it when ops conclude.
#include <algorithm>
#include <utility>
#include <vector>

#include "engine/group/core/group.h"
#include "engine/group/core/group_internal.h"

namespace collectived {

void Group::Retire(uint64_t through, RetiredCallback retired) {
  Status failed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (retirement_ && retirement_->done) return;
    if (!failure_.ok()) {
      failed = failure_;
      retirement_ = Retirement{through, nullptr, /*done=*/true};
    } else if (!retirement_) {
      retirement_ = Retirement{through, std::move(retired), false};
    } else {
      retirement_->through = std::min(retirement_->through, through);
    }
  }
  if (!failed.ok()) {
    if (retired) retired(failed, {});
    return;
  }
  MaybeFinishRetirement();
}

Group::TakenBack Group::TakeBackLocked(StartedOp& started) {
  PendingOp& op = started.op;
  TakenBack back{op.sequence_number, op.requests, std::move(op.works)};
  for (auto& request : op.requests) {
    if (request) request->stream_signal.reset();
  }
  op.works.assign(back.works.size(), nullptr);
  started.running.works.clear();
  return back;
}

void Group::TakeBackPendingLocked(std::vector<TakenBack>& taken) {
  for (auto& [seq, op] : pending_) {
    taken.push_back(TakenBack{seq, std::move(op.requests), std::move(op.works)});
  }
  pending_.clear();
  std::sort(taken.begin(), taken.end(), [](const TakenBack& a, const TakenBack& b) {
    return a.sequence_number < b.sequence_number;
  });
}

void Group::MaybeFinishRetirement() {
  std::vector<TakenBack> taken;
  RetiredCallback retired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!retirement_ || retirement_->done || !failure_.ok()) return;
    if (concluded_through_ < retirement_->through) return;
    retirement_->done = true;
    retired = std::move(retirement_->retired);
    // Started ops past the cut are in their agreement, waiting for a lost rank's announcement
    // that never comes: their flows end when the group stops, with nothing left to complete
    // (their works and stream signals go with the copy taken back).
    for (const auto& started : started_) {
      if (started->outcome) continue;
      taken.push_back(TakeBackLocked(*started));
    }
    TakeBackPendingLocked(taken);
  }
  if (retired) retired(Status::Ok(), std::move(taken));
}

}  // namespace collectived
