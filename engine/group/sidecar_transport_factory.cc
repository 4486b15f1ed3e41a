#include "engine/group/sidecar_transport_factory.h"

#include <algorithm>
#include <chrono>

#include "engine/cuda/gpu_inventory.h"
#include "engine/group/gloo/gloo_backend.h"
#include "engine/group/gloo/gloo_control_channel.h"
#include "engine/group/socket_control_channel.h"
#ifdef COLLECTIVED_WITH_NCCL
#include "engine/group/nccl/nccl_backend.h"
#endif

namespace collectived {
namespace {

constexpr std::chrono::milliseconds kControlConnectFloor{10000};

}  // namespace

SidecarTransportFactory::SidecarTransportFactory(std::string advertise_host)
    : gloo_(std::move(advertise_host)) {}

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
  // Host memory's data and the host-staged point-to-point transfers of CUDA groups travel over
  // Gloo among the group's sidecars (none with one node); every group's control messages over
  // connections of their own (SocketControlChannel: no I/O thread between them and the
  // executor).
  const auto deadline = std::chrono::steady_clock::now() + request.timeout;
  std::shared_ptr<gloo::Context> context;
  GroupTransport transport;
  if (topology.node_count() > 1) {
    StatusOr<std::shared_ptr<gloo::Context>> connected = gloo_.Connect(
        request.group, request.store, topology.my_node, topology.node_count(), request.timeout);
    if (!connected.ok()) return connected.status();
    context = *connected;
    // Every sidecar got through Gloo's mesh, so all of them are there: the control mesh gets
    // at least kControlConnectFloor even when the group's timeout is nearly spent (a short
    // timeout on a loaded machine must not fail a group whose sidecars are all present).
    const auto left =
        std::max(kControlConnectFloor, std::chrono::duration_cast<std::chrono::milliseconds>(
                                           deadline - std::chrono::steady_clock::now()));
    StatusOr<std::unique_ptr<SocketControlChannel>> control =
        SocketControlChannel::Connect(request.group, gloo_.advertise_host(), *request.store,
                                      topology.my_node, topology.node_count(), left);
    if (!control.ok()) return control.status();
    transport.control = std::move(*control);
  } else {
    transport.control =
        std::make_unique<GlooControlChannel>(context, topology.my_node, topology.node_count());
  }
  switch (request.device) {
    case DeviceKind::kCpu:
      transport.data =
          std::make_unique<GlooBackend>(context, topology.my_node, topology.node_count());
      return transport;
    case DeviceKind::kCuda: {
#ifdef COLLECTIVED_WITH_NCCL
      StatusOr<std::unique_ptr<NcclBackend>> nccl =
          NcclBackend::Create(request.group, request.device_index, topology.my_node,
                              topology.node_count(), context, *request.store, request.timeout);
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
