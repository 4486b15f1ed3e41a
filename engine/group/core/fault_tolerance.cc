#include "engine/group/core/fault_tolerance.h"

#include <charconv>

namespace collectived {

std::string FaultTolerance::Encode() const {
  if (!shrinks()) return "fail-fast";
  return "shrink:" + std::to_string(min_ranks);
}

StatusOr<FaultTolerance> ParseFaultTolerance(std::string_view text) {
  FaultTolerance tolerance;
  if (text.empty() || text == "fail-fast" || text == "off") return tolerance;
  constexpr std::string_view kShrink = "shrink";
  if (text.substr(0, kShrink.size()) != kShrink) {
    return Status::InvalidArgument("fault tolerance '" + std::string(text) +
                                   "' is not one of 'fail-fast', 'shrink'");
  }
  tolerance.mode = FaultToleranceMode::kShrink;
  std::string_view rest = text.substr(kShrink.size());
  if (rest.empty()) return tolerance;
  if (rest[0] != ':') {
    return Status::InvalidArgument("fault tolerance '" + std::string(text) +
                                   "' is not one of 'fail-fast', 'shrink'");
  }
  rest.remove_prefix(1);
  int min_ranks = 0;
  auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), min_ranks);
  if (error != std::errc() || end != rest.data() + rest.size()) {
    return Status::InvalidArgument("fault tolerance '" + std::string(text) +
                                   "': the minimum number of ranks is not a number");
  }
  tolerance.min_ranks = min_ranks;
  return tolerance;
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
