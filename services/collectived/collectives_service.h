// The Collectives gRPC service: Run (synchronous), Submit (asynchronous) and Wait.
#pragma once

#include "collectived/v1/collectives.grpc.pb.h"
#include "services/collectived/runtime.h"

namespace collectived {

class CollectivesService final : public v1::Collectives::Service {
 public:
  explicit CollectivesService(Runtime& runtime) : runtime_(runtime) {}

  grpc::Status Run(grpc::ServerContext* context, const v1::CollectiveRequest* request,
                   v1::CollectiveResponse* response) override;
  grpc::Status Submit(grpc::ServerContext* context, const v1::CollectiveRequest* request,
                      v1::SubmitResponse* response) override;
  grpc::Status Wait(grpc::ServerContext* context, const v1::WaitRequest* request,
                    v1::CollectiveResponse* response) override;

 private:
  Runtime& runtime_;
};

}  // namespace collectived
