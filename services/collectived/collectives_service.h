// The Collectives gRPC service: Run (synchronous), Submit (asynchronous) and Wait, each for a
// session of the calling connection (PERMISSION_DENIED otherwise, counted in `metrics`).
#pragma once

#include "collectived/v1/collectives.grpc.pb.h"
#include "engine/sidecar/sidecar.h"
#include "services/collectived/session_service.h"

namespace collectived {

class CollectivesService final : public v1::Collectives::Service {
 public:
  // Completions of ops submitted here go to the session's Attach stream, through `sessions`.
  CollectivesService(Sidecar& sidecar, SessionService& sessions, Metrics& metrics)
      : sidecar_(sidecar), sessions_(sessions), metrics_(metrics) {}

  grpc::Status Run(grpc::ServerContext* context, const v1::CollectiveRequest* request,
                   v1::CollectiveResponse* response) override;
  grpc::Status Submit(grpc::ServerContext* context, const v1::CollectiveRequest* request,
                      v1::SubmitResponse* response) override;
  grpc::Status Wait(grpc::ServerContext* context, const v1::WaitRequest* request,
                    v1::CollectiveResponse* response) override;

 private:
  Sidecar& sidecar_;
  SessionService& sessions_;
  Metrics& metrics_;
};

}  // namespace collectived
