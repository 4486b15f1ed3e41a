// Group: how it fails: the first reason fails every op, a transport error is traced to a peer's
// published reason or a roll call, and a leaving rank's ops are aborted. Apart from the pipeline
// (group.cc), which only reports errors here.
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/group/core/group.h"
#include "engine/group/core/group_internal.h"
#include "engine/vocabulary/logging.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

// How long live peers get to answer a roll call after a connection broke. Live sidecars answer
// in milliseconds; the one that died never does, and the failure is reported this much later.
constexpr milliseconds kRollCallBudget{750};

// Adds to `words` the stream signal of `request` (a rank's), if it has one: a failed or refused
// op's word is set before its work completes, as a concluded op's is (see Group::Conclude).
void CollectSignal(const std::optional<OpRequest>& request, std::vector<StreamSignal>& words) {
  if (request && request->stream_signal) words.push_back(*request->stream_signal);
}

void StoreSignals(const std::vector<StreamSignal>& words) {
  for (const StreamSignal& word : words) StoreSignal(word);
}

}  // namespace

void Group::OnPeerConnectionBroken(const Status& why) {
  bool in_flight;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight = failure_.ok() && !started_.empty();
  }
  if (!in_flight) return;
  LogWarning(commits_ ? "a peer sidecar's connection broke while ops were on the device: "
                        "asking which sidecars are lost"
                      : "a peer sidecar's connection broke while ops were on the device: failing "
                        "them",
             {{"group", spec_.name}, {"why", why.message()}});
  (void)PeerError(why, "group '" + spec_.name + "'");
}

void Group::Fail(const Status& reason, bool from_peer, uint64_t peer_completed_through) {
  std::vector<std::shared_ptr<Work>> orphans;
  std::vector<StreamSignal> orphans_words;
  std::map<uint64_t, PendingOp> doomed;
  std::vector<std::pair<PendingOp, Status>> concluded;
  uint64_t completed_through = 0;
  bool in_use = false;  // not the teardown of an idle group
  bool cancelled = false;
  RetiredCallback retirement_failed;  // a retirement the failure ends
  FrozenCallback frozen_failed;       // a freeze the failure ends
  std::vector<OpRecord> in_flight;    // for the post-mortem
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.ok()) return;
    if (from_peer) {
      for (const auto& started : started_) {
        if (started->op.sequence_number <= peer_completed_through && !started->outcome) {
          // The peer finished this op: let it finish here too (or fail on its own, should a
          // transfer it still needs break); the failure applies once it concludes.
          if (!deferred_failure_) deferred_failure_ = Deferred{reason, peer_completed_through};
          return;
        }
      }
    }
    failure_ = reason;
    completed_through = concluded_through_;
    // In use: an op is running or waiting here, or the group failed for a reason that only an
    // op in flight elsewhere gives (an abort, a timeout, a desync). A group whose rank or peer
    // left between ops (destroyed, shut down, a session that ended) aborts nothing anyone used:
    // counting it made every job's clean exit look like a lost peer.
    in_use = !pending_.empty() || (!stop_requested_ && reason.kind() != ErrorKind::kPeerLost);
    // A retired epoch that stops was not in use: its ops after the cut went to the next one.
    const bool retired = RetiredLocked();
    if (retirement_ && !retirement_->done) {
      retirement_->done = true;
      retirement_failed = std::move(retirement_->retired);
    }
    for (const auto& started : started_) {
      if (started->outcome) continue;
      in_use = in_use || !retired;
      orphans.insert(orphans.end(), started->running.works.begin(), started->running.works.end());
      for (const auto& request : started->op.requests) CollectSignal(request, orphans_words);
      // An agreed op waiting for the data slot is in no flow, nor is one held by a freeze: it
      // ends here.
      if (started->phase == Phase::kAgreed || started->held) started->outcome = reason;
    }
    // The ops still in a flow: the others conclude below and are among the finished records.
    if (in_use && hooks_.on_failed) in_flight = InFlightRecordsLocked(/*in_flows_only=*/true);
    PopEndedLocked(concluded);
    doomed.swap(pending_);
    cancelled = timer_.Cancel();
    if (freezing_ && !freezing_->reported) {
      freezing_->reported = true;
      frozen_failed = std::move(freezing_->frozen);
    }
  }
  point_to_point_.FailAll(reason);
  if (!from_peer && hooks_.publish_failure) hooks_.publish_failure(reason, completed_through);
  control_->Close();
  data_->Abort();
  if (in_use) accounting_.BackendAborted(reason.kind());
  StoreSignals(orphans_words);
  for (auto& work : orphans) work->Complete(reason.WithContextOnce(work->info().Describe()));
  // The ops still in a flow conclude as their flows end (closing the channel and aborting the
  // backend ends them); the others conclude here.
  for (auto& [op, result] : concluded) Conclude(op, result);
  for (auto& [seq, op] : doomed) Conclude(op, reason);
  if (in_use && hooks_.on_failed) {
    std::vector<OpRecord> records = accounting_.Finished(0);
    records.insert(records.end(), std::make_move_iterator(in_flight.begin()),
                   std::make_move_iterator(in_flight.end()));
    hooks_.on_failed(*this, reason, std::move(records));
  }
  if (retirement_failed) retirement_failed(reason, {});
  if (frozen_failed) frozen_failed(reason, 0);
  if (cancelled) activities_.Exit();
}

Status Group::PeerError(const Status& status, const std::string& where) {
  // Already failed: that reason stands (no store lookup, no roll call).
  if (Status failed = failure(); !failed.ok()) return failed.WithContextOnce(where);
  bool retired;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // Frozen after a sidecar loss: whatever broke since (this sidecar closed the connections
    // itself), the op waits for the cut.
    if (freezing_) return freezing_->why.WithContextOnce(where);
    retired = RetiredLocked();
  }
  if (retired) {
    // A retired epoch's peers close its connections once every sidecar retired it: nothing was
    // lost, and nobody waits for what is left of it.
    Fail(Status::Aborted("epoch " + std::to_string(spec_.epoch) + " of group '" + spec_.name +
                         "' retired"),
         /*from_peer=*/true);
    return failure().WithContextOnce(where);
  }
  Status reason = status;
  bool from_peer = false;
  if (!status.IsTimeout() && hooks_.lookup_failure) {
    // A broken connection usually means a peer failed first and published why.
    if (std::optional<Status> published = hooks_.lookup_failure()) {
      reason = *published;
      from_peer = true;
    }
  }
  if (!from_peer && reason.kind() == ErrorKind::kPeerLost) {
    if (commits_ && hooks_.sidecars_lost) {
      if (std::optional<Status> frozen = FreezeOnLostSidecars(status, where)) return *frozen;
    }
    reason = NameLostPeers(status);
  }
  reason = reason.WithContextOnce(where);
  Fail(reason, from_peer);
  Status failed = failure();
  return failed.ok() ? reason : failed.WithContextOnce(where);
}

std::optional<std::vector<int>> Group::SilentPeers() {
  std::vector<int> peers;
  std::vector<std::string> peer_ids;
  for (int node = 0; node < topology_.node_count(); ++node) {
    if (node == topology_.my_node) continue;
    peers.push_back(node);
    peer_ids.push_back(topology_.node_ids[node]);
  }
  if (!hooks_.roll_call) return std::nullopt;
  std::optional<std::vector<int>> silent = hooks_.roll_call(peer_ids, kRollCallBudget);
  if (!silent) return std::nullopt;
  std::vector<int> nodes;
  for (int index : *silent) nodes.push_back(peers[index]);
  return nodes;
}

Status Group::NameLostPeers(const Status& broken, std::vector<int>* lost) {
  std::vector<int> peers;
  for (int node = 0; node < topology_.node_count(); ++node) {
    if (node != topology_.my_node) peers.push_back(node);
  }
  std::optional<std::vector<int>> silent = SilentPeers();
  if (silent && !silent->empty()) {
    const std::vector<int>& gone = *silent;
    if (lost) *lost = gone;
    const bool others_answered = gone.size() < peers.size();
    // No group name here: every caller annotates with the op and its group.
    return Status::PeerLost("lost " + topology_.DescribeNodes(gone) +
                            ": the connection broke and " + (gone.size() == 1 ? "it" : "they") +
                            " did not answer within " + std::to_string(kRollCallBudget.count()) +
                            " ms" + (others_answered ? " (the other peers did)" : "") + ": " +
                            broken.message());
  }
  return Status::PeerLost("lost the connection to a peer sidecar of group '" + spec_.name +
                          "' (peers: " + topology_.DescribeNodes(peers) + "): " + broken.message());
}

void Group::AbortRank(int group_rank, const Status& reason) {
  const int local = topology_.LocalIndex(group_rank);
  if (local < 0) return;
  std::vector<std::shared_ptr<Work>> doomed;
  std::vector<StreamSignal> words;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [seq, op] : pending_) {
      if (op.works[local]) doomed.push_back(op.works[local]);
      if (local < static_cast<int>(op.requests.size())) CollectSignal(op.requests[local], words);
    }
    for (const auto& started : started_) {
      if (local < static_cast<int>(started->running.works.size()) && !started->outcome) {
        doomed.push_back(started->running.works[local]);
        if (local < static_cast<int>(started->op.requests.size())) {
          CollectSignal(started->op.requests[local], words);
        }
      }
    }
  }
  point_to_point_.FailRank(group_rank, reason);
  StoreSignals(words);
  for (auto& work : doomed) work->Complete(reason.WithContextOnce(work->info().Describe()));
}

}  // namespace collectived
