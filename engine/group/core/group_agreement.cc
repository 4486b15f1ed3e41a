// Group: the agreement on each op before its data moves: every rank's signature, then an
// alltoall's per-pair counts. A protocol of its own over the control channel, apart from the
// pipeline (group.cc); the summary agreement of large groups is in group_summary_agreement.cc.
#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/group/algorithms/algorithms.h"
#include "engine/group/core/group.h"
#include "engine/group/core/group_internal.h"
#include "engine/vocabulary/op_traits.h"
#include "engine/vocabulary/random_id.h"

namespace collectived {
namespace {

// SplitMix64's finalizer: a bijection of 64 bits that mixes every bit into every other.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A digest under `key` of "rank `from` sends `count` elements to rank `to`".
uint64_t PairDigest(uint64_t key, int from, int to, int64_t count) {
  const uint64_t pair =
      (static_cast<uint64_t>(static_cast<uint32_t>(from)) << 32) | static_cast<uint32_t>(to);
  return Mix(Mix(key ^ Mix(pair)) ^ static_cast<uint64_t>(count));
}

using std::chrono::milliseconds;

// Ops whose per-pair block sizes differ from rank to rank, so that the signature cannot carry
// them: every pair is checked instead (gather and scatter have one count, in the signature).
bool HasPerPairCounts(OpKind kind) {
  const OpTraits& traits = TraitsOf(kind);
  return traits.family == OpFamily::kAllToAll && !traits.rooted;
}

}  // namespace

using group_internal::Announcement;
using group_internal::CombineAs;

void Group::StartAgreement(StartedOp& started) {
  if (topology_.node_count() >= spec_.summary_agreement_from_nodes) {
    StartSummaryAgreement(started);
    return;
  }
  StartFullAgreement(started);
}

void Group::StartFullAgreement(StartedOp& started) {
  PendingOp& op = started.op;
  const std::vector<int>& local = topology_.local_ranks();
  const size_t slot_bytes = topology_.node_count() > 1 ? kPiggybackSlotBytes : 0;
  started.mine.assign(signature_bytes_per_node_[topology_.my_node], std::byte{0});
  for (size_t l = 0; l < op.requests.size(); ++l) {
    const Announcement announcement{MakeSignature(*op.requests[l], op.sequence_number),
                                    op.local_arrival_unix_us[l]};
    std::memcpy(started.mine.data() + l * sizeof(Announcement), &announcement,
                sizeof(Announcement));
  }
  if (slot_bytes > 0 && capabilities_.cpu_accessible) {
    std::byte* slot = started.mine.data() + local.size() * sizeof(Announcement);
    std::vector<const OpRequest*> requests;
    for (const auto& request : op.requests) requests.push_back(&*request);
    if (PackSmallAllReduce(*data_, requests, slot + kPiggybackHeaderBytes,
                           kPiggybackPayloadBytes)) {
      slot[0] = std::byte{1};
    }
  }
  started.all.assign(signature_bytes_, std::byte{0});
  const OpTags tags(op.sequence_number);
  control_->StartAllGather(
      started.mine.data(), started.all.data(), signature_bytes_per_node_,
      tags.Control<OpTags::kSignatures>(),
      [this, &started](const Status& status) { OnSignatures(started, status); });
}

void Group::OnSignatures(StartedOp& started, const Status& status) {
  if (!status.ok()) {
    AgreementFailed(started, status);
    return;
  }
  PendingOp& op = started.op;
  const int n = topology_.group_size;
  const size_t slot_bytes = topology_.node_count() > 1 ? kPiggybackSlotBytes : 0;
  std::vector<OpSignature> by_rank(n);
  std::vector<int64_t> arrivals(n, -1);
  for (int node = 0; node < topology_.node_count(); ++node) {
    const std::vector<int>& ranks = topology_.ranks_of_node[node];
    for (size_t i = 0; i < ranks.size(); ++i) {
      Announcement announcement;
      std::memcpy(&announcement,
                  started.all.data() + signature_offsets_[node] + i * sizeof(Announcement),
                  sizeof(Announcement));
      by_rank[ranks[i]] = announcement.signature;
      arrivals[ranks[i]] = announcement.arrival_unix_us;
    }
  }
  op.arrival_unix_us.clear();
  op.arrival_unix_us.reserve(n);
  for (int rank = 0; rank < n; ++rank) op.arrival_unix_us.emplace_back(rank, arrivals[rank]);
  // Described (a string per rank) only when some rank differs: at thousands of ranks that is
  // the agreement's own cost.
  const bool agreed = std::all_of(by_rank.begin(), by_rank.end(),
                                  [&](const OpSignature& each) { return each == by_rank[0]; });
  std::map<std::string, std::vector<int>> variants;
  for (int rank = 0; !agreed && rank < n; ++rank) {
    variants[DescribeSignature(by_rank[rank])].push_back(rank);
  }
  if (variants.size() > 1) {
    std::string message = "ranks issued different ops for sequence number " +
                          std::to_string(op.sequence_number) + " of group '" + spec_.name + "':";
    for (const auto& [description, ranks] : variants) {
      message += " ranks " + FormatRanks(ranks) + " issued " + description + ";";
    }
    message.pop_back();
    FinishOp(started, Status::Desync(message));
    return;
  }
  if (slot_bytes > 0) {
    // The same op everywhere, so every node decided alike; still, use the slots only if each
    // one was filled.
    started.slots.resize(static_cast<size_t>(topology_.node_count()) * kPiggybackSlotBytes);
    bool all_filled = true;
    for (int node = 0; node < topology_.node_count(); ++node) {
      const std::byte* slot = started.all.data() + signature_offsets_[node] +
                              signature_bytes_per_node_[node] - slot_bytes;
      all_filled = all_filled && slot[0] == std::byte{1};
      std::memcpy(started.slots.data() + node * kPiggybackSlotBytes, slot, kPiggybackSlotBytes);
    }
    started.piggybacked = all_filled;
    started.piggybacked_payloads = topology_.node_count();
  }
  AfterSignatures(started);
}

void Group::AfterSignatures(StartedOp& started) {
  PendingOp& op = started.op;
  const int n = topology_.group_size;
  if (!HasPerPairCounts(op.requests[0]->kind)) {
    Agreed(started);
    return;
  }
  // Every pair must agree on its block: what a sends to b is what b expects from a.
  if (n > spec_.split_digest_above_ranks) {
    // The digests are keyed by a value no rank knows when it gives its splits: every node draws
    // one, and the key is all of them combined (XOR).
    (void)FromHex(RandomHex(sizeof(started.counts_key)), &started.counts_key,
                  sizeof(started.counts_key));
    control_->StartAllReduce(
        &started.counts_key, &started.counts_key, sizeof(started.counts_key),
        CombineAs<uint64_t>([](uint64_t& acc, const uint64_t& later) { acc ^= later; }),
        OpTags(op.sequence_number).Control<OpTags::kCountsKey>(),
        [this, &started](const Status& status) { OnCountsKey(started, status); });
    return;
  }
  const std::vector<int>& local = topology_.local_ranks();
  started.rows.clear();
  for (size_t l = 0; l < local.size(); ++l) {
    auto send = SendCounts(*op.requests[l], local[l], n);
    auto recv = RecvCounts(*op.requests[l], local[l], n);
    started.rows.insert(started.rows.end(), send.begin(), send.end());
    started.rows.insert(started.rows.end(), recv.begin(), recv.end());
  }
  started.matrix.assign(static_cast<size_t>(n) * 2 * n, 0);
  std::vector<size_t> bytes_per_node;
  for (const auto& ranks : topology_.ranks_of_node)
    bytes_per_node.push_back(ranks.size() * 2 * n * sizeof(int64_t));
  control_->StartAllGather(started.rows.data(), started.matrix.data(), std::move(bytes_per_node),
                           OpTags(op.sequence_number).Control<OpTags::kAllToAllCounts>(),
                           [this, &started](const Status& status) { OnCounts(started, status); });
}

void Group::OnCountsKey(StartedOp& started, const Status& status) {
  if (!status.ok()) {
    AgreementFailed(started, status);
    return;
  }
  // Summed over every pair, once by the sender's node and once by the receiver's: the sums
  // differ when some pair disagrees (but for a 2^-64 chance: the digest is no MAC, but its key
  // was drawn after every rank gave its splits).
  const PendingOp& op = started.op;
  const int n = topology_.group_size;
  const std::vector<int>& local = topology_.local_ranks();
  const uint64_t key = started.counts_key;
  started.count_digests = {0, 0};
  for (size_t l = 0; l < local.size(); ++l) {
    const std::vector<int64_t> send = SendCounts(*op.requests[l], local[l], n);
    const std::vector<int64_t> recv = RecvCounts(*op.requests[l], local[l], n);
    for (int other = 0; other < n; ++other) {
      started.count_digests[0] += PairDigest(key, local[l], other, send[other]);
      started.count_digests[1] += PairDigest(key, other, local[l], recv[other]);
    }
  }
  using Digests = std::array<uint64_t, 2>;
  control_->StartAllReduce(
      &started.count_digests, &started.count_digests, sizeof(started.count_digests),
      CombineAs<Digests>([](Digests& acc, const Digests& later) {
        acc[0] += later[0];
        acc[1] += later[1];
      }),
      OpTags(op.sequence_number).Control<OpTags::kAllToAllCounts>(),
      [this, &started](const Status& status) { OnCountDigests(started, status); });
}

void Group::OnCountDigests(StartedOp& started, const Status& status) {
  if (!status.ok()) {
    AgreementFailed(started, status);
    return;
  }
  if (started.count_digests[0] != started.count_digests[1]) {
    const PendingOp& op = started.op;
    FinishOp(started,
             Status::Desync(std::string(OpKindName(op.requests[0]->kind)) + " (seq " +
                            std::to_string(op.sequence_number) + ") on group '" + spec_.name +
                            "': the ranks' split sizes disagree: what some rank sends to another "
                            "is not what that rank expects from it (the pair is named in groups "
                            "of at most " +
                            std::to_string(spec_.split_digest_above_ranks) +
                            " ranks, whose sidecars gather every rank's split sizes)"));
    return;
  }
  Agreed(started);
}

void Group::OnCounts(StartedOp& started, const Status& status) {
  if (!status.ok()) {
    AgreementFailed(started, status);
    return;
  }
  const PendingOp& op = started.op;
  const int n = topology_.group_size;
  auto row = [&](int rank) {
    return started.matrix.data() + static_cast<size_t>(topology_.node_major_position[rank]) * 2 * n;
  };
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      const int64_t sends = row(a)[b];
      const int64_t expects = row(b)[n + a];
      if (sends != expects) {
        FinishOp(started,
                 Status::Desync(std::string(OpKindName(op.requests[0]->kind)) + " (seq " +
                                std::to_string(op.sequence_number) + ") on group '" + spec_.name +
                                "': rank " + std::to_string(a) + " sends " + std::to_string(sends) +
                                " elements to rank " + std::to_string(b) + " but rank " +
                                std::to_string(b) + " expects " + std::to_string(expects) +
                                " from rank " + std::to_string(a)));
        return;
      }
    }
  }
  Agreed(started);
}

void Group::AgreementFailed(StartedOp& started, const Status& status) {
  // The group's failure (a timeout closed the channel, a peer failed) or a broken connection:
  // what to report is the group's decision, which may ask the store (on the executor).
  runtime_.executor().Post(
      [this, &started, status] { FinishOp(started, PeerError(status, Describe(started.op))); });
}

void Group::Agreed(StartedOp& started) {
  if (started.piggybacked) {
    // The exchange carried every node's contribution: the op is done here, on this thread.
    started.op.data_started = clock_.Now();
    std::vector<OpRequest*> requests;
    for (auto& request : started.op.requests) requests.push_back(&*request);
    OpContext context{topology_,       *data_,
                      requests,        OpTags(started.op.sequence_number),
                      milliseconds(1), &runtime_.executor()};
    Status reduced = commits_ ? KeepOutputs(started) : Status::Ok();
    if (reduced.ok()) {
      reduced = FinishSmallAllReduce(context, started.slots.data() + kPiggybackHeaderBytes,
                                     kPiggybackSlotBytes, started.piggybacked_payloads);
    }
    if (commits_ && reduced.ok()) {
      Commit(started);
      return;
    }
    FinishOp(started, reduced);
    return;
  }
  std::vector<Step> steps;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    started.phase = Phase::kAgreed;
    PumpLocked(steps);
  }
  RunSteps(steps);
  activities_.Exit();  // the agreement's; the data phase counts on its own
}

}  // namespace collectived
