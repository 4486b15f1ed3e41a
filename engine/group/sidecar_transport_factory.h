// SidecarTransportFactory: the sidecar's choice of transport for a group, by device kind — the
// one place where a data backend is picked. Host memory (kCpu) gets a GlooBackend over one Gloo
// context among the group's sidecars; device memory (kCuda) gets an NcclBackend on the group's
// GPU (with the GPU backend built and a GPU visible; otherwise the group is refused before its
// rendezvous, with the reason). Either way a group of several sidecars agrees on its ops over a
// SocketControlChannel (one of a single sidecar over the trivial GlooControlChannel).
//
// Thread-safety: as TransportFactory.
#pragma once

#include <string>

#include "engine/group/gloo/gloo_connector.h"
#include "engine/group/transport_factory.h"

namespace collectived {

class SidecarTransportFactory final : public TransportFactory {
 public:
  // Gloo and the control channel listen on `advertise_host` and announce it to the peers.
  explicit SidecarTransportFactory(std::string advertise_host);

  Status CheckDevice(const std::string& group, DeviceKind device) const override;
  StatusOr<GroupTransport> Connect(const ConnectRequest& request) override;

 private:
  GlooConnector gloo_;  // also the advertised host, for the control channel's listener
};

}  // namespace collectived
