// Sidecar: everything a collectived front end does, in engine types. A front end (the gRPC
// services today, a shared-memory submission ring later) translates its own messages into
// these calls and their results back; none of the policy lives in the front end: how a session
// opens and ends, how a rank joins and leaves a group, how ops are submitted, remembered and
// awaited, how a group is aborted and how the sidecar shuts down.
//
// A rank leaves a group through one path whatever the cause (its client destroyed the group,
// its session ended, the sidecar shut down): its own pending ops fail, the group fails on every
// rank with PeerLost naming the rank (group rank and global rank) and why, and the rank leaves.
//
// No gRPC or protobuf here. Remote rendezvous stores are reached through the injected
// StoreResolver (the daemon wires rpc/'s RemoteStore).
//
// Thread-safety: a Sidecar is safe for concurrent use from any number of threads without
// external synchronization. JoinGroup blocks for the rendezvous; Wait blocks for the op.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/concurrency/activity_count.h"
#include "engine/concurrency/cancel_token.h"
#include "engine/group/rendezvous/group_registry.h"
#include "engine/sidecar/resource_ledger.h"
#include "engine/sidecar/session.h"
#include "engine/sidecar/session_quotas.h"
#include "engine/sidecar/submitted_op.h"
#include "engine/sidecar/submitted_ops.h"
#include "engine/store/store.h"
#include "engine/vocabulary/op.h"
#include "engine/vocabulary/status.h"
#include "engine/vocabulary/timeouts.h"

namespace collectived {

class SidecarStores;  // sidecar.cc

// Connects to the rendezvous store served at `address` (another sidecar's). Returns the store,
// or an error (InvalidArgument for a malformed address, Unavailable, ...).
using StoreResolver = std::function<StatusOr<std::shared_ptr<Store>>(const std::string& address)>;

struct SidecarOptions {
  // The group registry: this sidecar's id, the address Gloo announces, telemetry.
  GroupRegistryOptions groups;
  // This sidecar's own rendezvous store: the store of JoinGroup's empty address.
  std::shared_ptr<Store> local_store;
  // Resolves every other store address (once per address; the result is cached). May be null:
  // then only the local store can be used.
  StoreResolver resolve_store;
  // How many completed asynchronous ops a session remembers.
  SessionQuotas quotas;
  // What sessions may hold, each and all together (ResourceCeilings::Defaults for the machine
  // when not given).
  ResourceCeilings ceilings = ResourceCeilings::Defaults(MachineLimits::OfThisProcess());
  // Told of every request refused at a ceiling (a metric); may be null.
  std::function<void(Resource)> on_resource_refused;
};

// One op as a front end submits it: which session (rank) and group, the engine request, and
// the client's id for it.
struct OpSubmission {
  SessionRef session;
  std::string group;
  OpRequest request;  // request.timeout: kUseGroupTimeout or an explicit timeout
  uint64_t client_op_id = 0;
  // Memory the op holds in the sidecar until it is forgotten (inline tensors): counted against
  // the session's quotas by Submit.
  size_t held_bytes = 0;
  // Handed back in SubmittedOp::frontend_state (Submit only); opaque to the engine.
  std::shared_ptr<const void> frontend_state;
};

// A registered buffer (memory a client passed as a file descriptor).
struct MappedBuffer {
  uint64_t buffer_id = 0;  // what requests use to reference it
  size_t mapped_size = 0;  // the segment's real size (at least the size asked for)
  bool sealed = false;     // a memfd sealed against shrinking (no per-use size check needed)
};

// The outcome of Sidecar::Wait.
struct OpWait {
  std::shared_ptr<const SubmittedOp> op;
  // The result of the wait: the op's status once it completed; Timeout when it did not
  // complete within the wait's timeout (the op itself goes on: check op->work->IsCompleted()).
  Status status;
};

class Sidecar {
 public:
  explicit Sidecar(SidecarOptions options);
  // Destroys the groups (their threads are joined); does not call Shutdown.
  ~Sidecar();
  Sidecar(const Sidecar&) = delete;
  Sidecar& operator=(const Sidecar&) = delete;

  const std::string& sidecar_id() const { return sidecar_id_; }

  // ---- Sessions -------------------------------------------------------------------------

  // Opens a session for a client (`client_name`, process `pid`, both informative) attached
  // through the connection `binding` (see FindSession). Returns the session: its secret id()
  // goes to the client once, its label() everywhere else. Works after Shutdown too (a front end
  // tells the client why it ends); ResourceExhausted ("sessions: ...") when the sidecar already
  // has the most sessions it may have. `attached_by`: the credentials of the attaching
  // connection's process when the front end knows them (its fd channel must then come from the
  // same process). `client`: who the session's resources are accounted to, as the front end
  // identifies the caller ("pid 42 uid 1000" for a local process): the sessions of one client
  // draw on one share of every resource, so that more sessions do not buy a process more of the
  // sidecar; empty makes the session a client of its own.
  StatusOr<std::shared_ptr<Session>> OpenSession(const std::string& client_name, int64_t pid,
                                                 const std::string& binding,
                                                 PeerCredentials attached_by = {},
                                                 const std::string& client = {});

  // The one check of every session-scoped call (groups, buffers, ops, waits): the live session
  // whose secret id is `ref.id`, provided the call came through the connection that attached
  // it (`ref.binding` equals the binding given to OpenSession). Errors: NotFound ("unknown
  // session: ...", never repeating the id) for an id that names no live session;
  // PermissionDenied ("session <label> was attached by another connection; a session is usable
  // only from the connection that attached it") for a live session named from another
  // connection.
  StatusOr<std::shared_ptr<Session>> FindSession(const SessionRef& ref) const;

  // The live sessions, in no particular order.
  std::vector<std::shared_ptr<Session>> ListSessions() const;

  // Ends a session: every group it belongs to loses its rank (see the header comment; `why`
  // says how the session ended, e.g. "the client disconnected"), its remembered ops are
  // forgotten and its buffers are released once no op uses them. `session_id` is the id that
  // OpenSession returned to the front end that owns the session (not a request's). Unknown ids
  // are ignored.
  void CloseSession(const std::string& session_id, const std::string& why);

  // A one-time token for the session's fd channel (SessionRegistry::IssueChannelToken). The
  // front end issues tokens only to sessions that may register memory (local ones) and hands
  // them out on the session's own stream.
  std::string IssueChannelToken(const std::shared_ptr<Session>& session);

  // Binds an fd-channel connection whose peer is `peer` to the session the token was issued
  // for, consuming the token, and records `peer` in the session. Returns the session; NotFound
  // for an unknown, used or expired token (see SessionRegistry::RedeemChannelToken);
  // PermissionDenied when the session was attached by another process than `peer`'s.
  StatusOr<std::shared_ptr<Session>> RedeemChannelToken(const std::string& token,
                                                        PeerCredentials peer);

  // Maps the file behind `fd` (taking ownership of it; at least `size` bytes) for the session.
  // Returns the buffer's id and real size; the errors of FindSession; the errors of
  // Session::RegisterBuffer otherwise. `fd` is closed whatever the outcome.
  StatusOr<MappedBuffer> RegisterBuffer(const SessionRef& session, int fd, size_t size);

  // Imports a CUDA VMM physical allocation of the session's client (the POSIX file descriptor
  // `fd`, taken and closed whatever the outcome; `bytes` long on `device`) for the session's life
  // and returns its registration id. The errors of FindSession and of Session::RegisterCudaVmm.
  StatusOr<uint64_t> RegisterCudaVmm(const SessionRef& session, int fd, uint64_t bytes, int device);
  // Gives back a registration of RegisterCudaVmm. The errors of FindSession; NotFound for an id
  // that is not the session's.
  Status UnregisterCudaVmm(const SessionRef& session, uint64_t id);

  // Unmaps a buffer of the session. The errors of FindSession; NotFound for an unknown buffer.
  Status UnregisterBuffer(const SessionRef& session, uint64_t buffer_id);

  // ---- Groups ---------------------------------------------------------------------------

  // Joins the session to the group `request.name` as rank `request.rank` (request.store is
  // ignored: the rendezvous happens in the store at `store_address`, "" meaning this
  // sidecar's own). Blocks until every member has joined or the timeout
  // (kUseDefaultJoinTimeout or explicit) passes. Returns the membership. Errors: those of
  // FindSession; InvalidArgument if the session already belongs to the group ("this
  // session already belongs to group '<g>'; destroy it first"); the resolver's error with
  // context "rendezvous store"; the errors of GroupRegistry::Join.
  StatusOr<Membership> JoinGroup(const SessionRef& session, JoinRequest request,
                                 const std::string& store_address);

  // The session's rank leaves `group` because its client destroyed the group: its own pending
  // ops fail with Aborted ("rank <r> destroyed group '<g>'"), the group's other ranks fail with
  // PeerLost ("rank <r> (global rank <n>) left group '<g>' (it destroyed the group)").
  // Returns OK once the rank left; the errors of FindSession; NotFound when the session is not
  // part of the group ("this session is not part of group '<g>'").
  Status DestroyGroup(const SessionRef& session, const std::string& group);

  // Replacements of lost ranks in the session's shrinking `group` (GroupRegistry's
  // AcceptReplacements, Admit, Replacements), for its rank there: what `action` asks, then the
  // lost ranks whose replacement waits. The errors of FindSession; NotFound when the session is
  // not part of the group; those of the registry's calls.
  enum class ReplacementAction { kList, kAccept, kAdmit };
  struct ReplacementsAnswer {
    std::vector<int> waiting;
    int epoch = 0;
  };
  StatusOr<ReplacementsAnswer> Replacements(const SessionRef& session, const std::string& group,
                                            ReplacementAction action, uint64_t after_sequence,
                                            std::vector<int> joiners);

  // Fails the group on every rank with Aborted ("group '<g>' was aborted by an operator:
  // <reason>"; an empty reason reads "no reason given"). Returns how many ops were in flight;
  // NotFound ("unknown group '<g>'") if this sidecar has no such group.
  StatusOr<size_t> AbortGroup(const std::string& group, const std::string& reason);

  // Ok when the live group `group` was created with a job token and `token` is it (compared in
  // constant time): a job may act on its own group (e.g. abort it) with its token.
  // PermissionDenied otherwise, never naming the token; NotFound ("unknown group '<g>'").
  Status CheckGroupToken(const std::string& group, const std::string& token) const;

  // The live group `name` on this sidecar, or null.
  std::shared_ptr<Group> FindGroup(const std::string& name) const;
  // The live groups on this sidecar.
  std::vector<std::shared_ptr<Group>> ListGroups() const;

  // ---- Ops ------------------------------------------------------------------------------

  // Checks that `session` may submit ops to `group` now, in the order a submission is
  // checked: the sidecar is not shutting down (else the shutdown reason), the session is live
  // and called from its own connection (the errors of FindSession), the group exists
  // ("unknown group '<g>' (create it first)", InvalidArgument), the session is one of its
  // ranks ("session <label> is not part of group '<g>'", InvalidArgument). Returns the session,
  // which a front end needs to translate its tensors (shared-memory buffers belong to sessions).
  // Start and Submit check the same again.
  StatusOr<std::shared_ptr<Session>> CheckSubmitter(const SessionRef& session,
                                                    const std::string& group) const;

  // Starts an op that nobody will wait for by client op id (a synchronous call waits on the
  // returned Work). Returns the Work, which completes when the op has run on every rank or
  // failed (see Group::Submit); the errors of CheckSubmitter if it could not be submitted.
  StatusOr<std::shared_ptr<Work>> Start(OpSubmission submission);

  // Submits an asynchronous op: like Start, and the op is remembered by the session under
  // submission.client_op_id for Wait, and `done` (may be null) is called when it completes,
  // unless the session ended by then. Returns the remembered op (op->work carries the sequence
  // number); the errors of CheckSubmitter.
  StatusOr<std::shared_ptr<const SubmittedOp>> Submit(OpSubmission submission,
                                                      OpCompletionCallback done);

  // Waits for the session's op `client_op_id` (submitted with Submit) to complete, at most
  // `timeout` (kWaitForever or <= 0: no limit). Returns the op and the wait's status (see
  // OpWait); the errors of FindSession; NotFound ("session <label> has no op with client_op_id
  // <n> (never submitted, or completed long ago)") if the session has no such op remembered.
  StatusOr<OpWait> Wait(const SessionRef& session, uint64_t client_op_id,
                        std::chrono::milliseconds timeout);

  // ---- Lifetime -------------------------------------------------------------------------

  // Starts draining before a shutdown: joins are refused with `reason`, and so is every op
  // except one that completes a collective already in flight (another local rank of its group
  // issued that sequence number), so that ops the trainers started can still finish. Sessions,
  // buffers and waits keep working. Idempotent; Shutdown ends the drain.
  void Drain(const Status& reason);

  // Waits until no collective is in flight on any group, or `deadline` (of the runtime's clock)
  // passes. Returns how many ops are still in flight (0: drained).
  size_t WaitDrained(std::chrono::steady_clock::time_point deadline) const;

  // The ceilings on what sessions hold, and what they hold now.
  ResourceLedger& resources() const { return *ledger_; }

  // The threads and clock every group runs on.
  Runtime& runtime() const { return groups_.runtime(); }

  // The post-mortem of `group` if it failed here recently (kept after the group is gone).
  std::optional<PostMortem> FindPostMortem(const std::string& group) const {
    const PostMortems* kept = groups_.post_mortems();
    return kept ? kept->Find(group) : std::nullopt;
  }
  // The post-mortems kept here (the last --failed-groups-kept failed groups), oldest first.
  std::vector<PostMortem> ListPostMortems() const {
    const PostMortems* kept = groups_.post_mortems();
    return kept ? kept->List() : std::vector<PostMortem>{};
  }

  // Fails every group with `reason`, refuses every later op and join with it, and makes every
  // rank of every session leave its groups (the sessions themselves stay open until their
  // front end closes them, so clients can still be told why). Idempotent.
  void Shutdown(const Status& reason);

  // The store at `address` ("" = the local store); remote ones are resolved once and cached.
  StatusOr<std::shared_ptr<Store>> StoreAt(const std::string& address);

 private:
  // Why a rank leaves a group.
  enum class LeaveCause { kDestroyed, kSessionEnded, kShutdown };

  // The one path by which a rank leaves a group, whatever the cause: fails the rank's own
  // pending ops, fails the group on every rank with PeerLost naming the rank and `why` (so
  // peers learn at once who left instead of timing out: c10d groups are torn down together),
  // then leaves. The caller has already removed the membership from the session (whoever
  // removes it owns the leaving). `session_label` names the session in the log. Returns the
  // registry's Leave status.
  Status LeaveGroup(const std::string& session_label, const Session::GroupRank& membership,
                    LeaveCause cause, const std::string& why);

  // The remembered ops of a session (created on first use).
  std::shared_ptr<SubmittedOps> OpsOf(const std::shared_ptr<Session>& session);
  // The share of `client` (OpenSession), made when its first session opens; it lives as long
  // as one of the client's sessions holds it.
  std::shared_ptr<ResourceShare> ShareOf(const std::string& client);

  const std::string sidecar_id_;
  // The stores this sidecar reaches, shared with its groups (whose stores may move while the
  // sidecar's other members go).
  const std::shared_ptr<SidecarStores> stores_;
  const SessionQuotas quotas_;
  const std::shared_ptr<ResourceLedger> ledger_;
  GroupRegistry groups_;
  SessionRegistry sessions_;

  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<SubmittedOps>> submitted_ops_;  // guarded by mutex_
  std::map<std::string, std::weak_ptr<ResourceShare>> client_shares_;   // guarded by mutex_
  Status shutdown_;                                                     // guarded by mutex_
  Status draining_;                                                     // guarded by mutex_
  // Cancelled by Shutdown: joins waiting for their other ranks stop.
  const std::shared_ptr<CancelToken> shutting_down_;

  // The local ranks' collective works not yet complete (a drain waits for none to be left);
  // shared with their completion callbacks.
  const std::shared_ptr<ActivityCount> in_flight_;
};

}  // namespace collectived
