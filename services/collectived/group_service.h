// The Groups gRPC service: create (a blocking rendezvous among the group's sidecars) and
// destroy process groups for the calling session.
#pragma once

#include "collectived/v1/group.grpc.pb.h"
#include "engine/sidecar/sidecar.h"

namespace collectived {

class GroupService final : public v1::Groups::Service {
 public:
  explicit GroupService(Sidecar& sidecar) : sidecar_(sidecar) {}

  grpc::Status CreateGroup(grpc::ServerContext* context, const v1::CreateGroupRequest* request,
                           v1::CreateGroupResponse* response) override;
  grpc::Status DestroyGroup(grpc::ServerContext* context, const v1::DestroyGroupRequest* request,
                            v1::DestroyGroupResponse* response) override;

 private:
  Sidecar& sidecar_;
};

}  // namespace collectived
