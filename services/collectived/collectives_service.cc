#include "services/collectived/collectives_service.h"

#include "rpc/grpc_status.h"

namespace collectived {

grpc::Status CollectivesService::Run(grpc::ServerContext* context,
                                     const v1::CollectiveRequest* request,
                                     v1::CollectiveResponse* response) {
  StatusOr<v1::CollectiveResponse> result = runtime_.Run(*request);
  if (!result.ok()) return ToGrpcStatus(result.status(), context);
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::Status CollectivesService::Submit(grpc::ServerContext* context,
                                        const v1::CollectiveRequest* request,
                                        v1::SubmitResponse* response) {
  StatusOr<uint64_t> sequence = runtime_.Submit(*request);
  if (!sequence.ok()) return ToGrpcStatus(sequence.status(), context);
  response->set_client_op_id(request->client_op_id());
  response->set_sequence_number(*sequence);
  return grpc::Status::OK;
}

grpc::Status CollectivesService::Wait(grpc::ServerContext* context, const v1::WaitRequest* request,
                                      v1::CollectiveResponse* response) {
  StatusOr<v1::CollectiveResponse> result =
      runtime_.Wait(request->session_id(), request->client_op_id(),
                    std::chrono::milliseconds(request->timeout_ms()));
  if (!result.ok()) return ToGrpcStatus(result.status(), context);
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace collectived
