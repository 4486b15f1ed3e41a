#include "rpc/address.h"

#include <cstdlib>
#include <cstring>

#include "rpc/client_environment.h"

namespace collectived {

namespace {

// `address` with every "{local_rank}" replaced by $LOCAL_RANK, when that is a decimal number.
std::string WithLocalRank(std::string address) {
  const char* local_rank = std::getenv("LOCAL_RANK");
  if (local_rank == nullptr || *local_rank == '\0' || std::strlen(local_rank) > 9 ||
      std::strspn(local_rank, "0123456789") != std::strlen(local_rank)) {
    return address;
  }
  const std::string placeholder = kLocalRankPlaceholder;
  for (size_t at = address.find(placeholder); at != std::string::npos;
       at = address.find(placeholder, at)) {
    address.replace(at, placeholder.size(), local_rank);
  }
  return address;
}

}  // namespace

std::string ResolveSidecarAddress(const std::string& explicit_address) {
  if (!explicit_address.empty()) return WithLocalRank(explicit_address);
  if (std::optional<std::string> from_env = ClientSetting(kAddressEnvironmentVariable))
    return WithLocalRank(*from_env);
  std::string address = "unix://";
  return address.append(kDefaultSocketPath);
}

StatusOr<std::string> ToGrpcTarget(const std::string& address) {
  if (address.empty()) return Status::InvalidArgument("empty sidecar address");
  if (address.find(kLocalRankPlaceholder) != std::string::npos) {
    return Status::InvalidArgument("sidecar address '" + address + "' names " +
                                   kLocalRankPlaceholder +
                                   " but $LOCAL_RANK is not set to a number (one sidecar per "
                                   "GPU: set LOCAL_RANK, as torchrun does)");
  }
  std::string path;
  if (address.rfind("unix://", 0) == 0) {
    path = address.substr(7);
  } else if (address.rfind("unix:", 0) == 0) {
    path = address.substr(5);
  } else {
    auto colon = address.rfind(':');
    if (colon == std::string::npos || colon + 1 == address.size()) {
      return Status::InvalidArgument("sidecar address '" + address +
                                     "' is neither unix:///path nor host:port");
    }
    return address;
  }
  if (path.empty() || path.front() != '/') {
    return Status::InvalidArgument("sidecar address '" + address +
                                   "' needs an absolute socket path (unix:///path)");
  }
  return "unix:" + path;
}

}  // namespace collectived
