#include "engine/group/rendezvous/epoch_view.h"

#include <algorithm>

#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/op_traits.h"

namespace collectived {
namespace {

// Whether one side of an op has a slot per group rank.
bool HasRankSlots(TensorLayout layout) {
  switch (layout) {
    case TensorLayout::kNone:
    case TensorLayout::kOne:
    case TensorLayout::kList:
      return false;
    case TensorLayout::kOnePerRank:
    case TensorLayout::kOnePerRankOnRoot:
    case TensorLayout::kOneOfGroupSize:
    case TensorLayout::kOneSplit:
    case TensorLayout::kListTimesGroupSize:
      return true;
  }
  return true;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string text;
  for (int rank : ranks) text += (text.empty() ? "" : ", ") + std::to_string(rank);
  return text;
}

}  // namespace

int EpochView::live() const {
  return static_cast<int>(
      std::count_if(epoch_rank.begin(), epoch_rank.end(), [](int rank) { return rank >= 0; }));
}

std::vector<int> EpochView::Lost() const {
  std::vector<int> lost_ranks;
  for (int rank = 0; rank < group_size(); ++rank) {
    if (lost(rank)) lost_ranks.push_back(rank);
  }
  return lost_ranks;
}

EpochView EpochViewOf(const GroupSpec& spec) {
  EpochView view{spec.name, spec.epoch, std::vector<int>(spec.GroupSize(), -1)};
  for (int rank = 0; rank < static_cast<int>(spec.members.size()); ++rank) {
    view.epoch_rank[spec.GroupRankOf(rank)] = rank;
  }
  return view;
}

int EpochView::GroupRankOf(int rank_in_epoch) const {
  for (int rank = 0; rank < group_size(); ++rank) {
    if (epoch_rank[rank] == rank_in_epoch) return rank;
  }
  return -1;
}

Status TranslateForEpoch(OpRequest& request, int group_rank, const EpochView& view) {
  if (view.whole()) return Status::Ok();
  const OpTraits& traits = TraitsOf(request.kind);
  const std::string what = std::string(traits.name) + " of group rank " +
                           std::to_string(group_rank) + " on group '" + view.group + "' (epoch " +
                           std::to_string(view.epoch) + ")";
  auto out_of_range = [&](int rank) { return rank < 0 || rank >= view.group_size(); };
  if (traits.point_to_point) {
    if (request.peer == kAnySource) {
      return Status::InvalidArgument(
          what + ": a receive from any rank is not served once the group lost ranks " +
          RankList(view.Lost()) + "; name the source");
    }
    if (out_of_range(request.peer)) return Status::Ok();  // the group's validation says why
    if (view.lost(request.peer)) {
      return Status::PeerLost(what + ": its peer, group rank " + std::to_string(request.peer) +
                              ", was lost");
    }
    request.peer = view.epoch_rank[request.peer];
    return Status::Ok();
  }
  if (HasRankSlots(traits.inputs) || HasRankSlots(traits.outputs)) {
    return Status::PeerLost(what + ": it has a slot of every rank, and group ranks " +
                            RankList(view.Lost()) + " were lost");
  }
  if (traits.rooted && !out_of_range(request.root)) {
    if (view.lost(request.root)) {
      return Status::PeerLost(what + ": its root, group rank " + std::to_string(request.root) +
                              ", was lost");
    }
    request.root = view.epoch_rank[request.root];
  }
  if (traits.reduces) {
    const double rescale = static_cast<double>(view.group_size()) / view.live();
    const std::vector<TensorView>& tensors =
        request.inputs.empty() ? request.outputs : request.inputs;
    const bool scalable =
        !tensors.empty() && (IsFloatingPoint(tensors[0].dtype) || IsComplex(tensors[0].dtype));
    if (request.reduce_op.kind == ReduceOpKind::kSum && scalable) {
      request.reduce_op = ReduceOp::PremulSum(rescale);
    } else if (request.reduce_op.kind == ReduceOpKind::kPremulSum) {
      request.reduce_op.scale *= rescale;
    }
  }
  return Status::Ok();
}

Status RetranslateForEpoch(OpRequest& request, int group_rank, const EpochView& from,
                           const EpochView& to) {
  if (from.whole()) return TranslateForEpoch(request, group_rank, to);
  // Back to the group's numbering, then forward: what was translated for `from` had every rank
  // of the group live but those `from` lost, so only the renumbering and the factor change.
  const OpTraits& traits = TraitsOf(request.kind);
  if (traits.point_to_point) {
    request.peer = from.GroupRankOf(request.peer);
  } else if (traits.rooted) {
    request.root = from.GroupRankOf(request.root);
  }
  const ReduceOp reduce_op = request.reduce_op;
  Status translated = TranslateForEpoch(request, group_rank, to);
  if (!translated.ok()) return translated;
  if (traits.reduces && reduce_op.kind == ReduceOpKind::kPremulSum) {
    request.reduce_op = reduce_op;
    request.reduce_op.scale *= static_cast<double>(from.live()) / to.live();
  }
  return Status::Ok();
}

}  // namespace collectived
