// GroupRegistry: a shrinking group grows back (docs/fault-tolerance.md). A process that joins as
// a lost rank claims it, appends a kJoining change to the current epoch's list and waits; the
// live ranks learn of it (Replacements), agree on a step boundary and admit it there (Admit: a
// kAdmitted change that cuts the epoch), and the next epoch, formed as a loss's is
// (group_epochs.cc), takes it in where it claimed its rank.
#include <algorithm>
#include <atomic>
#include <chrono>

#include "engine/group/rendezvous/group_records.h"
#include "engine/group/rendezvous/group_registry.h"
#include "engine/group/rendezvous/group_registry_internal.h"
#include "engine/store/cancellable_wait.h"
#include "engine/vocabulary/logging.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

milliseconds Left(steady_clock::time_point deadline) {
  return std::max(milliseconds(0),
                  std::chrono::duration_cast<milliseconds>(deadline - steady_clock::now()));
}

// Tells one claim of a rank from another, also two on the same sidecar.
uint64_t ClaimNonce() {
  static std::atomic<uint64_t> next{1};
  return (static_cast<uint64_t>(steady_clock::now().time_since_epoch().count()) << 16) ^
         next.fetch_add(1);
}

StatusOr<int> ReadEpochNumber(Store& store, const GroupKeys& running, milliseconds budget) {
  StatusOr<std::string> text = store.Get(running.CurrentEpoch(), budget);
  if (!text.ok()) return text.status();
  char* end = nullptr;
  const long epoch = std::strtol(text->c_str(), &end, 10);
  if (end == text->c_str() || *end != '\0' || epoch < 1 || epoch > (1 << 30)) {
    return Status::InvalidArgument("the current epoch record is malformed");
  }
  return static_cast<int>(epoch);
}

}  // namespace

Status GroupRegistry::AcceptReplacements(const std::string& name, int group_rank) {
  std::shared_ptr<Elastic> elastic;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || !it->second.local_ranks.count(group_rank)) {
      return Status::NotFound("group '" + name + "' has no rank " + std::to_string(group_rank) +
                              " on this sidecar");
    }
    elastic = it->second.elastic;
    if (!elastic) {
      return Status::InvalidArgument("group '" + name +
                                     "' does not shrink, so it takes no replacement (create it "
                                     "with fault tolerance \"shrink\")");
    }
    if (elastic->accepts_published) return Status::Ok();
  }
  Executor::Blocking blocking;
  Status set = elastic->request.store->Set(elastic->keys.AcceptsReplacements(), "1");
  if (!set.ok()) return set.WithContext("group '" + name + "'");
  std::lock_guard<std::mutex> lock(mutex_);
  elastic->accepts_published = true;
  return Status::Ok();
}

StatusOr<std::vector<int>> GroupRegistry::Replacements(const std::string& name,
                                                       int group_rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(name);
  if (it == live_.end() || !it->second.local_ranks.count(group_rank)) {
    return Status::NotFound("group '" + name + "' has no rank " + std::to_string(group_rank) +
                            " on this sidecar");
  }
  const std::shared_ptr<Elastic>& elastic = it->second.elastic;
  if (!elastic) return std::vector<int>{};
  if (elastic->phase == Elastic::Phase::kFailed) return elastic->failure;
  std::vector<int> waiting;
  for (int rank : elastic->joining) {
    if (elastic->view.lost(rank)) waiting.push_back(rank);
  }
  return waiting;
}

Status GroupRegistry::Admit(const std::string& name, int group_rank, uint64_t after_sequence,
                            std::vector<int> joiners) {
  std::sort(joiners.begin(), joiners.end());
  joiners.erase(std::unique(joiners.begin(), joiners.end()), joiners.end());
  std::shared_ptr<Elastic> elastic;
  std::shared_ptr<Group> group;
  int epoch = 0;
  bool retire = true;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it == live_.end() || !it->second.local_ranks.count(group_rank)) {
      return Status::NotFound("group '" + name + "' has no rank " + std::to_string(group_rank) +
                              " on this sidecar");
    }
    elastic = it->second.elastic;
    if (!elastic) {
      return Status::InvalidArgument("group '" + name + "' does not shrink: it admits no rank");
    }
    const std::string who =
        "group '" + name + "': group rank " + std::to_string(group_rank) + " admits ";
    // The current epoch admitted these already (another rank of this sidecar, or another
    // sidecar, admitted them at the same cut and the epoch formed before this rank asked).
    const GroupSpec& spec = it->second.group->spec();
    const bool joined_at_this_cut = !joiners.empty() &&
                                    spec.first_sequence_number == after_sequence + 1 &&
                                    std::includes(elastic->joined.begin(), elastic->joined.end(),
                                                  joiners.begin(), joiners.end());
    if (joined_at_this_cut) return Status::Ok();
    for (int joiner : joiners) {
      if (joiner < 0 || joiner >= elastic->view.group_size()) {
        return Status::InvalidArgument(who + "group rank " + std::to_string(joiner) +
                                       ", which is out of range for its size " +
                                       std::to_string(elastic->view.group_size()));
      }
      if (!elastic->view.lost(joiner)) {
        return Status::InvalidArgument(who + "group rank " + std::to_string(joiner) +
                                       ", which is live: only a lost rank is replaced");
      }
    }
    if (joiners.empty()) return Status::Ok();
    if (elastic->phase == Elastic::Phase::kFailed) return elastic->failure;
    if (elastic->lost_here.count(group_rank)) {
      return Status::PeerLost("group rank " + std::to_string(group_rank) + " of group '" + name +
                              "' was lost");
    }
    group = it->second.group;
    const uint64_t issued = group->SequenceNumber(elastic->view.epoch_rank[group_rank]);
    if (elastic->phase == Elastic::Phase::kSteady || elastic->phase == Elastic::Phase::kDraining) {
      if (issued != after_sequence) {
        return Status::InvalidArgument(who + "replacements after op " +
                                       std::to_string(after_sequence) + ", but its last op is " +
                                       std::to_string(issued) +
                                       ": a replacement comes in only after a rank's last op");
      }
    }
    std::vector<int>& admitted = elastic->admissions[after_sequence];
    if (!admitted.empty()) return Status::Ok();  // another local rank (or sidecar) did
    switch (elastic->phase) {
      case Elastic::Phase::kSteady:
        admitted = joiners;
        elastic->phase = Elastic::Phase::kRetiring;
        elastic->cut = after_sequence;
        elastic->cause = "replacement admitted";
        break;
      case Elastic::Phase::kDraining:
        admitted = joiners;
        elastic->deferred_cut =
            std::min(elastic->deferred_cut.value_or(after_sequence), after_sequence);
        if (elastic->cause.empty()) elastic->cause = "replacement admitted";
        retire = false;
        break;
      case Elastic::Phase::kRetiring:
      case Elastic::Phase::kForming:
      case Elastic::Phase::kFailed:
        // A change is under way (a loss cut the epoch): the replacements wait for a later
        // admission, which their next kJoining record asks for.
        elastic->admissions.erase(after_sequence);
        return Status::Ok();
    }
    epoch = elastic->view.epoch;
  }
  ChangeRecord change;
  change.kind = ChangeRecord::Kind::kAdmitted;
  change.cut = after_sequence;
  change.cause = "replacement admitted";
  change.joiners = joiners;
  Status published = PublishChange(*elastic, epoch, change);
  if (!published.ok()) {
    Status failed = Status::PeerLost(
        "group '" + name +
        "': the admission of replacements could not be published: " + published.message());
    group->Fail(failed);
    FailTransition(name, elastic, failed);
    return failed;
  }
  if (retire) group->Retire(after_sequence, OnRetired(name, elastic));
  return Status::Ok();
}

int GroupRegistry::Epoch(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(name);
  if (it == live_.end() || !it->second.elastic) return 0;
  return it->second.elastic->view.epoch;
}

StatusOr<Membership> GroupRegistry::JoinAsReplacement(const JoinRequest& request,
                                                      const std::vector<int>& members,
                                                      int group_rank, const GroupKeys& running,
                                                      milliseconds timeout) {
  const std::string& name = request.name;
  Store& store = *request.store;
  const std::string who = "group '" + name + "': the replacement for lost group rank " +
                          std::to_string(group_rank) + " (global rank " +
                          std::to_string(request.rank) + ")";
  if (!request.fault_tolerance.shrinks()) {
    return Status::InvalidArgument(
        who +
        " asks for a fail-fast group, but the group shrinks: every rank must ask for the "
        "same fault tolerance");
  }
  StatusOr<bool> accepts = store.Check({running.AcceptsReplacements()});
  if (!accepts.ok()) return accepts.status().WithContext(who);
  if (!*accepts) {
    return Status::InvalidArgument(
        who +
        " cannot join: the group goes on without that rank (it shrank) and its job admits "
        "no replacement (collectived.torch.ft.DistributedDataParallel admits them at step "
        "boundaries); destroy the group on every rank, or run without this rank");
  }
  EpochNodeRecord placement;
  placement.sidecar_id = sidecar_id_;
  placement.admin_address = AdminAddress();
  placement.live_ranks = {request.rank};
  placement.cut = ClaimNonce();
  const std::string claim = EncodeEpochNodeRecord(placement);
  StatusOr<std::string> claimed = store.CompareSet(running.Joining(group_rank), "", claim);
  if (!claimed.ok()) return claimed.status().WithContext(who);
  if (*claimed != claim) {
    StatusOr<EpochNodeRecord> other = DecodeEpochNodeRecord(*claimed);
    return Status::InvalidArgument(
        who + " cannot join: another replacement for that rank is joining" +
        (other.ok() ? " (through sidecar " + other->sidecar_id + ")" : std::string()) +
        "; one replacement per rank at a time (retry once it joined or gave up)");
  }
  auto release = [&] { (void)store.DeleteKey(running.Joining(group_rank)); };
  const steady_clock::time_point deadline = steady_clock::now() + timeout;

  // The epoch to ask: the current one, published by the last change (a change under way
  // publishes it shortly).
  Status changed = store.Wait({running.CurrentEpoch()}, std::min(timeout, kRecordReadBudget));
  StatusOr<int> current =
      changed.ok() ? ReadEpochNumber(store, running, kRecordReadBudget) : StatusOr<int>(changed);
  if (!current.ok()) {
    release();
    return current.status().WithContext(who + ": the group's current epoch cannot be read");
  }
  int epoch = *current;
  while (true) {
    const GroupKeys keys = running.Epoch(epoch);
    StatusOr<std::string> record = store.Get(keys.Membership(), Left(deadline));
    StatusOr<GroupMembership> membership =
        record.ok() ? DecodeMembership(*record) : StatusOr<GroupMembership>(record.status());
    if (!membership.ok() || !membership->refusal.ok()) {
      release();
      const Status why = membership.ok() ? membership->refusal : membership.status();
      return Status(why.kind(), who + " cannot join: the group cannot go on (epoch " +
                                    std::to_string(epoch) + "): " + why.message());
    }
    StatusOr<std::string> members_record = store.Get(keys.EpochMembers(), kRecordReadBudget);
    StatusOr<std::vector<int>> epoch_members =
        members_record.ok() ? DecodeRankList(*members_record)
                            : StatusOr<std::vector<int>>(members_record.status());
    if (!epoch_members.ok()) {
      release();
      return epoch_members.status().WithContext(who);
    }
    if (std::binary_search(epoch_members->begin(), epoch_members->end(), request.rank)) {
      return EnterAsReplacement(request, members, group_rank, running, epoch, deadline);
    }
    if (epoch_members->empty()) {
      release();
      return Status::InvalidArgument(who + " cannot join: the group ended (no live rank left)");
    }
    ChangeRecord joining;
    joining.kind = ChangeRecord::Kind::kJoining;
    joining.group_rank = group_rank;
    joining.cause = "a replacement joins";
    StatusOr<int64_t> n = store.Add(keys.Losses(), 1);
    Status asked = n.ok() ? store.Set(keys.Loss(*n), EncodeChangeRecord(joining)) : n.status();
    if (!asked.ok()) {
      release();
      return asked.WithContext(who);
    }
    LogInfo("replacement waits to be admitted", {{"group", name},
                                                 {"group_rank", std::to_string(group_rank)},
                                                 {"epoch", std::to_string(epoch)}});
    const GroupKeys next = running.Epoch(epoch + 1);
    StatusOr<bool> there = store.Check({next.Membership()});
    Status formed = there.ok() && *there ? Status::Ok() : Status::Timeout("");
    if (!formed.ok()) {
      bool gave_up = false;
      formed = WaitUnlessCancelled(store, {next.Membership()}, Left(deadline),
                                   request.abandoned.get(), runtime_->clock(), &gave_up);
      if (gave_up || !formed.ok()) {
        release();
        if (formed.IsTimeout() && !gave_up) {
          return Status::Timeout(
              "Timeout: " + who + " was not admitted within " + std::to_string(timeout.count()) +
              " ms: the live ranks admit a replacement at a step boundary of "
              "collectived.torch.ft.DistributedDataParallel (is the job still training?)");
        }
        return formed.WithContext(who);
      }
    }
    epoch += 1;  // a change: it took this replacement in, or the request goes to that epoch
  }
}

StatusOr<Membership> GroupRegistry::EnterAsReplacement(const JoinRequest& request,
                                                       const std::vector<int>& members,
                                                       int group_rank, const GroupKeys& running,
                                                       int epoch,
                                                       steady_clock::time_point deadline) {
  const std::string& name = request.name;
  Store& store = *request.store;
  auto done = [&] {
    (void)store.DeleteKey(running.LostRank(group_rank));
    (void)store.DeleteKey(running.Joining(group_rank));
  };
  {
    // This sidecar follows the group for its other ranks: the epoch is formed here as theirs.
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = live_.find(name);
    if (it != live_.end() && it->second.elastic &&
        it->second.elastic->keys.base() == running.base()) {
      const std::shared_ptr<Elastic> elastic = it->second.elastic;
      epoch_changed_.wait_until(lock, deadline, [&] {
        auto now = live_.find(name);
        return now == live_.end() || now->second.elastic != elastic ||
               elastic->phase == Elastic::Phase::kFailed || elastic->view.epoch >= epoch;
      });
      it = live_.find(name);
      if (it == live_.end() || it->second.elastic != elastic ||
          elastic->phase == Elastic::Phase::kFailed || elastic->view.epoch < epoch ||
          elastic->view.lost(group_rank)) {
        lock.unlock();
        (void)store.DeleteKey(running.Joining(group_rank));
        const Status why = elastic->phase == Elastic::Phase::kFailed
                               ? elastic->failure
                               : Status::Timeout("the epoch that took it in did not form here");
        return Status(why.kind(), "group '" + name + "': the replacement for group rank " +
                                      std::to_string(group_rank) +
                                      " cannot join: " + why.message());
      }
      it->second.local_ranks.insert(group_rank);
      std::shared_ptr<Group> group = it->second.group;
      const uint64_t issued = group->spec().first_sequence_number - 1;
      lock.unlock();
      done();
      LogInfo("replacement joined", {{"group", name},
                                     {"group_rank", std::to_string(group_rank)},
                                     {"epoch", std::to_string(epoch)}});
      return Membership{group, group_rank, /*replacement=*/true, issued};
    }
  }
  // A sidecar new to the group: it forms the epoch's Group with the others.
  const GroupKeys keys = running.Epoch(epoch);
  StatusOr<std::string> first_node = store.Get(keys.EpochNode(0), kRecordReadBudget);
  StatusOr<EpochNodeRecord> node = first_node.ok() ? DecodeEpochNodeRecord(*first_node)
                                                   : StatusOr<EpochNodeRecord>(first_node.status());
  StatusOr<std::string> members_record = store.Get(keys.EpochMembers(), kRecordReadBudget);
  StatusOr<std::vector<int>> epoch_members =
      members_record.ok() ? DecodeRankList(*members_record)
                          : StatusOr<std::vector<int>>(members_record.status());
  if (!node.ok() || !epoch_members.ok()) {
    (void)store.DeleteKey(running.Joining(group_rank));
    return (node.ok() ? epoch_members.status() : node.status())
        .WithContext("group '" + name + "': the epoch that took the replacement in");
  }
  StatusOr<Formed> formed = Form(request, keys, *epoch_members, Left(deadline),
                                 EpochStart{epoch, node->cut + 1, members});
  if (!formed.ok()) {
    (void)store.DeleteKey(running.Joining(group_rank));
    return formed.status();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Live& live = live_[name];
    if (live.group) {
      return Status::InvalidArgument("group '" + name +
                                     "' is still alive on this sidecar from an earlier " +
                                     "creation; destroy it on every local rank first");
    }
    live.group = formed->group;
    live.parking = formed->parking;
    live.store = formed->store;
    live.movable_store = formed->movable_store;
    live.keys_base = running.base();
    WatchPeers(live, keys);
    StartElasticLocked(live, request, running);
    live.local_ranks.insert(group_rank);
  }
  done();
  LogInfo("replacement joined",
          {{"group", name},
           {"group_rank", std::to_string(group_rank)},
           {"epoch", std::to_string(epoch)},
           {"sidecars", std::to_string(formed->group->topology().node_count())}});
  return Membership{formed->group, group_rank, /*replacement=*/true, node->cut};
}

}  // namespace collectived
