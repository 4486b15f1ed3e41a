// The Admin gRPC service: a read-only view of the sidecar for operators, and group aborts.
// Who may read and who may abort is AdminPolicy's: every reading method calls CheckRead and
// every mutating method calls CheckChange first; refusals are logged and counted.
#pragma once

#include <chrono>
#include <functional>
#include <string>

#include "collectived/v1/admin.grpc.pb.h"
#include "engine/sidecar/sidecar.h"
#include "services/collectived/admin_policy.h"
#include "services/collectived/config.h"
#include "services/collectived/metrics.h"

namespace collectived {

class AdminService final : public v1::Admin::Service {
 public:
  // `config`, `policy` and `metrics` must outlive the service; `advertise_address` yields the
  // address peers use, which is known only once the listener is bound.
  AdminService(const DaemonConfig& config, Sidecar& sidecar, const AdminPolicy& policy,
               Metrics& metrics, std::function<std::string()> advertise_address);

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
  // Whether the caller may read through `method` (AdminPolicy::AuthorizeRead); a refusal is
  // logged and counted.
  Status CheckRead(const grpc::ServerContext& context, std::string_view method);
  // Whether the caller may call the mutating `method` on `group`
  // (AdminPolicy::AuthorizeChange): every mutating method calls it first. A refusal is logged
  // and counted; an accepted call is logged with the credential that allowed it.
  Status CheckChange(const grpc::ServerContext& context, std::string_view method,
                     const std::string& group);

  const DaemonConfig& config_;
  Sidecar& sidecar_;
  const AdminPolicy& policy_;
  Metrics& metrics_;
  const std::function<std::string()> advertise_address_;
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
};

}  // namespace collectived
