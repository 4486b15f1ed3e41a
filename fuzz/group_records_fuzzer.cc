// Fuzz target: the records a group's sidecars read from the rendezvous store (written by a peer,
// or by anything else that can write to the store). The first byte picks the check:
//   even: the rest is a record; DecodeAnnouncement, DecodeFailure and DecodeMembership must
//         refuse it cleanly or return values that encode and decode back to themselves;
//   odd:  the rest builds an announcement, a failure and a membership (any bytes in their text
//         fields), which must survive Encode -> Decode unchanged.
#include <cstdint>
#include <string>
#include <vector>

#include "engine/group/rendezvous/group_records.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"

namespace collectived::fuzz {
namespace {

bool Same(const RankAnnouncement& a, const RankAnnouncement& b) {
  return a.sidecar_id == b.sidecar_id && a.SameGroupAs(b);
}

void CheckAnnouncementRoundTrip(const RankAnnouncement& a) {
  StatusOr<RankAnnouncement> again = DecodeAnnouncement(EncodeAnnouncement(a));
  FUZZ_CHECK(again.ok(), "an encoded announcement does not decode: %s",
             again.status().ToString().c_str());
  FUZZ_CHECK(Same(a, *again), "an announcement changed through Encode -> Decode");
}

void CheckFailureRoundTrip(const Status& failure, uint64_t completed_through = 0) {
  FailureRecord again = DecodeFailureRecord(EncodeFailure(failure, completed_through));
  FUZZ_CHECK(!again.reason.ok(), "a failure decoded as OK");
  FUZZ_CHECK(again.reason.kind() == failure.kind() && again.reason.message() == failure.message(),
             "a failure changed through Encode -> Decode: %s became %s", failure.ToString().c_str(),
             again.reason.ToString().c_str());
  FUZZ_CHECK(again.completed_through == completed_through,
             "a failure's completed sequence number changed through Encode -> Decode");
}

void CheckMembershipRoundTrip(const GroupMembership& m) {
  StatusOr<GroupMembership> again = DecodeMembership(EncodeMembership(m));
  FUZZ_CHECK(again.ok(), "an encoded membership does not decode: %s",
             again.status().ToString().c_str());
  FUZZ_CHECK(again->refusal.kind() == m.refusal.kind() &&
                 again->refusal.message() == m.refusal.message() &&
                 again->sidecar_ids == m.sidecar_ids &&
                 again->admin_addresses == m.admin_addresses &&
                 again->sidecar_of_rank == m.sidecar_of_rank,
             "a membership changed through Encode -> Decode");
}

void DecodeArbitrary(const std::string& record) {
  StatusOr<GroupMembership> membership = DecodeMembership(record);
  if (membership.ok()) {
    // Every index names a listed sidecar; a refusal carries no placement.
    for (int index : membership->sidecar_of_rank) {
      FUZZ_CHECK(index >= 0 && index < static_cast<int>(membership->sidecar_ids.size()),
                 "a decoded membership points outside its sidecars");
    }
    CheckMembershipRoundTrip(*membership);
  } else {
    FUZZ_CHECK(membership.status().IsInvalidArgument(), "membership refused with %s",
               membership.status().ToString().c_str());
  }
  StatusOr<RankAnnouncement> announcement = DecodeAnnouncement(record);
  if (announcement.ok()) {
    CheckAnnouncementRoundTrip(*announcement);
  } else {
    FUZZ_CHECK(announcement.status().IsInvalidArgument(), "announcement refused with %s",
               announcement.status().ToString().c_str());
  }
  // A failure record always decodes to a failure: what the peer said, or PeerLost.
  Status failure = DecodeFailure(record);
  FUZZ_CHECK(!failure.ok(), "a failure record decoded as OK");
  FUZZ_CHECK(failure.kind() >= ErrorKind::kInvalidArgument && failure.kind() <= kLastErrorKind,
             "unknown error kind %d", static_cast<int>(failure.kind()));
  CheckFailureRoundTrip(failure);
}

void EncodeArbitrary(FuzzInput& in) {
  RankAnnouncement a;
  a.sidecar_id = in.String(300);
  a.world_size = static_cast<int>(in.U32());
  std::vector<int> members(in.U8() % 16);
  for (int& member : members) member = static_cast<int>(in.U32());
  a.members_digest = MembersDigest(members);
  a.token_digest = in.String(300);
  CheckAnnouncementRoundTrip(a);

  GroupMembership m;
  const int sidecars = 1 + in.U8() % 8;
  for (int i = 0; i < sidecars; ++i) {
    m.sidecar_ids.push_back(in.String(100));
    m.admin_addresses.push_back(in.String(100));
  }
  for (int r = 0, ranks = 1 + in.U8() % 32; r < ranks; ++r) {
    m.sidecar_of_rank.push_back(in.U8() % sidecars);
  }
  CheckMembershipRoundTrip(m);

  const auto kind = static_cast<ErrorKind>(1 + in.U8() % static_cast<int>(kLastErrorKind));
  const uint64_t completed_through = (uint64_t{in.U32()} << 32) | in.U32();
  CheckMembershipRoundTrip(GroupMembership{Status(kind, in.String(300)), {}, {}, {}});
  CheckFailureRoundTrip(Status(kind, in.Rest()), completed_through);
}

}  // namespace
}  // namespace collectived::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  collectived::fuzz::FuzzInput in(data, size);
  if (in.U8() % 2 == 0) {
    collectived::fuzz::DecodeArbitrary(in.Rest());
  } else {
    collectived::fuzz::EncodeArbitrary(in);
  }
  return 0;
}
