// collectivectl info: version, listeners, TCP security, backends and GPUs of a sidecar.
#include <chrono>
#include <cstdio>

#include "collectived/v1/admin.grpc.pb.h"
#include "rpc/grpc_status.h"
#include "tools/collectivectl/commands.h"

namespace collectived::collectivectl {

int Info(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::SidecarInfo info;
  grpc::Status status = stub->GetInfo(&context, v1::GetInfoRequest(), &info);
  if (!status.ok()) return Fail(FromGrpcStatus(status, &context));
  std::printf(
      "version:    %s\nsidecar:    %s\nsocket:     %s\nlisten:     %s\nadvertise:  %s\n"
      "tcp security: %s\nmetrics:    %s\ngloo:       %s\nnccl:       %s\nuptime:     %lld s\n",
      info.version().c_str(), info.sidecar_id().c_str(), info.unix_socket().c_str(),
      info.listen_address().c_str(), info.advertise_address().c_str(), info.tcp_security().c_str(),
      info.metrics_address().c_str(), info.gloo_available() ? "yes" : "no",
      info.nccl_available() ? "yes" : "no", static_cast<long long>(info.uptime_seconds()));
  std::printf("gpu:        %s\n", info.gpu_status().c_str());
  for (const v1::GpuDevice& gpu : info.gpus()) {
    std::printf("  cuda:%d    %s, sm %s, %.1f GiB, %s, %s\n", gpu.index(), gpu.name().c_str(),
                gpu.compute_capability().c_str(),
                static_cast<double>(gpu.memory_bytes()) / (1024.0 * 1024.0 * 1024.0),
                gpu.pci_bus_id().c_str(),
                !gpu.has_mps_enabled() ? "MPS unknown"
                : gpu.mps_enabled()    ? "MPS"
                                       : "no MPS");
  }
  return 0;
}

}  // namespace collectived::collectivectl
