// SidecarTransportFactory: the sidecar's choice of transport for a group, by device kind — the
// one place where a data backend is picked. Every group's sidecars are connected by a SocketMesh
// (its agreement on each op and its point-to-point transfers). Host memory (kCpu) moves its
// collectives through a GlooBackend over one Gloo context among the group's sidecars; device
// memory (kCuda) through an NcclBackend on the group's GPU (with the GPU backend built and a GPU
// visible; otherwise the group is refused before its rendezvous, with the reason), which builds
// no Gloo context at all.
//
// Thread-safety: as TransportFactory.
#pragma once

#include <string>

#include "engine/concurrency/runtime.h"
#include "engine/group/transport/gloo/gloo_connector.h"
#include "engine/group/transport/transport_factory.h"

namespace collectived {

class SidecarTransportFactory final : public TransportFactory {
 public:
  // Gloo and the meshes listen on `advertise_host` and announce it to the peers; the transports
  // run on `runtime` (the meshes on its reactor), which must outlive every one made here.
  SidecarTransportFactory(std::string advertise_host, Runtime& runtime);

  Status CheckDevice(const std::string& group, DeviceKind device) const override;
  StatusOr<GroupTransport> Connect(const ConnectRequest& request) override;

 private:
  GlooConnector gloo_;  // also the advertised host, for the meshes' listeners
  Runtime& runtime_;
};

}  // namespace collectived
