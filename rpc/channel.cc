#include "rpc/channel.h"

#include "rpc/address.h"
#include "rpc/limits.h"

namespace collectived {

bool IsUnixAddress(const std::string& address) {
  return address.rfind("unix:", 0) == 0;
}

StatusOr<std::shared_ptr<grpc::Channel>> OpenSidecarChannel(const std::string& address,
                                                            const ChannelSecurity& security) {
  StatusOr<std::string> target = ToGrpcTarget(address);
  if (!target.ok()) return target.status();
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxMessageBytes);
  arguments.SetMaxSendMessageSize(kMaxMessageBytes);
  if (IsUnixAddress(address) || !security.tls) {
    return grpc::CreateCustomChannel(*target, grpc::InsecureChannelCredentials(), arguments);
  }
  if (!security.server_name.empty()) {
    arguments.SetSslTargetNameOverride(security.server_name);
  }
  return grpc::CreateCustomChannel(*target, security.tls, arguments);
}

StatusOr<std::shared_ptr<grpc::Channel>> OpenClientChannel(const std::string& address,
                                                           const TlsClientOptions& tls) {
  if (IsUnixAddress(address)) return OpenSidecarChannel(address);
  StatusOr<ChannelSecurity> security = ChannelSecurity::Make(tls);
  if (!security.ok()) return security.status().WithContext("TLS to " + address);
  return OpenSidecarChannel(address, *security);
}

}  // namespace collectived
