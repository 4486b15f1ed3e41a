// Sessions: one per attached client (trainer). A session owns the memory it registered (file
// descriptors it handed over) and its group memberships; when it ends — clean exit, crash, kill -9
// — its buffers are released and every group it belonged to fails on all ranks with an error naming
// the lost rank (Sidecar::CloseSession does that; the registry only keeps the live sessions).
//
// A session has two names. Its id is a secret: 128 random bits from the kernel (32 hex
// characters), handed to the client once when it attaches and presented in every call of the
// session; whoever knows it could act as the session, so it is never logged, shown or put in an
// error message. Its label ("s17") is public and stands for the session everywhere a session is
// shown: logs, errors, admin output. A session is also bound to the connection that attached it
// (an opaque binding string that the front end computes; see Sidecar::FindSession).
//
// Memory reaches a session only as a file descriptor, passed over the session's fd channel (a
// Unix socket beside the gRPC one). A connection of that channel is bound to a session by a
// one-time token that the session's own stream received (IssueChannelToken): the fd channel
// cannot name a session any other way. The channel's peer credentials (SO_PEERCRED) are
// recorded in the session.
//
// Thread-safety: Session and SessionRegistry may be used from any thread.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "engine/concurrency/cancel_token.h"
#include "engine/group/rendezvous/job_token.h"  // KeyedHmacSha256
#include "engine/memory/device_memory.h"
#include "engine/memory/shm_segment.h"
#include "engine/sidecar/resource_ledger.h"
#include "engine/vocabulary/status.h"
#include "engine/vocabulary/stream_signal.h"

namespace collectived {

// How a front end names a session in a call: the id the caller presented and the binding of
// the connection the call came through.
struct SessionRef {
  std::string id;       // the secret session id from the request
  std::string binding;  // the caller's connection, as the front end describes it
};

// Who is on the other end of a local connection, as the kernel says (SO_PEERCRED).
struct PeerCredentials {
  int64_t pid = 0;
  int64_t uid = -1;
  int64_t gid = -1;  // pid 0: no fd channel bound yet
};

class Session {
 public:
  // `share`: what the session's client holds, shared with the client's other sessions; null
  // for a session that is a client of its own.
  Session(std::string id, std::string label, std::string binding, std::string client_name,
          int64_t pid, std::shared_ptr<ResourceShare> share = nullptr)
      : id_(std::move(id)),
        label_(std::move(label)),
        binding_(std::move(binding)),
        client_name_(std::move(client_name)),
        pid_(pid),
        resources_(share ? std::move(share)
                         : std::make_shared<ResourceShare>("session " + label_)) {}

  // The secret id: only the front end that attached the session may hand it out (once).
  const std::string& id() const { return id_; }
  // The public name of the session ("s17"), for logs, errors and admin output.
  const std::string& label() const { return label_; }
  // The connection that attached the session (opaque to the engine).
  const std::string& binding() const { return binding_; }
  const std::string& client_name() const { return client_name_; }
  int64_t pid() const { return pid_; }

  // What the session's client holds of the sidecar's resources (ResourceLedger): the session's
  // claims and those of the client's other sessions.
  const std::shared_ptr<ResourceShare>& resources() const { return resources_; }
  // Keeps `claim` until the session is destroyed (what the session itself costs).
  void Hold(ResourceClaim claim);

  // Maps the file behind `fd` (taking ownership of it; its real size must be at least
  // `expected_size`) and returns the id requests use to reference it. The buffer holds, until
  // it is unregistered, one of `ledger`'s buffers, its size in mapped bytes and, when the file
  // is not sealed against shrinking (its descriptor is kept to see its size), a descriptor:
  // ResourceExhausted when the session's share or the sidecar's total of any is used up;
  // otherwise the errors of ShmSegment::Adopt.
  StatusOr<uint64_t> RegisterBuffer(int fd, size_t expected_size, ResourceLedger& ledger);
  // NotFound if `buffer_id` is not one of this session's buffers.
  Status UnregisterBuffer(uint64_t buffer_id);
  // The segment behind `buffer_id`, or NotFound naming the session (a session can only use its
  // own buffers).
  StatusOr<std::shared_ptr<ShmSegment>> Buffer(uint64_t buffer_id) const;
  // The stream signal for the word at `offset` of buffer `buffer_id` (MakeStreamSignal's checks).
  // The first buffer a session signals through is its only one while it is registered (a device
  // pins it: one per session bounds what a client can make the sidecar pin): InvalidArgument
  // naming both for another buffer; Buffer's errors.
  StatusOr<StreamSignal> Signal(uint64_t buffer_id, uint64_t offset, uint32_t value) const;
  size_t RegisteredBytes() const;
  size_t BufferCount() const;

  // The session's imports of device memory (CUDA IPC mappings, cached for the session's life),
  // made on first use; the errors of MakeDeviceMemoryImporter on a sidecar without GPUs.
  StatusOr<DeviceMemoryImporter*> DeviceMemory() const;
  // Imports a CUDA VMM physical allocation the client exported as the POSIX file descriptor
  // `fd` (taken and closed whatever the outcome), `bytes` long on `device`, into the session's
  // device memory (DeviceMemoryImporter::RegisterVmm) and returns its registration id. The errors
  // of DeviceMemory (a sidecar without GPUs) and of RegisterVmm.
  StatusOr<uint64_t> RegisterCudaVmm(int fd, uint64_t bytes, int device);
  // Gives back a registration of RegisterCudaVmm (DeviceMemoryImporter::UnregisterVmm).
  Status UnregisterCudaVmm(uint64_t id);
  // The credentials of the process whose connection attached the session, when the front end
  // knows them (a local connection); pid 0 otherwise. Its fd channel must come from the same
  // process.
  void SetAttachedBy(PeerCredentials peer);
  PeerCredentials attached_by() const;
  // The credentials of the process on the session's fd channel (unknown until one binds).
  void SetPeer(PeerCredentials peer);
  PeerCredentials peer() const;

  struct GroupRank {
    std::string group;
    int group_rank;
    int global_rank;
    // The group the rank costs the session (given back when the last copy goes).
    std::shared_ptr<ResourceClaim> claim;
    bool operator<(const GroupRank& o) const {
      return std::tie(group, group_rank) < std::tie(o.group, o.group_rank);
    }
  };
  void AddMembership(GroupRank membership);
  // Removes the membership in `group`; false if not a member. Whoever removes a membership owns
  // the rank's leaving (so two causes never make one rank leave twice).
  bool RemoveMembership(const std::string& group);
  // The session's rank in `group`, or -1.
  int GroupRankIn(const std::string& group) const;
  std::vector<GroupRank> Memberships() const;

  // Cancelled once the session ended (Sidecar::CloseSession), with why: what serves the session
  // elsewhere (its submission ring) stops then, without asking whether it still lives.
  CancelToken& ended() { return ended_; }

 private:
  const std::string id_;
  const std::string label_;
  const std::string binding_;
  const std::string client_name_;
  const int64_t pid_;
  const std::shared_ptr<ResourceShare> resources_;
  // A registered buffer and what it costs the sidecar.
  struct Registered {
    std::shared_ptr<ShmSegment> segment;
    std::vector<ResourceClaim> claims;
  };
  // Buffer's lookup (requires mutex_).
  StatusOr<std::shared_ptr<ShmSegment>> BufferLocked(uint64_t buffer_id) const;

  mutable std::mutex mutex_;
  uint64_t next_buffer_id_ = 1;                                  // guarded by mutex_
  std::map<uint64_t, Registered> buffers_;                       // guarded by mutex_
  std::vector<ResourceClaim> held_;                              // guarded by mutex_
  std::set<GroupRank> memberships_;                              // guarded by mutex_
  PeerCredentials peer_;                                         // guarded by mutex_
  PeerCredentials attached_by_;                                  // guarded by mutex_
  mutable std::unique_ptr<DeviceMemoryImporter> device_memory_;  // guarded by mutex_
  mutable uint64_t signal_buffer_id_ = 0;                        // guarded by mutex_; 0: none
  CancelToken ended_;
};

// The live sessions by id.
class SessionRegistry {
 public:
  SessionRegistry();

  // Creates a session bound to `binding`, with a fresh secret id (RandomHex(16)) and the next
  // label ("s<n>"), drawing on `share` (null: a share of its own).
  std::shared_ptr<Session> Open(const std::string& client_name, int64_t pid,
                                const std::string& binding,
                                std::shared_ptr<ResourceShare> share = nullptr);
  // The live session whose id is `id`, found in time that says nothing about how close a guess
  // came (see LookupKey); NotFound ("unknown session: the session_id names no live session ...",
  // which never repeats the id) otherwise.
  StatusOr<std::shared_ptr<Session>> Find(const std::string& id) const;
  // Forgets the session and returns it (null for an unknown id); its memberships are left to
  // the caller. `id` comes from the front end that attached the session, never from a request.
  std::shared_ptr<Session> Remove(const std::string& id);

  // A one-time token that binds an fd-channel connection to `session` (RandomHex(16)). At most
  // kMaxChannelTokens are outstanding per session; issuing one more drops the oldest.
  std::string IssueChannelToken(const std::shared_ptr<Session>& session);
  // The live session that `token` was issued for, consuming the token; NotFound ("unknown or
  // used fd-channel token ...", never repeating it) for a token that was never issued, was
  // used already, or whose session ended.
  StatusOr<std::shared_ptr<Session>> RedeemChannelToken(const std::string& token);
  static constexpr size_t kMaxChannelTokens = 4;
  size_t size() const;
  std::vector<std::shared_ptr<Session>> List() const;

 private:
  // What sessions_ is keyed by: HMAC-SHA256 of `id` under a random key of this registry. Each
  // thread keeps the last id it looked up and its digest: a session's ring thread and stream
  // look up the same id for every op (three times per op), and the digest was a seventh of the
  // sidecar's CPU time per small op.
  std::string LookupKey(std::string_view id) const;

  const KeyedHmacSha256 lookup_key_;  // keyed by a random secret of this registry
  const uint64_t serial_;             // this registry among the process's (LookupKey's memo)
  mutable std::mutex mutex_;
  // Live sessions by LookupKey(id), guarded by mutex_.
  std::map<std::string, std::shared_ptr<Session>> sessions_;
  // Outstanding fd-channel tokens by LookupKey(token), and each session's, oldest first;
  // guarded by mutex_.
  std::map<std::string, std::weak_ptr<Session>> channel_tokens_;
  std::map<const Session*, std::vector<std::string>> tokens_of_session_;
  std::atomic<uint64_t> next_label_{1};
};

}  // namespace collectived
