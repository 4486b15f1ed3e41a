#include "engine/group/rendezvous/group_records.h"

#include <charconv>
#include <cstdio>
#include <map>

#include "engine/vocabulary/stable_hash.h"

namespace collectived {
namespace {

constexpr std::string_view kVersion = "cd1";
// Failure records name the publisher's last completed sequence number since version 3 (a
// version 1 record, without it, is still read).
constexpr std::string_view kFailureVersion = "cd3";
// Rank announcements carry a digest of the members since version 2 (version 1 listed them);
// since version 4 the digest is FNV-1a 64 (until then std::hash, which differs between standard
// libraries, so sidecars of different builds refused each other). A sidecar refuses another
// version's announcements as of an unknown version, never as members that disagree.
// Since version 5 they also carry the address of the sidecar's gRPC listener, through which
// `collectivectl describe --cluster` asks every sidecar of a group. Since version 6 they carry
// the group's fault tolerance (FaultTolerance::Encode), on which every rank must agree.
constexpr std::string_view kAnnouncementVersion = "cd6";
// The membership a group's assembling sidecar publishes (GroupMembership).
constexpr std::string_view kMembershipVersion = "cm1";
// A shrinking group's records (docs/fault-tolerance.md).
// Since version 2 the list of an epoch's changes holds joins and admissions besides losses, and
// a sidecar's part names the replacements it saw admitted.
constexpr std::string_view kChangeVersion = "cl2";
constexpr std::string_view kEpochNodeVersion = "ce2";
// No field of ours comes near this; a longer one means the record is not ours.
constexpr size_t kMaxFieldBytes = 1 << 20;

void AppendField(std::string& out, std::string_view field) {
  out += std::to_string(field.size());
  out += ':';
  out += field;
}

constexpr size_t kAnyCount = static_cast<size_t>(-1);

// Splits a record into its fields, checking the version, every length and (unless kAnyCount)
// their number.
StatusOr<std::vector<std::string>> Fields(const std::string& record, size_t expected,
                                          std::string_view what,
                                          std::string_view version = kVersion) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument(std::string(what) + " record is malformed: " + why);
  };
  if (record.compare(0, version.size(), version) != 0) return bad("unknown version");
  std::vector<std::string> fields;
  size_t at = version.size();
  while (at < record.size()) {
    size_t colon = record.find(':', at);
    if (colon == std::string::npos || colon == at || colon - at > 7) return bad("bad length");
    size_t length = 0;
    auto [end, error] = std::from_chars(record.data() + at, record.data() + colon, length);
    if (error != std::errc() || end != record.data() + colon) return bad("bad length");
    if (length > kMaxFieldBytes || length > record.size() - colon - 1) return bad("truncated");
    fields.push_back(record.substr(colon + 1, length));
    at = colon + 1 + length;
  }
  if (expected != kAnyCount && fields.size() != expected) {
    return bad(std::to_string(fields.size()) + " fields, expected " + std::to_string(expected));
  }
  return fields;
}

template <typename Number>
StatusOr<Number> ParseNumber(const std::string& text, std::string_view what) {
  Number value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    std::string message(what);
    message.append(" is not a number: '").append(text.substr(0, 32)).append("'");
    return Status::InvalidArgument(message);
  }
  return value;
}

StatusOr<int> ParseInt(const std::string& text, std::string_view what) {
  return ParseNumber<int>(text, what);
}

StatusOr<uint64_t> ParseUnsigned(const std::string& text, std::string_view what) {
  return ParseNumber<uint64_t>(text, what);
}

}  // namespace

std::string EncodeAnnouncement(const RankAnnouncement& a) {
  std::string out(kAnnouncementVersion);
  AppendField(out, a.sidecar_id);
  AppendField(out, std::to_string(a.world_size));
  AppendField(out, a.members_digest);
  AppendField(out, a.token_digest);
  AppendField(out, a.device);
  AppendField(out, a.admin_address);
  AppendField(out, a.fault_tolerance);
  return out;
}

StatusOr<RankAnnouncement> DecodeAnnouncement(const std::string& record) {
  StatusOr<std::vector<std::string>> fields =
      Fields(record, 7, "rank announcement", kAnnouncementVersion);
  if (!fields.ok()) return fields.status();
  RankAnnouncement a;
  a.sidecar_id = std::move((*fields)[0]);
  StatusOr<int> world_size = ParseInt((*fields)[1], "world size");
  if (!world_size.ok()) return world_size.status();
  a.world_size = *world_size;
  a.members_digest = std::move((*fields)[2]);
  a.token_digest = std::move((*fields)[3]);
  a.device = std::move((*fields)[4]);
  a.admin_address = std::move((*fields)[5]);
  a.fault_tolerance = std::move((*fields)[6]);
  return a;
}

std::string EncodeRankList(const std::vector<int>& ranks) {
  std::string text;
  text.reserve(ranks.size() * 4);
  for (int rank : ranks) {
    text += std::to_string(rank);
    text += ',';
  }
  return text;
}

StatusOr<std::vector<int>> DecodeRankList(std::string_view text) {
  std::vector<int> ranks;
  for (size_t at = 0; at < text.size();) {
    const size_t comma = text.find(',', at);
    if (comma == std::string_view::npos) {
      return Status::InvalidArgument("rank list does not end with ','");
    }
    StatusOr<int> rank = ParseInt(std::string(text.substr(at, comma - at)), "rank");
    if (!rank.ok()) return rank.status();
    ranks.push_back(*rank);
    at = comma + 1;
  }
  return ranks;
}

GroupMembership AssembleMembership(const std::string& group,
                                   const std::vector<std::string>& announcements) {
  GroupMembership membership;
  auto refuse = [&](Status why) {
    membership = GroupMembership{};
    membership.refusal = std::move(why);
    return membership;
  };
  if (announcements.empty()) {
    return refuse(Status::InvalidArgument("group '" + group + "': no rank announced itself"));
  }
  std::vector<RankAnnouncement> decoded;
  decoded.reserve(announcements.size());
  for (size_t r = 0; r < announcements.size(); ++r) {
    StatusOr<RankAnnouncement> theirs = DecodeAnnouncement(announcements[r]);
    if (!theirs.ok()) {
      return refuse(
          theirs.status().WithContext("group '" + group + "': group rank " + std::to_string(r)));
    }
    decoded.push_back(std::move(*theirs));
  }
  const RankAnnouncement& first = decoded[0];
  std::map<std::string, int> index_of_sidecar;
  std::vector<std::string> device_of_sidecar;
  for (size_t r = 0; r < decoded.size(); ++r) {
    const RankAnnouncement& theirs = decoded[r];
    const std::string who = "group '" + group + "': group rank " + std::to_string(r);
    if (!theirs.SameGroupAs(first)) {
      return refuse(Status::InvalidArgument(who + " " +
                                            (theirs.token_digest != first.token_digest
                                                 ? "presented a different job token"
                                                 : "named different members or world size") +
                                            " than group rank 0"));
    }
    if (theirs.fault_tolerance != first.fault_tolerance) {
      return refuse(Status::InvalidArgument(who + " asked for fault tolerance '" +
                                            theirs.fault_tolerance + "' and group rank 0 for '" +
                                            first.fault_tolerance +
                                            "': every rank must ask for the same"));
    }
    auto [it, added] = index_of_sidecar.emplace(theirs.sidecar_id,
                                                static_cast<int>(membership.sidecar_ids.size()));
    if (added) {
      membership.sidecar_ids.push_back(theirs.sidecar_id);
      membership.admin_addresses.push_back(theirs.admin_address);
      device_of_sidecar.push_back(theirs.device);
    }
    // One device kind per group; on a sidecar, its ranks share one GPU (one NCCL rank each).
    const bool same_kind = theirs.device.substr(0, 3) == first.device.substr(0, 3);
    const std::string& sidecar_device = device_of_sidecar[it->second];
    if (!same_kind || theirs.device != sidecar_device) {
      const bool vs_first = !same_kind;
      return refuse(Status::InvalidArgument(
          who + " has its tensors on " + theirs.device + " and " +
          (vs_first ? "group rank 0 on " + first.device
                    : "another rank of its sidecar on " + sidecar_device) +
          (vs_first ? ": a group's tensors must all live on one kind of device"
                    : ": the ranks of a group on one sidecar must share one GPU (on a node "
                      "with several GPUs run one sidecar per GPU, each trainer using its GPU's: "
                      "COLLECTIVED_ADDRESS=unix:///run/collectived/gpu{local_rank}.sock)")));
    }
    membership.sidecar_of_rank.push_back(it->second);
  }
  return membership;
}

std::string EncodeMembership(const GroupMembership& m) {
  std::string out(kMembershipVersion);
  AppendField(out, std::to_string(static_cast<int>(m.refusal.kind())));
  AppendField(out, m.refusal.message());
  AppendField(out, std::to_string(m.sidecar_ids.size()));
  for (size_t i = 0; i < m.sidecar_ids.size(); ++i) {
    AppendField(out, m.sidecar_ids[i]);
    AppendField(out, i < m.admin_addresses.size() ? m.admin_addresses[i] : std::string());
  }
  AppendField(out, EncodeRankList(m.sidecar_of_rank));
  return out;
}

StatusOr<GroupMembership> DecodeMembership(const std::string& record) {
  StatusOr<std::vector<std::string>> fields =
      Fields(record, kAnyCount, "group membership", kMembershipVersion);
  if (!fields.ok()) return fields.status();
  auto bad = [](const std::string& why) {
    return Status::InvalidArgument("group membership record is malformed: " + why);
  };
  if (fields->size() < 4) return bad("too few fields");
  StatusOr<int> kind = ParseInt((*fields)[0], "error kind");
  if (!kind.ok()) return kind.status();
  StatusOr<int> sidecars = ParseInt((*fields)[2], "sidecar count");
  if (!sidecars.ok()) return sidecars.status();
  if (*sidecars < 0 || fields->size() != 4 + 2 * static_cast<size_t>(*sidecars)) {
    return bad(std::to_string(fields->size()) + " fields for " + std::to_string(*sidecars) +
               " sidecars");
  }
  GroupMembership m;
  if (*kind != 0) {
    // A kind this build does not know still refuses the group.
    const bool known = *kind > 0 && *kind <= static_cast<int>(kLastErrorKind);
    m.refusal =
        Status(known ? static_cast<ErrorKind>(*kind) : ErrorKind::kInvalidArgument, (*fields)[1]);
    return m;
  }
  for (int i = 0; i < *sidecars; ++i) {
    m.sidecar_ids.push_back(std::move((*fields)[3 + 2 * i]));
    m.admin_addresses.push_back(std::move((*fields)[4 + 2 * i]));
  }
  StatusOr<std::vector<int>> placement = DecodeRankList(fields->back());
  if (!placement.ok()) return bad(placement.status().message());
  for (int index : *placement) {
    if (index < 0 || index >= *sidecars) {
      return bad("sidecar index " + std::to_string(index) + " of " + std::to_string(*sidecars));
    }
  }
  if (placement->empty()) return bad("no ranks");
  m.sidecar_of_rank = std::move(*placement);
  return m;
}

std::string EncodeFailure(const Status& failure, uint64_t completed_through) {
  std::string out(kFailureVersion);
  AppendField(out, std::to_string(static_cast<int>(failure.kind())));
  AppendField(out, failure.message());
  AppendField(out, std::to_string(completed_through));
  return out;
}

FailureRecord DecodeFailureRecord(const std::string& record) {
  const bool versioned = record.compare(0, kFailureVersion.size(), kFailureVersion) == 0;
  StatusOr<std::vector<std::string>> fields =
      versioned ? Fields(record, 3, "failure", kFailureVersion) : Fields(record, 2, "failure");
  if (!fields.ok()) {
    return {Status::PeerLost("a peer reported a failure that cannot be read: " +
                             fields.status().message()),
            0};
  }
  StatusOr<int> kind = ParseInt((*fields)[0], "error kind");
  int value = kind.ok() ? *kind : 0;
  // A kind this build does not know (or OK) still means the group failed: report a lost peer.
  if (value <= 0 || value > static_cast<int>(kLastErrorKind)) {
    value = static_cast<int>(ErrorKind::kPeerLost);
  }
  uint64_t completed_through = 0;
  if (versioned) {
    const std::string& text = (*fields)[2];
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), completed_through);
    if (error != std::errc() || end != text.data() + text.size()) completed_through = 0;
  }
  return {Status(static_cast<ErrorKind>(value), (*fields)[1]), completed_through};
}

Status DecodeFailure(const std::string& record) {
  return DecodeFailureRecord(record).reason;
}

std::string MembersDigest(const std::vector<int>& members) {
  // Of the decimal list ("0,1,2,"), so that it does not depend on how the machine lays out
  // integers, with a hash every build computes alike; fed number by number (every rank of a
  // large group computes it).
  uint64_t hash = kFnv1a64Offset;
  for (int member : members) {
    char digits[16];
    const auto written = std::to_chars(digits, digits + sizeof(digits) - 1, member);
    *written.ptr = ',';
    hash = Fnv1a64Extend(hash, std::string_view(digits, written.ptr - digits + 1));
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
  return std::to_string(members.size()) + ":" + hex;
}

StatusOr<uint64_t> DecodeFinishedPoint(const std::string& record) {
  return ParseUnsigned(record, "a survivor's finished point");
}

std::string EncodeChangeRecord(const ChangeRecord& record) {
  std::string out(kChangeVersion);
  AppendField(out, std::to_string(static_cast<int>(record.kind)));
  AppendField(out, std::to_string(record.group_rank));
  AppendField(out, std::to_string(record.cut));
  AppendField(out, record.cause);
  AppendField(out, EncodeRankList(record.joiners));
  return out;
}

StatusOr<ChangeRecord> DecodeChangeRecord(const std::string& record) {
  StatusOr<std::vector<std::string>> fields = Fields(record, 5, "epoch change", kChangeVersion);
  if (!fields.ok()) return fields.status();
  ChangeRecord change;
  StatusOr<int> kind = ParseInt((*fields)[0], "change kind");
  if (!kind.ok()) return kind.status();
  if (*kind < 0 || *kind > static_cast<int>(ChangeRecord::Kind::kSidecarsLost)) {
    return Status::InvalidArgument("epoch change record is malformed: unknown kind " +
                                   std::to_string(*kind));
  }
  change.kind = static_cast<ChangeRecord::Kind>(*kind);
  StatusOr<int> rank = ParseInt((*fields)[1], "group rank");
  if (!rank.ok()) return rank.status();
  StatusOr<uint64_t> cut = ParseUnsigned((*fields)[2], "cut");
  if (!cut.ok()) return cut.status();
  StatusOr<std::vector<int>> joiners = DecodeRankList((*fields)[4]);
  if (!joiners.ok()) return joiners.status();
  change.group_rank = *rank;
  change.cut = *cut;
  change.cause = std::move((*fields)[3]);
  change.joiners = std::move(*joiners);
  return change;
}

std::string EncodeEpochNodeRecord(const EpochNodeRecord& record) {
  std::string out(kEpochNodeVersion);
  AppendField(out, record.sidecar_id);
  AppendField(out, record.admin_address);
  AppendField(out, EncodeRankList(record.live_ranks));
  AppendField(out, std::to_string(record.cut));
  AppendField(out, EncodeRankList(record.joiners));
  AppendField(out, std::to_string(record.admitted_after));
  return out;
}

StatusOr<EpochNodeRecord> DecodeEpochNodeRecord(const std::string& record) {
  StatusOr<std::vector<std::string>> fields = Fields(record, 6, "epoch node", kEpochNodeVersion);
  if (!fields.ok()) return fields.status();
  EpochNodeRecord node;
  node.sidecar_id = std::move((*fields)[0]);
  node.admin_address = std::move((*fields)[1]);
  StatusOr<std::vector<int>> ranks = DecodeRankList((*fields)[2]);
  if (!ranks.ok()) return ranks.status();
  node.live_ranks = std::move(*ranks);
  StatusOr<uint64_t> cut = ParseUnsigned((*fields)[3], "cut");
  if (!cut.ok()) return cut.status();
  node.cut = *cut;
  StatusOr<std::vector<int>> joiners = DecodeRankList((*fields)[4]);
  if (!joiners.ok()) return joiners.status();
  node.joiners = std::move(*joiners);
  StatusOr<uint64_t> admitted_after = ParseUnsigned((*fields)[5], "admitted after");
  if (!admitted_after.ok()) return admitted_after.status();
  node.admitted_after = *admitted_after;
  return node;
}

}  // namespace collectived
