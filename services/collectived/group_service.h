// The Groups gRPC service: create (a blocking rendezvous among the group's sidecars) and
// destroy process groups for the calling session, and replace a shrinking group's lost ranks (from
// the connection that attached it: PERMISSION_DENIED otherwise, counted in `metrics`).
#pragma once

#include "collectived/v1/group.grpc.pb.h"
#include "engine/sidecar/sidecar.h"
#include "services/collectived/metrics.h"

namespace collectived {

class GroupService final : public v1::Groups::Service {
 public:
  GroupService(Sidecar& sidecar, Metrics& metrics) : sidecar_(sidecar), metrics_(metrics) {}

  grpc::Status CreateGroup(grpc::ServerContext* context, const v1::CreateGroupRequest* request,
                           v1::CreateGroupResponse* response) override;
  grpc::Status DestroyGroup(grpc::ServerContext* context, const v1::DestroyGroupRequest* request,
                            v1::DestroyGroupResponse* response) override;
  grpc::Status Replacements(grpc::ServerContext* context, const v1::ReplacementsRequest* request,
                            v1::ReplacementsResponse* response) override;

 private:
  Sidecar& sidecar_;
  Metrics& metrics_;
};

}  // namespace collectived
