#include "engine/group/transport/sidecar_transport_factory.h"

#include <algorithm>
#include <chrono>

#include "engine/cuda/gpu_inventory.h"
#include "engine/group/transport/gloo/gloo_backend.h"
#include "engine/group/transport/socket/socket_handshake.h"
#include "engine/group/transport/socket/socket_mesh.h"
#ifdef COLLECTIVED_WITH_NCCL
#include "engine/group/transport/nccl/nccl_backend.h"
#endif

namespace collectived {
SidecarTransportFactory::SidecarTransportFactory(std::string advertise_host, Runtime& runtime)
    : gloo_(std::move(advertise_host), runtime.clock()), runtime_(runtime) {}

Status SidecarTransportFactory::CheckDevice(const std::string& group, DeviceKind device) const {
  if (device == DeviceKind::kCpu) return Status::Ok();
  const GpuInventory& gpus = ProbeGpus();
  if (!gpus.backend_built) {
    return Status::InvalidArgument("group '" + group +
                                   "': CUDA groups need the GPU backend, and this sidecar was " +
                                   gpus.problem);
  }
  if (gpus.devices.empty()) {
    return Status::InvalidArgument(
        "group '" + group +
        "': CUDA groups need a GPU, and this sidecar sees none: " + gpus.problem);
  }
  return Status::Ok();
}

StatusOr<GroupTransport> SidecarTransportFactory::Connect(const ConnectRequest& request) {
  COLLECTIVED_RETURN_IF_ERROR(CheckDevice(request.group, request.device));
  if (request.device == DeviceKind::kCuda) {
    const GpuInventory& gpus = ProbeGpus();
    if (request.device_index < 0 || request.device_index >= static_cast<int>(gpus.devices.size())) {
      return Status::InvalidArgument(
          "group '" + request.group + "': CUDA device " + std::to_string(request.device_index) +
          " does not exist; this sidecar sees " + std::to_string(gpus.devices.size()) + " (" +
          gpus.DeviceList() + ")");
    }
  }
  const GroupTopology& topology = request.topology;
  const int nodes = topology.node_count();
  const Clock::TimePoint deadline = runtime_.clock().After(request.timeout);
  // Host memory's collectives travel over Gloo among the group's sidecars (none with one node);
  // device memory's over NCCL, which needs no Gloo context.
  std::shared_ptr<GlooPairs> context;
  if (nodes > 1 && request.device == DeviceKind::kCpu) {
    StatusOr<std::shared_ptr<GlooPairs>> connected =
        gloo_.Connect(request.group, request.store, topology.my_node, nodes, request.timeout);
    if (!connected.ok()) return connected.status();
    context = *connected;
  }
  // Every group's agreement and point-to-point transfers go over connections of its own: its
  // dissemination peers from the start, others on first use. Gloo's pairs too are connected on
  // first use (GlooPairs), so forming a group waits on the control connections alone.
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - runtime_.clock().Now());
  StatusOr<MeshConnections> connections = ConnectSocketMesh(
      request.group, gloo_.advertise_host(), request.store, topology.my_node, nodes,
      std::max(left, std::chrono::milliseconds(1)), runtime_.clock(), request.cancel);
  if (!connections.ok()) return connections.status();
  StatusOr<std::shared_ptr<SocketMesh>> mesh =
      SocketMesh::Start(request.group, topology.my_node, std::move(*connections), runtime_);
  if (!mesh.ok()) return mesh.status();
  std::shared_ptr<MessageTransport> transfers;
  if (nodes > 1) transfers = *mesh;
  GroupTransport transport;
  transport.control = *mesh;
  transport.transfers = transfers;
  switch (request.device) {
    case DeviceKind::kCpu:
      transport.data = std::make_unique<GlooBackend>(context, topology.my_node, nodes, transfers);
      return transport;
    case DeviceKind::kCuda: {
#ifdef COLLECTIVED_WITH_NCCL
      StatusOr<std::unique_ptr<NcclBackend>> nccl = NcclBackend::Create(
          request.group, request.device_index, topology.my_node, nodes, transfers, *request.store,
          request.timeout, runtime_.executor(), runtime_.clock());
      if (!nccl.ok()) return nccl.status();
      transport.data = std::move(*nccl);
      return transport;
#else
      break;
#endif
    }
  }
  return Status::InvalidArgument("group '" + request.group +
                                 "': " + std::string(DeviceKindName(request.device)) +
                                 " groups are not served by this sidecar");
}

}  // namespace collectived
