#include "engine/group/core/fault_tolerance.h"

namespace collectived {

std::string FaultTolerance::Encode() const {
  if (!shrinks()) return "fail-fast";
  return "shrink:" + std::to_string(min_ranks);
}

Status CheckFaultTolerance(const FaultTolerance& tolerance, const std::string& group,
                           int group_size) {
  if (!tolerance.shrinks()) return Status::Ok();
  if (tolerance.min_ranks < 1 || tolerance.min_ranks > group_size) {
    return Status::InvalidArgument("group '" + group + "': the fault tolerance's minimum of " +
                                   std::to_string(tolerance.min_ranks) +
                                   " live ranks is outside [1, " + std::to_string(group_size) +
                                   "], the group's size");
  }
  return Status::Ok();
}

}  // namespace collectived
