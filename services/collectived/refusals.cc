#include "services/collectived/refusals.h"

#include "rpc/grpc_status.h"

namespace collectived {

grpc::Status Answer(Metrics& metrics, std::string_view method, const Status& status,
                    grpc::ServerContext* context) {
  metrics.CountRefusedCall(method, status.kind());
  return ToGrpcStatus(status, context);
}

}  // namespace collectived
