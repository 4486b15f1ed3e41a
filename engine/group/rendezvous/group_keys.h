// GroupKeys: every key a group uses in its rendezvous store, in one place.
//
//   <root> = [<store prefix>/]collectived/groups/<name>
//   <root>/token                     JobTokenCommitment of the token the group's first rank 0
//                                    created it with ("none": no token); every joiner is
//                                    checked against it before it takes part
//   <root>/incarnation/<group rank>  counter (Store::Add): how often that rank created the
//                                    group; the value names the incarnation it joins
//   <base> = <root>/<incarnation>    one creation of the group; re-creating a destroyed group
//                                    uses fresh keys
//   <base>/rank/<group rank>         RankAnnouncement (group_records.h) of that rank
//   <base>/arrived                   counter (Store::Add): the ranks that announced themselves;
//                                    the rank that brings it to the group size assembles the
//                                    membership
//   <base>/arrivals                  "<group rank>," appended by each rank as it arrives: read
//                                    only to name the ranks that never joined
//   <base>/membership                GroupMembership (group_records.h): where every rank is, or
//                                    why the group cannot form; the one key every rank waits on
//   <base>/gloo/...                  the transport's own rendezvous (TransportFactory), e.g.
//                                    gloo/pair/<node>/<peer>: the address of that node's Gloo
//                                    pair with that peer, written on the pair's first use
//                                    (GlooPairs)
//   <base>/failed                    FailureRecord: why the group failed, for the peers
//   <base>/rollcall-claim            counter (Store::Add): the sidecar that brings it to 1
//                                    calls the roll for the group (one roll call, however many
//                                    sidecars saw the break)
//   <base>/rollcall                  set by that sidecar asking the group's sidecars to answer
//   <base>/alive/<sidecar id>        a sidecar's answer to the roll call
//   <base>/rollcall-result           the ids of the sidecars that did not answer, one per line,
//                                    read by the sidecars that did not call the roll
//   <base>/moved/<g>/rollcall...     the roll-call keys above once a shrinking group's store
//                                    moved g times (MovableStore): a roll call split by a move
//                                    is called again, afresh
//   <base>/epoch/<e>/...             a shrinking group's epoch e > 0 (docs/fault-tolerance.md):
//                                    the keys above (membership, gloo/, failed, rollcall...)
//                                    of the Group among its live ranks, and
//   <epoch base>/losses              counter (Store::Add): the ranks lost in that epoch
//   <epoch base>/loss/<n>            ChangeRecord (group_records.h) of the n-th (from 1): a
//                                    loss, a replacement waiting, or its admission
//   <epoch base>/node/<i>            EpochNodeRecord of the previous epoch's i-th sidecar: its
//                                    live ranks, announced once it retired that epoch
//   <epoch base>/members             the epoch's global ranks (EncodeRankList)
//   <epoch base>/finished/<i>        after a sidecar loss, the last op whose data phase the
//                                    epoch's i-th sidecar finished (decimal): the epoch retires
//                                    at the lowest of the survivors'
//   (epoch 0's own losses are <base>/losses and <base>/loss/<n>)
//   <base>/lost/<group rank>         set once that rank was lost from a shrinking group: a
//                                    process that joins as that rank again (it would take the
//                                    next incarnation, which the live ranks never join) is
//                                    refused at once
//   <base>/joining/<group rank>      a replacement for that lost rank claims it: its placement
//                                    (EpochNodeRecord: sidecar, global rank); one at a time
//   <base>/current-epoch             the number of the last epoch published (decimal)
//   <base>/accepts-replacements      set once the job admits replacements at step boundaries
//                                    (collectived.torch.ft): a replacement is refused otherwise
//   <base>/left                      counter: the sidecars that left the group; the last one
//                                    deletes <base>/ (a destroyed group leaves only the root's
//                                    incarnation counters and token commitment behind)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace collectived {

class GroupKeys {
 public:
  // The keys of incarnation `incarnation` of group `name` under `store_prefix` ("" = none).
  GroupKeys(std::string_view store_prefix, std::string_view name, int64_t incarnation)
      : base_(Root(store_prefix, name) + "/" + std::to_string(incarnation)),
        incarnation_(incarnation) {}

  // The incarnation counter of `group_rank` (the only key outside an incarnation).
  static std::string IncarnationCounter(std::string_view store_prefix, std::string_view name,
                                        int group_rank) {
    return Root(store_prefix, name) + "/incarnation/" + std::to_string(group_rank);
  }

  // The job token commitment of every incarnation (outside them: a joiner is checked before it
  // takes an incarnation).
  static std::string TokenCommitment(std::string_view store_prefix, std::string_view name) {
    return Root(store_prefix, name) + "/token";
  }
  // What job tokens of the group are bound to (JobTokenCommitment's scope).
  static std::string TokenScope(std::string_view store_prefix, std::string_view name) {
    return Root(store_prefix, name);
  }

  // Whether `key` lies in some group's keys ("collectived/groups/" at its start or after a
  // '/'): the store serves those to sidecars only, so a client can neither read nor forge them.
  static bool IsGroupKey(std::string_view key) {
    constexpr std::string_view kMarker = "collectived/groups/";
    if (key.substr(0, kMarker.size()) == kMarker) return true;
    for (size_t at = key.find(kMarker); at != std::string_view::npos;
         at = key.find(kMarker, at + 1)) {
      if (at > 0 && key[at - 1] == '/') return true;
    }
    return false;
  }

  // Where the roll call is called once the group's store moved `store_generation` times (these
  // keys themselves for 0).
  GroupKeys RollCallRound(int store_generation) const {
    if (store_generation == 0) return *this;
    return GroupKeys(base_ + "/moved/" + std::to_string(store_generation), incarnation_);
  }

  // The keys of epoch `epoch` (> 0) of a shrinking group, inside this incarnation's.
  GroupKeys Epoch(int epoch) const {
    return GroupKeys(base_ + "/epoch/" + std::to_string(epoch), incarnation_);
  }

  const std::string& base() const { return base_; }
  // The incarnation these keys belong to (the value its ranks' counters reached).
  int64_t incarnation() const { return incarnation_; }
  std::string Losses() const { return base_ + "/losses"; }
  std::string Loss(int64_t n) const { return base_ + "/loss/" + std::to_string(n); }
  std::string EpochNode(int node) const { return base_ + "/node/" + std::to_string(node); }
  std::string EpochMembers() const { return base_ + "/members"; }
  std::string Finished(int node) const { return base_ + "/finished/" + std::to_string(node); }
  std::string LostRank(int group_rank) const {
    return base_ + "/lost/" + std::to_string(group_rank);
  }
  std::string Joining(int group_rank) const {
    return base_ + "/joining/" + std::to_string(group_rank);
  }
  std::string CurrentEpoch() const { return base_ + "/current-epoch"; }
  std::string AcceptsReplacements() const { return base_ + "/accepts-replacements"; }
  std::string Rank(int group_rank) const { return base_ + "/rank/" + std::to_string(group_rank); }
  std::vector<std::string> Ranks(int group_size) const {
    std::vector<std::string> keys;
    for (int r = 0; r < group_size; ++r) keys.push_back(Rank(r));
    return keys;
  }
  std::string Arrived() const { return base_ + "/arrived"; }
  std::string Arrivals() const { return base_ + "/arrivals"; }
  std::string Membership() const { return base_ + "/membership"; }
  std::string TransportPrefix() const { return base_ + "/gloo"; }
  std::string Failed() const { return base_ + "/failed"; }
  std::string RollCall() const { return base_ + "/rollcall"; }
  std::string RollCallClaim() const { return base_ + "/rollcall-claim"; }
  std::string RollCallResult() const { return base_ + "/rollcall-result"; }
  std::string Alive(std::string_view sidecar_id) const {
    return base_ + "/alive/" + std::string(sidecar_id);
  }

 private:
  GroupKeys(std::string base, int64_t incarnation)
      : base_(std::move(base)), incarnation_(incarnation) {}

  static std::string Root(std::string_view store_prefix, std::string_view name) {
    // Must stay inside what IsGroupKey recognises.
    return (store_prefix.empty() ? "" : std::string(store_prefix) + "/") + "collectived/groups/" +
           std::string(name);
  }

  const std::string base_;
  const int64_t incarnation_;
};

}  // namespace collectived
