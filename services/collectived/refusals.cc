#include "services/collectived/refusals.h"

#include "engine/vocabulary/logging.h"
#include "rpc/caller.h"
#include "rpc/grpc_status.h"

namespace collectived {

grpc::Status Answer(Metrics& metrics, std::string_view method, const Status& status,
                    grpc::ServerContextBase* context) {
  if (status.kind() == ErrorKind::kPermissionDenied ||
      status.kind() == ErrorKind::kUnauthenticated) {
    metrics.CountRefusedCall(method, status.kind());
    LogWarning("call refused", {{"method", std::string(method)},
                                {"caller", IdentifyCaller(*context).Describe()},
                                {"error", status.ToString()}});
  }
  return ToGrpcStatus(status, context);
}

}  // namespace collectived
