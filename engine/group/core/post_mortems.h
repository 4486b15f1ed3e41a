// PostMortems: the final state of the last groups that failed on this sidecar (a timeout, a
// desync, a lost peer, an operator's abort), kept after the group itself is gone so that the
// flight records of a failed job can still be read (`collectivectl describe`/`flight-recorder`,
// the Admin API), and written as JSON to a directory at the moment of failure, one file per
// group and sidecar, in a format a script can merge across nodes (docs/post-mortem.md). Each
// failure is logged once, with the ops in flight and the ranks that did not arrive.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/group/core/flight_recorder.h"
#include "engine/vocabulary/status.h"

namespace collectived {

struct PostMortem {
  std::string group;
  std::string sidecar_id;                    // the sidecar that wrote it
  std::string device;                        // "cpu", "cuda:0"
  std::vector<int> members;                  // global rank of each group rank
  std::vector<std::string> sidecar_of_rank;  // sidecar id of each group rank
  std::vector<std::string> address_of_rank;  // that sidecar's gRPC address ("" unknown)
  std::vector<int> local_group_ranks;        // the group ranks this sidecar hosted
  uint64_t sequence_number = 0;              // the last one issued here
  Status failure;
  std::chrono::system_clock::time_point failed_at;
  std::vector<OpRecord> records;  // finished ops, oldest first, then those in flight

  // The ranks an op in flight was still waiting for, as far as this sidecar knows: none once
  // its data phase began (every rank had arrived), else those with no arrival time known here
  // (this sidecar's ranks that had not arrived, and the others', whose arrival only an agreement
  // tells).
  static std::vector<int> RanksNotArrived(const OpRecord& record);
  // Whether the group's failure caught `record`: in flight then, or failed with its kind.
  bool Caught(const OpRecord& record) const;
};

// The post-mortem as one JSON object (format "collectived.post_mortem.v1", docs/post-mortem.md).
std::string PostMortemJson(const PostMortem& post_mortem);

class PostMortems {
 public:
  // Keeps the last `keep` failed groups (0: none) and, when `directory` is not empty, writes
  // each as <directory>/<group>.<sidecar>.<unix ms>.json (names made file-safe).
  PostMortems(size_t keep, std::string directory);

  // Logs the failure, keeps it and writes its file (a write that fails is logged, not fatal).
  void Record(PostMortem post_mortem);

  // The most recent post-mortem of `group`, if kept.
  std::optional<PostMortem> Find(const std::string& group) const;
  // The kept post-mortems, oldest first.
  std::vector<PostMortem> List() const;

  const std::string& directory() const { return directory_; }

 private:
  const size_t keep_;
  const std::string directory_;
  mutable std::mutex mutex_;
  std::deque<PostMortem> kept_;  // guarded by mutex_; oldest first
};

}  // namespace collectived
