#include "engine/group/sidecar_transport_factory.h"

#include "engine/group/gloo/gloo_backend.h"
#include "engine/group/gloo/gloo_control_channel.h"

namespace collectived {

SidecarTransportFactory::SidecarTransportFactory(std::string advertise_host)
    : gloo_(std::move(advertise_host)) {}

Status SidecarTransportFactory::CheckDevice(const std::string& group, DeviceKind device) const {
  if (device == DeviceKind::kCpu) return Status::Ok();
  return Status::InvalidArgument(
      "group '" + group + "': " +
      (device == DeviceKind::kCuda ? std::string("CUDA") : std::string(DeviceKindName(device))) +
      " groups are not served by this sidecar yet");
}

StatusOr<GroupTransport> SidecarTransportFactory::Connect(const ConnectRequest& request) {
  COLLECTIVED_RETURN_IF_ERROR(CheckDevice(request.group, request.device));
  const GroupTopology& topology = request.topology;
  switch (request.device) {
    case DeviceKind::kCpu: {
      std::shared_ptr<gloo::Context> context;
      if (topology.node_count() > 1) {
        StatusOr<std::shared_ptr<gloo::Context>> connected = gloo_.Connect(
            request.group, request.store, topology.my_node, topology.node_count(), request.timeout);
        if (!connected.ok()) return connected.status();
        context = *connected;
      }
      GroupTransport transport;
      transport.control =
          std::make_unique<GlooControlChannel>(context, topology.my_node, topology.node_count());
      transport.data =
          std::make_unique<GlooBackend>(context, topology.my_node, topology.node_count());
      return transport;
    }
    case DeviceKind::kCuda:
      break;
  }
  return Status::InvalidArgument("group '" + request.group +
                                 "': " + std::string(DeviceKindName(request.device)) +
                                 " groups are not served by this sidecar yet");
}

}  // namespace collectived
