#include "services/collectived/collectives_service.h"

#include "rpc/grpc_status.h"
#include "services/collectived/collective_calls.h"
#include "services/collectived/refusals.h"
#include "services/collectived/session_binding.h"

namespace collectived {

grpc::Status CollectivesService::Run(grpc::ServerContext* context,
                                     const v1::CollectiveRequest* request,
                                     v1::CollectiveResponse* response) {
  StatusOr<v1::CollectiveResponse> result =
      RunCollective(sidecar_, SessionBinding(*context), *request);
  if (!result.ok()) return Answer(metrics_, "Collectives.Run", result.status(), context);
  *response = std::move(*result);
  return grpc::Status::OK;
}

grpc::Status CollectivesService::Submit(grpc::ServerContext* context,
                                        const v1::CollectiveRequest* request,
                                        v1::SubmitResponse* response) {
  SessionService& sessions = sessions_;
  const std::string session_id = request->session_id();
  StatusOr<uint64_t> sequence =
      SubmitCollective(sidecar_, SessionBinding(*context), *request,
                       [&sessions, session_id](const v1::SessionEvent& event) {
                         sessions.Deliver(session_id, event);
                       });
  if (!sequence.ok()) return Answer(metrics_, "Collectives.Submit", sequence.status(), context);
  response->set_client_op_id(request->client_op_id());
  response->set_sequence_number(*sequence);
  return grpc::Status::OK;
}

grpc::Status CollectivesService::Wait(grpc::ServerContext* context, const v1::WaitRequest* request,
                                      v1::CollectiveResponse* response) {
  StatusOr<v1::CollectiveResponse> result =
      WaitCollective(sidecar_, SessionBinding(*context), *request);
  if (!result.ok()) return Answer(metrics_, "Collectives.Wait", result.status(), context);
  *response = std::move(*result);
  return grpc::Status::OK;
}

}  // namespace collectived
