#include "rpc/address.h"

#include <cstdlib>

namespace collectived {

std::string ResolveSidecarAddress(const std::string& explicit_address) {
  if (!explicit_address.empty()) return explicit_address;
  const char* from_env = std::getenv(kAddressEnvironmentVariable);
  if (from_env != nullptr && *from_env != '\0') return from_env;
  return std::string("unix://") + kDefaultSocketPath;
}

StatusOr<std::string> ToGrpcTarget(const std::string& address) {
  if (address.empty()) return Status::InvalidArgument("empty sidecar address");
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
