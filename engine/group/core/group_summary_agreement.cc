// Group: the summary agreement of large groups, where every sidecar combines one fixed-size
// AgreementSummary up and down a tree instead of gathering every rank's announcement. Apart from
// the full agreement (group_agreement.cc), which it falls back to when ranks disagree.
#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/group/algorithms/algorithms.h"
#include "engine/group/core/group.h"
#include "engine/group/core/group_internal.h"

namespace collectived {

using group_internal::AgreementSummary;
using group_internal::CombineAs;

void Group::StartSummaryAgreement(StartedOp& started) {
  PendingOp& op = started.op;
  const std::vector<int>& local = topology_.local_ranks();
  AgreementSummary& mine = started.summary;
  mine = AgreementSummary{};
  for (size_t l = 0; l < op.requests.size(); ++l) {
    const OpSignature signature = MakeSignature(*op.requests[l], op.sequence_number);
    if (l == 0) mine.signature = signature;
    if (!(signature == mine.signature)) mine.disagree = 1;
    const int64_t arrival = op.local_arrival_unix_us[l];
    if (arrival < mine.first_arrival_unix_us) {
      mine.first_arrival_unix_us = arrival;
      mine.first_rank = local[l];
    }
    if (arrival >= mine.last_arrival_unix_us) {
      mine.last_arrival_unix_us = arrival;
      mine.last_rank = local[l];
    }
  }
  std::vector<const OpRequest*> requests;
  for (const auto& request : op.requests) requests.push_back(&*request);
  mine.filled = mine.disagree == 0 && capabilities_.cpu_accessible &&
                PackSmallAllReduce(*data_, requests, mine.payload, kPiggybackPayloadBytes);
  // The payloads combine as the op does: its reduction, type and count (only where every rank
  // issued the same op, which the signatures say).
  const OpRequest& first = *op.requests[0];
  const ReduceOp reduce_op = first.reduce_op;
  const DType dtype = first.inputs.empty() ? DType::kUnspecified : first.inputs[0].dtype;
  const size_t count = first.inputs.empty() ? 0 : first.inputs[0].count;
  DataBackend* backend = data_.get();
  auto combine = CombineAs<AgreementSummary>(
      [backend, reduce_op, dtype, count](AgreementSummary& acc, const AgreementSummary& later) {
        acc.disagree = acc.disagree | later.disagree | !(acc.signature == later.signature);
        acc.filled =
            acc.filled && later.filled && !acc.disagree &&
            backend->Combine(reduce_op, dtype, acc.payload, acc.payload, later.payload, count).ok();
        if (later.first_arrival_unix_us < acc.first_arrival_unix_us) {
          acc.first_arrival_unix_us = later.first_arrival_unix_us;
          acc.first_rank = later.first_rank;
        }
        if (later.last_arrival_unix_us >= acc.last_arrival_unix_us) {
          acc.last_arrival_unix_us = later.last_arrival_unix_us;
          acc.last_rank = later.last_rank;
        }
      });
  control_->StartAllReduce(&started.summary, &started.combined, sizeof(AgreementSummary),
                           std::move(combine),
                           OpTags(op.sequence_number).Control<OpTags::kSummary>(),
                           [this, &started](const Status& status) { OnSummary(started, status); });
}

void Group::OnSummary(StartedOp& started, const Status& status) {
  if (!status.ok()) {
    AgreementFailed(started, status);
    return;
  }
  const AgreementSummary& all = started.combined;
  if (all.disagree) {
    // Some rank issued another op: every node learnt it alike, and the full exchange names who.
    StartFullAgreement(started);
    return;
  }
  PendingOp& op = started.op;
  // Known here: this node's ranks, the first and the last to arrive anywhere.
  op.arrival_unix_us.clear();
  const std::vector<int>& local = topology_.local_ranks();
  for (size_t l = 0; l < local.size(); ++l) {
    op.arrival_unix_us.emplace_back(local[l], op.local_arrival_unix_us[l]);
  }
  for (auto [rank, us] : {std::pair<int, int64_t>{all.first_rank, all.first_arrival_unix_us},
                          std::pair<int, int64_t>{all.last_rank, all.last_arrival_unix_us}}) {
    if (rank >= 0 && rank < topology_.group_size) op.arrival_unix_us.emplace_back(rank, us);
  }
  std::sort(op.arrival_unix_us.begin(), op.arrival_unix_us.end());
  op.arrival_unix_us.erase(
      std::unique(op.arrival_unix_us.begin(), op.arrival_unix_us.end(),
                  [](const auto& a, const auto& b) { return a.first == b.first; }),
      op.arrival_unix_us.end());
  if (all.filled) {
    started.slots.assign(kPiggybackSlotBytes, std::byte{0});
    std::memcpy(started.slots.data() + kPiggybackHeaderBytes, all.payload, kPiggybackPayloadBytes);
    started.piggybacked = true;
    started.piggybacked_payloads = 1;
  }
  AfterSignatures(started);
}

}  // namespace collectived
