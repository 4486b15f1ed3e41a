#include "engine/group/transport/gloo/gloo_peer_name_guard.h"

#include <dlfcn.h>
#include <gloo/transport/tcp/device.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace collectived {

void LinkGlooPeerNameGuard() {}

namespace {

using GetPeerName = int (*)(int, sockaddr*, socklen_t*);

GetPeerName RealGetPeerName() {
  static const GetPeerName real = reinterpret_cast<GetPeerName>(dlsym(RTLD_NEXT, "getpeername"));
  return real;
}

// Where libgloo is loaded: a call from inside it has this base.
const void* GlooBase() {
  static const void* base = [] {
    Dl_info info{};
    auto create_device = &gloo::transport::tcp::CreateDevice;
    return dladdr(reinterpret_cast<const void*>(create_device), &info) != 0 ? info.dli_fbase
                                                                            : nullptr;
  }();
  return base;
}

bool CalledFromGloo(const void* caller) {
  Dl_info info{};
  return GlooBase() != nullptr && dladdr(caller, &info) != 0 && info.dli_fbase == GlooBase();
}

}  // namespace
}  // namespace collectived

extern "C" int getpeername(int fd, sockaddr* address, socklen_t* length) {
  const int result = collectived::RealGetPeerName()(fd, address, length);
  if (result == 0 || errno != ENOTCONN || address == nullptr || length == nullptr ||
      *length < sizeof(sockaddr_in) || !collectived::CalledFromGloo(__builtin_return_address(0))) {
    return result;
  }
  sockaddr_in unspecified{};
  unspecified.sin_family = AF_INET;
  std::memcpy(address, &unspecified, sizeof(unspecified));
  *length = sizeof(unspecified);
  return 0;
}
