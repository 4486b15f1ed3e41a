// collectivectl health: the gRPC health check of a sidecar, and what it can do with GPUs.
#include <chrono>
#include <cstdio>

#include "collectived/v1/admin.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tools/collectivectl/commands.h"

namespace collectived::collectivectl {

int Health(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  grpc::health::v1::HealthCheckRequest request;
  if (options.command.size() > 1) request.set_service(options.command[1]);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    return Fail("health check of " + options.address + " failed: " + status.error_message());
  }
  std::printf("%s: %s\n", options.address.c_str(),
              grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()).c_str());
  // What the sidecar can do with GPUs, when its admin API lets this caller read it.
  grpc::ClientContext info_context;
  info_context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::SidecarInfo info;
  if (v1::Admin::NewStub(channel)->GetInfo(&info_context, v1::GetInfoRequest(), &info).ok()) {
    std::printf("gpu: %s\n", info.gpu_status().c_str());
  }
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

}  // namespace collectived::collectivectl
