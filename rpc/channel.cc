#include "rpc/channel.h"

#include "rpc/address.h"
#include "rpc/limits.h"

namespace collectived {

StatusOr<std::shared_ptr<grpc::Channel>> OpenSidecarChannel(const std::string& address) {
  StatusOr<std::string> target = ToGrpcTarget(address);
  if (!target.ok()) return target.status();
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(kMaxMessageBytes);
  arguments.SetMaxSendMessageSize(kMaxMessageBytes);
  return grpc::CreateCustomChannel(*target, grpc::InsecureChannelCredentials(), arguments);
}

}  // namespace collectived
