#include "services/collectived/admin_service.h"

#include "services/collectived/version.h"

namespace collectived {

AdminService::AdminService(const DaemonConfig& config,
                           std::function<std::string()> advertise_address)
    : config_(config), advertise_address_(std::move(advertise_address)) {}

grpc::Status AdminService::GetInfo(grpc::ServerContext*, const v1::GetInfoRequest*,
                                   v1::SidecarInfo* response) {
  response->set_version(kVersion);
  response->set_sidecar_id(advertise_address_());
  response->set_unix_socket(config_.socket_path);
  response->set_listen_address(config_.listen_address);
  response->set_advertise_address(advertise_address_());
  response->set_metrics_address(config_.metrics_address);
  response->set_gloo_available(kGlooAvailable);
  response->set_nccl_available(kNcclAvailable);
  response->set_uptime_seconds(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::steady_clock::now() - started_)
                                   .count());
  return grpc::Status::OK;
}

}  // namespace collectived
