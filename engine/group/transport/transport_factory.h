// TransportFactory: builds the node-level connections of one group — its control channel and its
// data backend — once the rendezvous has told every sidecar the group's topology.
//
// The sidecar's factory (SidecarTransportFactory) is the one place where a data backend is
// chosen, per group and device kind; tests plug in an in-process one (InProcessFabric).
//
// Thread-safety: Connect may be called from several threads at once (groups form concurrently).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "engine/concurrency/cancel_token.h"
#include "engine/group/core/topology.h"
#include "engine/group/transport/control_channel.h"
#include "engine/group/transport/data_backend.h"
#include "engine/group/transport/message_transport.h"
#include "engine/store/store.h"
#include "engine/vocabulary/status.h"
#include "engine/vocabulary/tensor.h"

namespace collectived {

struct GroupTransport {
  // Shared: the control channel may also carry the data backend's point-to-point transfers.
  std::shared_ptr<ControlChannel> control;
  std::unique_ptr<DataBackend> data;
  // The sidecars' point-to-point transfers of host memory (null with one node): what the data
  // backend's transfers go through once staged, and the announcements of sends directly.
  std::shared_ptr<MessageTransport> transfers;
};

struct ConnectRequest {
  std::string group;  // for messages
  DeviceKind device = DeviceKind::kCpu;
  GroupTopology topology;
  // Where this incarnation of the group's sidecars meet to connect (already scoped to it).
  std::shared_ptr<Store> store;
  std::chrono::milliseconds timeout{0};
  int device_index = 0;  // the GPU this sidecar's part of the group uses (kCuda)
  // Once cancelled (the sidecar stops), Connect returns its reason instead of waiting for peers
  // until the timeout. Null: never.
  std::shared_ptr<CancelToken> cancel = nullptr;
};

class TransportFactory {
 public:
  virtual ~TransportFactory() = default;
  // OK when groups on `device` memory can be served; otherwise InvalidArgument naming `group`
  // and the device kind. Checked before the rendezvous, so a refused group fails at once.
  virtual Status CheckDevice(const std::string& group, DeviceKind device) const = 0;
  // Blocks until every sidecar of the group is connected, or `request.timeout` passes. Returns
  // InvalidArgument for a device kind this sidecar does not serve, Unavailable when the peers
  // cannot be reached.
  virtual StatusOr<GroupTransport> Connect(const ConnectRequest& request) = 0;
};

}  // namespace collectived
