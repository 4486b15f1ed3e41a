// FaultTolerance: what a group does when it loses a rank. By default it fails every op, as c10d's
// backends do; a group created to shrink goes on among its live ranks in a new membership epoch
// (docs/fault-tolerance.md), down to `min_ranks`.
#pragma once

#include <string>

#include "engine/vocabulary/status.h"

namespace collectived {

enum class FaultToleranceMode { kFailFast, kShrink };

struct FaultTolerance {
  FaultToleranceMode mode = FaultToleranceMode::kFailFast;
  // Below this many live ranks a shrinking group fails as a fail-fast group does.
  int min_ranks = 1;

  bool shrinks() const { return mode == FaultToleranceMode::kShrink; }
  bool operator==(const FaultTolerance&) const = default;
  // "fail-fast", or "shrink" with its minimum ("shrink:2"): what rank announcements carry, for
  // the ranks to be checked alike.
  std::string Encode() const;
};

// InvalidArgument when `tolerance` cannot apply to a group of `group_size` ranks (a minimum
// below 1 or above the group's size), naming `group`.
Status CheckFaultTolerance(const FaultTolerance& tolerance, const std::string& group,
                           int group_size);

}  // namespace collectived
