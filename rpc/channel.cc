#include "rpc/channel.h"

#include "rpc/address.h"

namespace collectived {

StatusOr<std::shared_ptr<grpc::Channel>> OpenSidecarChannel(const std::string& address) {
  StatusOr<std::string> target = ToGrpcTarget(address);
  if (!target.ok()) return target.status();
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(64 << 20);
  arguments.SetMaxSendMessageSize(64 << 20);
  return grpc::CreateCustomChannel(*target, grpc::InsecureChannelCredentials(), arguments);
}

}  // namespace collectived
