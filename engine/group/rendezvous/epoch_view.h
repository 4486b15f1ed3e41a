// EpochView: how a shrinking group's ranks map into its current membership epoch, and what an
// op issued against the group's fixed ranks becomes in that epoch (docs/fault-tolerance.md): its
// roots and peers renumbered among the live ranks, a SUM rescaled so that dividing by the group's
// size gives the mean over the live ranks, or PeerLost when the op needs a lost rank.
#pragma once

#include <string>
#include <vector>

#include "engine/group/core/group.h"
#include "engine/vocabulary/op.h"
#include "engine/vocabulary/status.h"

namespace collectived {

struct EpochView {
  std::string group;
  int epoch = 0;
  // By group rank (the group's fixed numbering): its rank in the epoch, -1 once lost.
  std::vector<int> epoch_rank;

  int group_size() const { return static_cast<int>(epoch_rank.size()); }
  int live() const;
  bool lost(int group_rank) const { return epoch_rank[group_rank] < 0; }
  // The group ranks lost so far, ascending.
  std::vector<int> Lost() const;
  // Every group rank live: the epoch changes nothing of an op.
  bool whole() const { return live() == group_size(); }
  // The group rank of rank `epoch_rank` of the epoch; -1 if none.
  int GroupRankOf(int epoch_rank) const;
};

// The view of the epoch that the Group of `spec` serves (its members among the group's).
EpochView EpochViewOf(const GroupSpec& spec);

// Rewrites `request`, which group rank `group_rank` issued against the group's ranks, for
// `view`'s epoch. PeerLost naming the lost ranks when the op cannot run without them: a root or
// peer that was lost, or a slot of every rank (gather, scatter, allgather, reduce-scatter,
// alltoall). A receive from any rank is refused after a loss (InvalidArgument): its source could
// only be named in the epoch's numbering. What each reduction does over the live ranks:
//   SUM on floating-point or complex tensors: PREMUL_SUM by group size / live ranks (DDP's
//     division by the group's size then gives the mean over the live ranks); on integers and
//     bool: the plain sum of the live ranks.
//   PREMUL_SUM: its factor times group size / live ranks.
//   AVG: the mean over the live ranks.
//   PRODUCT, MIN, MAX, BAND, BOR, BXOR: over the live ranks, unscaled.
Status TranslateForEpoch(OpRequest& request, int group_rank, const EpochView& view);

// Rewrites `request`, translated for epoch `from` (TranslateForEpoch) and taken back unfinished,
// for the next epoch `to`: ranks renumbered again, scale factors adjusted to `to`'s live ranks.
Status RetranslateForEpoch(OpRequest& request, int group_rank, const EpochView& from,
                           const EpochView& to);

}  // namespace collectived
