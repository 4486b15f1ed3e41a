// The records a group's sidecars leave for each other in the rendezvous store (keys in
// group_keys.h), in one documented fixed format:
//
//   record  = "cd1" field*          (the version tag, then the record's fields in order)
//   field   = <decimal length> ":" <length bytes>
//
// so any byte may appear in a field and a reader never searches for a separator. Decoding checks
// the version, every length, the number of fields and each field's syntax, and returns
// InvalidArgument naming what was wrong: a record written by something else is refused, never
// half-read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/vocabulary/status.h"

namespace collectived {

// What every rank announces when it joins: the sidecar that hosts it, and what it believes the
// group is, so that ranks that disagree about the members or the job token are caught at
// creation. The members are announced as a digest: every sidecar reads every rank's
// announcement, so a list of the members in each would make a group of R ranks cost each
// sidecar O(R^2) bytes to read and parse.
struct RankAnnouncement {
  std::string sidecar_id;
  int world_size = 0;
  std::string members_digest;  // MembersDigest of the sorted global ranks
  std::string token_digest;    // JobTokenCommitment (job_token.h), never the token itself
  std::string device;          // where the rank's tensors live: "cpu" or "cuda:<ordinal>"
  std::string admin_address;   // the sidecar's gRPC listener (host:port); "" when it has none
  std::string fault_tolerance = "fail-fast";  // FaultTolerance::Encode of what the rank asked

  // Same members, world size and token (the sidecar may differ).
  bool SameGroupAs(const RankAnnouncement& other) const {
    return world_size == other.world_size && members_digest == other.members_digest &&
           token_digest == other.token_digest;
  }
};

std::string EncodeAnnouncement(const RankAnnouncement& announcement);
StatusOr<RankAnnouncement> DecodeAnnouncement(const std::string& record);

// A list of ranks as "3,1,4,": each followed by ','. The arrivals list (one entry appended per
// rank) and a membership's placement use it. Decoding refuses (InvalidArgument) anything else.
std::string EncodeRankList(const std::vector<int>& ranks);
StatusOr<std::vector<int>> DecodeRankList(std::string_view text);

// What the sidecar of the last rank to join publishes once for every other one to read: where
// every rank of the group is, or why the group cannot form. So each sidecar reads one record
// instead of every rank's announcement, and no rank waits on R keys.
struct GroupMembership {
  Status refusal;  // OK, or why the group cannot form (every rank fails with it)
  std::vector<std::string> sidecar_ids;      // each sidecar once, in order of its first rank
  std::vector<std::string> admin_addresses;  // of each sidecar, as it announced it
  std::vector<int> sidecar_of_rank;          // group rank -> index in sidecar_ids
};

// The membership of the group whose ranks announced `announcements` (group rank order): the
// sidecar of each rank, or the first disagreement found (members, world size, job token or
// device; InvalidArgument naming the group ranks), checked against group rank 0.
GroupMembership AssembleMembership(const std::string& group,
                                   const std::vector<std::string>& announcements);
std::string EncodeMembership(const GroupMembership& membership);
// InvalidArgument naming what was wrong when the record is not one, or is inconsistent (an index
// out of range, no ranks).
StatusOr<GroupMembership> DecodeMembership(const std::string& record);

// Why a group failed (the error kind and message every rank reports) and the last sequence
// number the sidecar that published it had completed (0: none or unknown). Peers let their op
// up to that number finish: the publisher already did its part of it.
struct FailureRecord {
  Status reason;
  uint64_t completed_through = 0;
};

std::string EncodeFailure(const Status& failure, uint64_t completed_through = 0);
// A record that cannot be read becomes PeerLost("a peer reported a failure that cannot be
// read: ..."): the group failed either way.
FailureRecord DecodeFailureRecord(const std::string& record);
Status DecodeFailure(const std::string& record);  // DecodeFailureRecord(record).reason

// The members digest used in announcements, of sorted global ranks: "<count>:<16 hex digits>",
// the hex FNV-1a 64 (engine/vocabulary/stable_hash.h) of the ranks in decimal, each followed by
// ','. Every build computes the same digest (sidecars of different builds compare them).
std::string MembersDigest(const std::vector<int>& members);

// A change of a shrinking group's epoch (docs/fault-tolerance.md), one entry of the epoch's list:
//   kLost      group rank `group_rank` was lost after its op `cut` (the epoch's cut, at most),
//              for `cause`;
//   kJoining   a replacement for lost group rank `group_rank` waits to join (its placement is
//              under GroupKeys::Joining); nothing retires;
//   kAdmitted  the live ranks admit the replacements for group ranks `joiners` after op `cut`,
//              a step boundary they agreed on.
struct ChangeRecord {
  // kSidecarsLost: peer sidecars of the epoch were lost; the survivors freeze it and agree on
  // its cut (group_epochs.cc).
  enum class Kind { kLost, kJoining, kAdmitted, kSidecarsLost };
  Kind kind = Kind::kLost;
  int group_rank = -1;  // kLost, kJoining
  uint64_t cut = 0;     // kLost, kAdmitted
  std::string cause;
  // kAdmitted: the group ranks admitted; kSidecarsLost: the lost sidecars' node indices in the
  // epoch. Ascending.
  std::vector<int> joiners;
};
std::string EncodeChangeRecord(const ChangeRecord& record);
StatusOr<ChangeRecord> DecodeChangeRecord(const std::string& record);

// After a sidecar loss, the last op whose data phase a survivor finished (GroupKeys::Finished):
// a decimal sequence number.
StatusOr<uint64_t> DecodeFinishedPoint(const std::string& record);

// A sidecar's part in a shrinking group's next epoch, written once it retired the previous one
// at `cut`: the global ranks it still hosts (none when it leaves the group), and the group ranks
// it saw admitted after op `admitted_after` (kAdmitted; 0 and none when no replacement was).
// A replacement's placement (GroupKeys::Joining) is one too: its sidecar and its global rank.
struct EpochNodeRecord {
  std::string sidecar_id;
  std::string admin_address;
  std::vector<int> live_ranks;
  uint64_t cut = 0;
  std::vector<int> joiners;
  uint64_t admitted_after = 0;
};
std::string EncodeEpochNodeRecord(const EpochNodeRecord& record);
StatusOr<EpochNodeRecord> DecodeEpochNodeRecord(const std::string& record);

}  // namespace collectived
