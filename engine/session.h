// Sessions: one per attached client (trainer). A session owns the shared-memory buffers it
// registered and its group memberships; when it ends — clean exit, crash, kill -9 — its buffers
// are released and every group it belonged to fails on all ranks with an error naming the lost
// rank (Sidecar::CloseSession does that; the registry only keeps the live sessions).
//
// Thread-safety: Session and SessionRegistry may be used from any thread.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "engine/shm_segment.h"
#include "engine/status.h"

namespace collectived {

class Session {
 public:
  Session(std::string id, std::string client_name, int64_t pid)
      : id_(std::move(id)), client_name_(std::move(client_name)), pid_(pid) {}

  const std::string& id() const { return id_; }
  const std::string& client_name() const { return client_name_; }
  int64_t pid() const { return pid_; }

  // Maps the segment `shm_name` (its real size must be at least `expected_size`) and returns
  // the id requests use to reference it. ResourceExhausted if the session already has
  // `max_buffers` buffers; otherwise the errors of ShmSegment::Open.
  StatusOr<uint64_t> RegisterBuffer(const std::string& shm_name, size_t expected_size,
                                    size_t max_buffers);
  // NotFound if `buffer_id` is not one of this session's buffers.
  Status UnregisterBuffer(uint64_t buffer_id);
  // The segment behind `buffer_id`, or NotFound naming the session (a session can only use its
  // own buffers).
  StatusOr<std::shared_ptr<ShmSegment>> Buffer(uint64_t buffer_id) const;
  size_t RegisteredBytes() const;

  struct GroupRank {
    std::string group;
    int group_rank;
    int global_rank;
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

 private:
  const std::string id_;
  const std::string client_name_;
  const int64_t pid_;
  mutable std::mutex mutex_;
  uint64_t next_buffer_id_ = 1;                              // guarded by mutex_
  std::map<uint64_t, std::shared_ptr<ShmSegment>> buffers_;  // guarded by mutex_
  std::set<GroupRank> memberships_;                          // guarded by mutex_
};

// The live sessions by id.
class SessionRegistry {
 public:
  // Creates a session with a fresh id ("s<n>-<salt>").
  std::shared_ptr<Session> Open(const std::string& client_name, int64_t pid);
  // The live session `id`, or NotFound ("unknown session ...: it ended or never existed").
  StatusOr<std::shared_ptr<Session>> Find(const std::string& id) const;
  // Forgets the session and returns it (null for an unknown id); its memberships are left to
  // the caller.
  std::shared_ptr<Session> Remove(const std::string& id);
  size_t size() const;
  std::vector<std::shared_ptr<Session>> List() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Session>> sessions_;  // guarded by mutex_
  std::atomic<uint64_t> next_id_{1};
};

}  // namespace collectived
