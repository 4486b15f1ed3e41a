#include "engine/group/core/flight_recorder.h"

namespace collectived {

std::string_view OpStateName(OpRecord::State state) {
  switch (state) {
    case OpRecord::State::kWaitingForPeers:
      return "waiting_for_peers";
    case OpRecord::State::kRunning:
      return "running";
    case OpRecord::State::kCompleted:
      return "completed";
    case OpRecord::State::kFailed:
      return "failed";
  }
  return "unknown";
}

std::vector<int64_t> OpRecord::RankArrivalUs() const {
  std::vector<int64_t> dense(group_size > 0 ? group_size : 0, -1);
  for (const auto& [rank, us] : known_arrivals_us) {
    if (rank >= 0 && rank < static_cast<int>(dense.size())) dense[rank] = us;
  }
  return dense;
}

void FlightRecorder::Add(OpRecord record) {
  if (capacity_ == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  records_.push_back(std::move(record));
  while (records_.size() > capacity_) records_.pop_front();
}

std::vector<OpRecord> FlightRecorder::Snapshot(size_t limit) const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t first = limit == 0 || limit >= records_.size() ? 0 : records_.size() - limit;
  return {records_.begin() + static_cast<std::ptrdiff_t>(first), records_.end()};
}

}  // namespace collectived
