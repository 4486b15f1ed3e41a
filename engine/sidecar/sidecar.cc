#include "engine/sidecar/sidecar.h"

#include <malloc.h>
#include <unistd.h>

#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include "engine/store/store_addresses.h"
#include "engine/vocabulary/logging.h"
#include "engine/vocabulary/op_traits.h"

namespace collectived {

// The local store and the remote ones, resolved once per address and cached.
class SidecarStores {
 public:
  SidecarStores(std::shared_ptr<Store> local, StoreResolver resolve)
      : local_(std::move(local)), resolve_(std::move(resolve)) {}

  StatusOr<std::shared_ptr<Store>> At(const std::string& address) {
    if (address.empty()) return local_;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = remote_.find(address);
    if (it != remote_.end()) return it->second;
    if (!resolve_) {
      return Status::Unavailable("store address '" + address +
                                 "' cannot be reached: this sidecar resolves no remote stores");
    }
    StatusOr<std::shared_ptr<Store>> store = resolve_(address);
    if (!store.ok()) return store.status();
    remote_.emplace(address, *store);
    return *store;
  }

 private:
  const std::shared_ptr<Store> local_;
  const StoreResolver resolve_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Store>> remote_;  // guarded by mutex_
};

namespace {

// The registry's groups reach the sidecars' stores as JoinGroup does (a shrinking group's moves).
GroupRegistryOptions WithStores(GroupRegistryOptions options,
                                const std::shared_ptr<SidecarStores>& stores) {
  if (!options.store_at) {
    options.store_at = [stores](const std::string& address) { return stores->At(address); };
  }
  return options;
}

}  // namespace

Sidecar::Sidecar(SidecarOptions options)
    : sidecar_id_(options.groups.sidecar_id),
      stores_(std::make_shared<SidecarStores>(std::move(options.local_store),
                                              std::move(options.resolve_store))),
      quotas_(options.quotas),
      ledger_(ResourceLedger::Create(options.ceilings, std::move(options.on_resource_refused))),
      groups_(WithStores(std::move(options.groups), stores_)),
      shutting_down_(std::make_shared<CancelToken>()),
      in_flight_(std::make_shared<ActivityCount>()) {}

Sidecar::~Sidecar() = default;

// ---- Sessions ---------------------------------------------------------------------------

StatusOr<std::shared_ptr<Session>> Sidecar::OpenSession(const std::string& client_name, int64_t pid,
                                                        const std::string& binding,
                                                        PeerCredentials attached_by,
                                                        const std::string& client) {
  std::shared_ptr<ResourceShare> share =
      client.empty() ? std::make_shared<ResourceShare>("a new session") : ShareOf(client);
  StatusOr<ResourceClaim> admitted = ledger_->Claim(share, Resource::kSessions, 1);
  if (!admitted.ok()) return admitted.status();
  std::shared_ptr<Session> session =
      sessions_.Open(client_name, pid, binding, client.empty() ? nullptr : std::move(share));
  session->Hold(std::move(*admitted));
  session->SetAttachedBy(attached_by);
  (void)OpsOf(session);
  return session;
}

std::shared_ptr<ResourceShare> Sidecar::ShareOf(const std::string& client) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::weak_ptr<ResourceShare>& slot = client_shares_[client];
  std::shared_ptr<ResourceShare> share = slot.lock();
  if (share) return share;
  share = std::make_shared<ResourceShare>("client " + client);
  slot = share;
  // The clients that left are forgotten here, so the map stays the size of the live ones.
  std::erase_if(client_shares_, [](const auto& entry) { return entry.second.expired(); });
  return share;
}

StatusOr<std::shared_ptr<Session>> Sidecar::FindSession(const SessionRef& ref) const {
  StatusOr<std::shared_ptr<Session>> session = sessions_.Find(ref.id);
  if (!session.ok()) return session.status();
  // The binding is not a secret (a peer address, "unix"): a plain comparison will do.
  if ((*session)->binding() != ref.binding) {
    return Status::PermissionDenied("session " + (*session)->label() +
                                    " was attached by another connection; a session is usable "
                                    "only from the connection that attached it");
  }
  return session;
}

std::vector<std::shared_ptr<Session>> Sidecar::ListSessions() const {
  return sessions_.List();
}

void Sidecar::CloseSession(const std::string& session_id, const std::string& why) {
  std::shared_ptr<Session> session = sessions_.Remove(session_id);
  // Its joins still waiting for their other ranks stop too (JoinGroup watches this token).
  if (session) session->ended().Cancel(Status::Aborted("session " + session->label() + " ended"));
  if (session) {
    for (const Session::GroupRank& membership : session->Memberships()) {
      if (!session->RemoveMembership(membership.group)) continue;  // left meanwhile
      (void)LeaveGroup(session->label(), membership, LeaveCause::kSessionEnded, why);
    }
  }
  std::shared_ptr<SubmittedOps> ops;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = submitted_ops_.find(session_id);
    if (it == submitted_ops_.end()) return;
    ops = std::move(it->second);
    submitted_ops_.erase(it);
  }
  // The session's remembered ops and their inline tensors are freed here (ops still running free
  // theirs as they fail); glibc keeps freed memory in its arenas unless told to give it back, and
  // a session that ended with a gigabyte of pending payloads left the sidecar a gigabyte larger.
  ops.reset();
  session.reset();
  malloc_trim(0);
}

std::string Sidecar::IssueChannelToken(const std::shared_ptr<Session>& session) {
  return sessions_.IssueChannelToken(session);
}

StatusOr<std::shared_ptr<Session>> Sidecar::RedeemChannelToken(const std::string& token,
                                                               PeerCredentials peer) {
  StatusOr<std::shared_ptr<Session>> session = sessions_.RedeemChannelToken(token);
  if (!session.ok()) return session;
  const PeerCredentials attached_by = (*session)->attached_by();
  if (attached_by.pid != 0 && attached_by.pid != peer.pid) {
    return Status::PermissionDenied("session " + (*session)->label() + " was attached by pid " +
                                    std::to_string(attached_by.pid) +
                                    "; its fd channel must come from that process, not pid " +
                                    std::to_string(peer.pid));
  }
  (*session)->SetPeer(peer);
  return session;
}

StatusOr<MappedBuffer> Sidecar::RegisterBuffer(const SessionRef& ref, int fd, size_t size) {
  StatusOr<std::shared_ptr<Session>> session = FindSession(ref);
  if (!session.ok()) {
    close(fd);
    return session.status();
  }
  StatusOr<uint64_t> id = (*session)->RegisterBuffer(fd, size, *ledger_);
  if (!id.ok()) return id.status();
  StatusOr<std::shared_ptr<ShmSegment>> segment = (*session)->Buffer(*id);
  return MappedBuffer{*id, segment.ok() ? (*segment)->size() : 0,
                      segment.ok() && (*segment)->sealed()};
}

StatusOr<uint64_t> Sidecar::RegisterCudaVmm(const SessionRef& ref, int fd, uint64_t bytes,
                                            int device) {
  StatusOr<std::shared_ptr<Session>> session = FindSession(ref);
  if (!session.ok()) {
    close(fd);
    return session.status();
  }
  return (*session)->RegisterCudaVmm(fd, bytes, device);
}

Status Sidecar::UnregisterCudaVmm(const SessionRef& ref, uint64_t id) {
  StatusOr<std::shared_ptr<Session>> session = FindSession(ref);
  if (!session.ok()) return session.status();
  return (*session)->UnregisterCudaVmm(id);
}

Status Sidecar::UnregisterBuffer(const SessionRef& ref, uint64_t buffer_id) {
  StatusOr<std::shared_ptr<Session>> session = FindSession(ref);
  if (!session.ok()) return session.status();
  return (*session)->UnregisterBuffer(buffer_id);
}

// ---- Groups -----------------------------------------------------------------------------

StatusOr<std::shared_ptr<Store>> Sidecar::StoreAt(const std::string& address) {
  return stores_->At(address);
}

StatusOr<Membership> Sidecar::JoinGroup(const SessionRef& ref, JoinRequest request,
                                        const std::string& store_address) {
  StatusOr<std::shared_ptr<Session>> session = FindSession(ref);
  if (!session.ok()) return session.status();
  const std::string session_id = (*session)->id();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!shutdown_.ok()) return shutdown_;
    if (!draining_.ok()) return draining_;
  }
  if ((*session)->GroupRankIn(request.name) >= 0) {
    return Status::InvalidArgument("this session already belongs to group '" + request.name +
                                   "'; destroy it first");
  }
  StatusOr<std::vector<std::string>> addresses = ParseStoreAddresses(store_address);
  if (!addresses.ok()) {
    return addresses.status().WithContext("group '" + request.name + "': rendezvous store");
  }
  StatusOr<std::shared_ptr<Store>> store = StoreAt(addresses->front());
  if (!store.ok()) return store.status().WithContext("rendezvous store");
  request.store = *store;
  request.store_fallbacks.assign(addresses->begin() + 1, addresses->end());
  StatusOr<ResourceClaim> group_claim =
      ledger_->Claim((*session)->resources(), Resource::kGroups, 1);
  if (!group_claim.ok()) return group_claim.status().WithContext("group '" + request.name + "'");
  // The join stops as soon as nobody waits for it: the session ended, the sidecar stops, or the
  // front end cancels its token (a cancelled call).
  if (!request.abandoned) request.abandoned = std::make_shared<CancelToken>();
  const std::shared_ptr<CancelToken> abandoned = request.abandoned;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!shutdown_.ok()) return shutdown_;
  }
  // Either token, once cancelled (at once, here, if it already is), cancels the join.
  CancelToken& ended = (*session)->ended();
  const uint64_t on_end = ended.OnCancel(
      [abandoned](const Status&) { abandoned->Cancel(Status::Aborted("its session ended")); });
  const uint64_t on_shutdown =
      shutting_down_->OnCancel([abandoned](const Status& why) { abandoned->Cancel(why); });
  StatusOr<Membership> membership = groups_.Join(request);
  ended.Remove(on_end);
  shutting_down_->Remove(on_shutdown);
  if (!membership.ok()) return membership.status();
  (*session)->AddMembership({request.name, membership->group_rank, request.rank,
                             std::make_shared<ResourceClaim>(std::move(*group_claim))});
  return membership;
}

Status Sidecar::DestroyGroup(const SessionRef& ref, const std::string& group) {
  StatusOr<std::shared_ptr<Session>> session = FindSession(ref);
  if (!session.ok()) return session.status();
  Status not_member = Status::NotFound("this session is not part of group '" + group + "'");
  std::optional<Session::GroupRank> membership;
  for (const Session::GroupRank& m : (*session)->Memberships()) {
    if (m.group == group) membership = m;
  }
  // Whoever removes the membership makes the rank leave (a session closing at the same time
  // finds it gone).
  if (!membership || !(*session)->RemoveMembership(group)) return not_member;
  return LeaveGroup((*session)->label(), *membership, LeaveCause::kDestroyed,
                    "it destroyed the group");
}

StatusOr<Sidecar::ReplacementsAnswer> Sidecar::Replacements(const SessionRef& ref,
                                                            const std::string& group,
                                                            ReplacementAction action,
                                                            uint64_t after_sequence,
                                                            std::vector<int> joiners) {
  StatusOr<std::shared_ptr<Session>> session = FindSession(ref);
  if (!session.ok()) return session.status();
  std::optional<Session::GroupRank> membership;
  for (const Session::GroupRank& m : (*session)->Memberships()) {
    if (m.group == group) membership = m;
  }
  if (!membership) return Status::NotFound("this session is not part of group '" + group + "'");
  switch (action) {
    case ReplacementAction::kList:
      break;
    case ReplacementAction::kAccept:
      COLLECTIVED_RETURN_IF_ERROR(groups_.AcceptReplacements(group, membership->group_rank));
      break;
    case ReplacementAction::kAdmit:
      COLLECTIVED_RETURN_IF_ERROR(
          groups_.Admit(group, membership->group_rank, after_sequence, std::move(joiners)));
      break;
  }
  StatusOr<std::vector<int>> waiting = groups_.Replacements(group, membership->group_rank);
  if (!waiting.ok()) return waiting.status();
  return ReplacementsAnswer{std::move(*waiting), groups_.Epoch(group)};
}

Status Sidecar::LeaveGroup(const std::string& session_label, const Session::GroupRank& membership,
                           LeaveCause cause, const std::string& why) {
  const std::string& group = membership.group;
  const std::string rank = std::to_string(membership.group_rank);
  const std::string who =
      "rank " + rank + " (global rank " + std::to_string(membership.global_rank) + ")";
  Status own;    // what the rank's own pending ops fail with
  Status peers;  // what the group fails with, on every rank
  switch (cause) {
    case LeaveCause::kDestroyed:
      own = Status::Aborted("rank " + rank + " destroyed group '" + group + "'");
      peers = Status::PeerLost(who + " left group '" + group + "' (" + why + ")");
      break;
    case LeaveCause::kSessionEnded:
      peers = Status::PeerLost(who + " of group '" + group +
                               "' was lost: its client session ended (" + why + ")");
      own = peers;
      break;
    case LeaveCause::kShutdown:
      own = Status::Aborted("rank " + rank + " left group '" + group + "': " + why);
      peers = Status::PeerLost(who + " left group '" + group + "' (" + why + ")");
      break;
  }
  // A lost rank is worth a warning; a rank that leaves on purpose is not.
  const bool lost = cause == LeaveCause::kSessionEnded;
  (lost ? LogWarning : LogInfo)(
      lost ? "rank lost" : "rank left group",
      {{"group", group}, {"group_rank", rank}, {"session", session_label}, {"why", why}});
  // A shrinking group goes on without a rank that was lost or left (docs/fault-tolerance.md):
  // the rank's ops already issued still run, and the group cuts its epoch after them.
  if (cause != LeaveCause::kShutdown && groups_.Shrinks(group) &&
      groups_.LoseRank(group, membership.group_rank, peers).ok()) {
    return groups_.Leave(group, membership.group_rank);
  }
  (void)groups_.AbortRank(group, membership.group_rank, own);
  (void)groups_.FailGroup(group, peers);
  return groups_.Leave(group, membership.group_rank);
}

StatusOr<size_t> Sidecar::AbortGroup(const std::string& group_name, const std::string& reason) {
  std::shared_ptr<Group> group = groups_.Find(group_name);
  if (!group) return Status::NotFound("unknown group '" + group_name + "'");
  const size_t in_flight = group->InFlight().size();
  (void)groups_.FailGroup(
      group_name, Status::Aborted("group '" + group->name() + "' was aborted by an operator: " +
                                  (reason.empty() ? "no reason given" : reason)));
  return in_flight;
}

Status Sidecar::CheckGroupToken(const std::string& group_name, const std::string& token) const {
  std::shared_ptr<Group> group = groups_.Find(group_name);
  if (!group) return Status::NotFound("unknown group '" + group_name + "'");
  if (!group->has_job_token()) {
    return Status::PermissionDenied("group '" + group_name +
                                    "' was created without a job token: no token can act on it");
  }
  if (!group->AcceptsJobToken(token)) {
    return Status::PermissionDenied("the job token presented is not group '" + group_name + "''s");
  }
  return Status::Ok();
}

std::shared_ptr<Group> Sidecar::FindGroup(const std::string& name) const {
  return groups_.Find(name);
}

std::vector<std::shared_ptr<Group>> Sidecar::ListGroups() const {
  return groups_.List();
}

// ---- Ops --------------------------------------------------------------------------------

StatusOr<std::shared_ptr<Session>> Sidecar::CheckSubmitter(const SessionRef& ref,
                                                           const std::string& group) const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!shutdown_.ok()) return shutdown_;
  }
  StatusOr<std::shared_ptr<Session>> session = FindSession(ref);
  if (!session.ok()) return session.status();
  if (!groups_.Find(group))
    return Status::InvalidArgument("unknown group '" + group + "' (create it first)");
  if ((*session)->GroupRankIn(group) < 0) {
    return Status::InvalidArgument("session " + (*session)->label() + " is not part of group '" +
                                   group + "'");
  }
  return session;
}

StatusOr<std::shared_ptr<Work>> Sidecar::Start(OpSubmission submission) {
  StatusOr<std::shared_ptr<Session>> session = CheckSubmitter(submission.session, submission.group);
  if (!session.ok()) return session.status();
  std::shared_ptr<Group> group = groups_.Find(submission.group);
  const int group_rank = (*session)->GroupRankIn(submission.group);
  if (!group || group_rank < 0) {  // left or destroyed since the check
    return CheckSubmitter(submission.session, submission.group).status();
  }
  Status draining;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    draining = draining_;
  }
  // While draining, only an op that another local rank already issued may start: it completes a
  // collective in flight instead of beginning a new one.
  const OpTraits& traits = TraitsOf(submission.request.kind);
  if (!draining.ok() &&
      (traits.point_to_point || groups_.SequenceNumber(submission.group, group_rank) >=
                                    groups_.SequenceNumber(submission.group))) {
    return Status(draining.kind(), draining.message() + " (no new " + std::string(traits.name) +
                                       " on group '" + submission.group + "')");
  }
  const bool collective = !traits.point_to_point;
  std::shared_ptr<Work> work =
      groups_.Submit(submission.group, group_rank, std::move(submission.request));
  if (collective && !work->IsCompleted()) {
    // Each local rank's work counted until it completes, so that a drain learns without polling
    // when the last one did.
    in_flight_->Enter();
    work->AddCallback([in_flight = in_flight_](const Status&) { in_flight->Exit(); });
  }
  return work;
}

std::shared_ptr<SubmittedOps> Sidecar::OpsOf(const std::shared_ptr<Session>& session) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<SubmittedOps>& ops = submitted_ops_[session->id()];
  if (!ops) ops = std::make_shared<SubmittedOps>(quotas_, ledger_, session->resources());
  return ops;
}

StatusOr<std::shared_ptr<const SubmittedOp>> Sidecar::Submit(OpSubmission submission,
                                                             OpCompletionCallback done) {
  StatusOr<std::shared_ptr<Session>> session = FindSession(submission.session);
  if (!session.ok()) return session.status();
  const std::string& label = (*session)->label();
  std::shared_ptr<SubmittedOps> ops;
  {
    // Not OpsOf: a session that ended must not get its ops table back (a leak).
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = submitted_ops_.find((*session)->id());
    if (it != submitted_ops_.end()) ops = it->second;
  }
  if (!ops) {
    Status refused = CheckSubmitter(submission.session, submission.group).status();
    return refused.ok() ? Status::NotFound("session " + label + " ended") : refused;
  }
  auto op = std::make_shared<SubmittedOp>();
  op->client_op_id = submission.client_op_id;
  op->held_bytes = submission.held_bytes;
  op->frontend_state = std::move(submission.frontend_state);
  // The quota is taken before the op starts: a refused op never runs.
  if (Status room = ops->Reserve(op->held_bytes); !room.ok()) {
    return room.WithContext("session " + label + ", group '" + submission.group + "'");
  }
  // A collective counts as in flight from here until its completion was handed to the front
  // end (`done`), not only while its work runs: a drain that ended in between (the last rank's
  // arrival may complete the op inside Start, before `done` is attached) would close the
  // client's ring or stream before the completion reached it.
  std::shared_ptr<ActivityCount> in_flight =
      TraitsOf(submission.request.kind).point_to_point ? nullptr : in_flight_;
  if (in_flight) in_flight->Enter();
  StatusOr<std::shared_ptr<Work>> work = Start(std::move(submission));
  if (!work.ok()) {
    ops->Unreserve(op->held_bytes);
    if (in_flight) in_flight->Exit();
    return work.status();
  }
  op->work = std::move(*work);
  ops->Add(op);
  std::weak_ptr<SubmittedOps> weak_ops = ops;
  op->work->AddCallback([weak_ops, op, in_flight, done = std::move(done)](const Status&) {
    if (std::shared_ptr<SubmittedOps> ops = weak_ops.lock()) {  // else the session ended
      ops->Completed(op);
      if (done) done(*op);
    }
    if (in_flight) in_flight->Exit();
  });
  return std::shared_ptr<const SubmittedOp>(op);
}

StatusOr<OpWait> Sidecar::Wait(const SessionRef& ref, uint64_t client_op_id,
                               std::chrono::milliseconds timeout) {
  StatusOr<std::shared_ptr<Session>> session = FindSession(ref);
  if (!session.ok()) return session.status();
  std::shared_ptr<const SubmittedOp> op;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = submitted_ops_.find((*session)->id());
    if (it != submitted_ops_.end()) op = it->second->Find(client_op_id);
  }
  if (!op) {
    return Status::NotFound("session " + (*session)->label() + " has no op with client_op_id " +
                            std::to_string(client_op_id) +
                            " (never submitted, or completed long ago)");
  }
  Status waited = timeout > kWaitForever ? op->work->Wait(timeout) : op->work->future().Wait();
  return OpWait{std::move(op), std::move(waited)};
}

// ---- Lifetime ---------------------------------------------------------------------------

void Sidecar::Drain(const Status& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (draining_.ok()) draining_ = reason;
}

size_t Sidecar::WaitDrained(std::chrono::steady_clock::time_point deadline) const {
  if (in_flight_->WaitUntil(runtime().clock(), deadline)) return 0;
  // The ops still in flight (the count above is of the local ranks' works).
  size_t in_flight = 0;
  for (const std::shared_ptr<Group>& group : groups_.List()) in_flight += group->InFlight().size();
  return in_flight;
}

void Sidecar::Shutdown(const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = reason;
  }
  shutting_down_->Cancel(reason);  // joins waiting for their other ranks stop
  groups_.Shutdown(reason);
  for (const std::shared_ptr<Session>& session : sessions_.List()) {
    for (const Session::GroupRank& membership : session->Memberships()) {
      if (!session->RemoveMembership(membership.group)) continue;
      (void)LeaveGroup(session->label(), membership, LeaveCause::kShutdown,
                       "the sidecar is shutting down");
    }
  }
}

}  // namespace collectived
