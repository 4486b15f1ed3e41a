#include "engine/group/group_records.h"

#include <charconv>
#include <cstdio>

#include "engine/stable_hash.h"

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
// `collectivectl describe --cluster` asks every sidecar of a group.
constexpr std::string_view kAnnouncementVersion = "cd5";
// No field of ours comes near this; a longer one means the record is not ours.
constexpr size_t kMaxFieldBytes = 1 << 20;

void AppendField(std::string& out, std::string_view field) {
  out += std::to_string(field.size());
  out += ':';
  out += field;
}

// Splits a record into its fields, checking the version and every length.
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
  if (fields.size() != expected) {
    return bad(std::to_string(fields.size()) + " fields, expected " + std::to_string(expected));
  }
  return fields;
}

StatusOr<int> ParseInt(const std::string& text, std::string_view what) {
  int value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) {
    return Status::InvalidArgument(std::string(what) + " is not a number: '" + text.substr(0, 32) +
                                   "'");
  }
  return value;
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
  return out;
}

StatusOr<RankAnnouncement> DecodeAnnouncement(const std::string& record) {
  StatusOr<std::vector<std::string>> fields =
      Fields(record, 6, "rank announcement", kAnnouncementVersion);
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
  return a;
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
  // Of the decimal list, so that it does not depend on how the machine lays out integers, with
  // a hash every build computes alike.
  std::string text;
  text.reserve(members.size() * 6);
  for (int member : members) {
    text += std::to_string(member);
    text += ',';
  }
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(Fnv1a64(text)));
  return std::to_string(members.size()) + ":" + hex;
}

}  // namespace collectived
