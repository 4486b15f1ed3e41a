#include "engine/group/core/op_accounting.h"

#include "engine/vocabulary/op_traits.h"

namespace collectived {

OpAccounting::OpAccounting(std::string group, DeviceKind device, const GroupTopology& topology,
                           std::shared_ptr<OpObserver> observer, size_t flight_recorder_size,
                           const Clock& clock)
    : group_(std::move(group)),
      device_(device),
      topology_(topology),
      observer_(std::move(observer)),
      clock_(clock),
      recorder_(flight_recorder_size) {}

OpRecord OpAccounting::Base(const OpRequest& r, uint64_t sequence_number) const {
  OpRecord record;
  const int n = topology_.group_size;
  record.group = group_;
  record.epoch = epoch_;
  record.device = device_;
  record.sequence_number = sequence_number;
  record.kind = r.kind;
  record.group_size = n;
  const std::vector<TensorView>& any = r.inputs.empty() ? r.outputs : r.inputs;
  if (!any.empty()) {
    record.dtype = any[0].dtype;
    record.count = any[0].count;
  }
  record.bytes = AlgorithmBytes(r, n);
  record.bus_factor = BusBandwidthFactor(r.kind, n);
  record.reducing = IsReducing(r.kind);
  record.reduce_op = r.reduce_op;
  record.root = IsRooted(r.kind) ? r.root : -1;
  return record;
}

OpRecord OpAccounting::Of(const PendingOp& op, OpRecord::State state, const Status& status) const {
  const OpRequest* request = op.AnyRequest();
  OpRecord record = request ? Base(*request, op.sequence_number) : OpRecord{};
  record.state = state;
  record.status = status;
  record.duration =
      std::chrono::duration_cast<std::chrono::microseconds>(clock_.Now() - op.first_arrival);
  const auto since_issue = [&op](std::chrono::steady_clock::time_point t) -> int64_t {
    if (t == std::chrono::steady_clock::time_point{}) return -1;
    return std::chrono::duration_cast<std::chrono::microseconds>(t - op.first_arrival).count();
  };
  record.data_started_us = since_issue(op.data_started);
  record.enqueued_us = since_issue(op.enqueued);
  record.device_done_us = since_issue(op.device_done);
  const std::vector<int>& local = topology_.local_ranks();
  // In rank order: the agreement's, or (not agreed yet) this sidecar's ranks that arrived (local
  // ranks ascend).
  std::vector<std::pair<int, int64_t>> local_arrivals;
  if (op.arrival_unix_us.empty()) {
    for (size_t l = 0; l < local.size() && l < op.local_arrival_unix_us.size(); ++l) {
      if (op.requests[l]) local_arrivals.emplace_back(local[l], op.local_arrival_unix_us[l]);
    }
  }
  const std::vector<std::pair<int, int64_t>>& arrivals =
      op.arrival_unix_us.empty() ? local_arrivals : op.arrival_unix_us;
  int64_t first = -1, last = -1;
  for (const auto& [rank, t] : arrivals) {
    if (t < 0) continue;
    if (first < 0 || t < first) first = t;
    if (last < 0 || t >= last) {  // ties: the highest rank
      last = t;
      record.last_rank = rank;
    }
  }
  int64_t local_first = -1;
  for (size_t l = 0; l < local.size() && l < op.local_arrival_unix_us.size(); ++l) {
    if (!op.requests[l]) {
      record.missing_ranks.push_back(local[l]);
    } else if (local_first < 0 || op.local_arrival_unix_us[l] < local_first) {
      local_first = op.local_arrival_unix_us[l];
    }
  }
  record.issued = std::chrono::system_clock::time_point(std::chrono::microseconds(local_first));
  if (first >= 0) {
    record.known_arrivals_us.reserve(arrivals.size());
    for (const auto& [rank, t] : arrivals) {
      if (t >= 0 && rank < topology_.group_size) {
        record.known_arrivals_us.emplace_back(rank, t - first);
      }
    }
    record.skew = std::chrono::microseconds(last - first);
  }
  record.last_rank_is_local = record.last_rank >= 0 && topology_.LocalIndex(record.last_rank) >= 0;
  return record;
}

void OpAccounting::Finish(OpRecord record) {
  if (observer_) observer_->OnOpFinished(record);
  recorder_.Add(std::move(record));
}

std::vector<OpRecord> OpAccounting::Finished(size_t limit) const {
  return recorder_.Snapshot(limit);
}

void OpAccounting::BackendAborted(ErrorKind reason) {
  if (observer_) observer_->OnBackendAborted(group_, device_, reason);
}

void OpAccounting::BackendError(ErrorKind kind) {
  if (observer_) observer_->OnBackendError(group_, device_, kind);
}

}  // namespace collectived
