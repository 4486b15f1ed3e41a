// The Admin gRPC service: a read-only view of the sidecar for operators, and group aborts.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "collectived/v1/admin.grpc.pb.h"
#include "engine/sidecar/sidecar.h"
#include "services/collectived/config.h"

namespace collectived {

class AdminService final : public v1::Admin::Service {
 public:
  // `config` must outlive the service; `advertise_address` yields the address peers use, which
  // is known only once the listener is bound.
  AdminService(const DaemonConfig& config, Sidecar& sidecar,
               std::function<std::string()> advertise_address);

  grpc::Status GetInfo(grpc::ServerContext* context, const v1::GetInfoRequest* request,
                       v1::SidecarInfo* response) override;
  grpc::Status ListGroups(grpc::ServerContext* context, const v1::ListGroupsRequest* request,
                          v1::ListGroupsResponse* response) override;
  grpc::Status DescribeGroup(grpc::ServerContext* context, const v1::DescribeGroupRequest* request,
                             v1::GroupDetail* response) override;
  grpc::Status GetFlightRecorder(grpc::ServerContext* context,
                                 const v1::GetFlightRecorderRequest* request,
                                 v1::FlightRecorder* response) override;
  grpc::Status AbortGroup(grpc::ServerContext* context, const v1::AbortGroupRequest* request,
                          v1::AbortGroupResponse* response) override;

 private:
  const DaemonConfig& config_;
  Sidecar& sidecar_;
  const std::function<std::string()> advertise_address_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace collectived
