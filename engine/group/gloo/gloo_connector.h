// GlooConnector: connects the sidecars of one group with a Gloo context over the TCP transport
// (a full mesh, rendezvous through the group's store). One TCP device, listening on the
// advertised host, serves every group of the sidecar.
//
// Thread-safety: Connect may be called from several threads at once.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "engine/status.h"
#include "engine/store/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}
}  // namespace gloo

namespace collectived {

class GlooConnector {
 public:
  explicit GlooConnector(std::string advertise_host);
  ~GlooConnector();

  // Connects node `node_rank` of `node_count` through `store`. When a pair fails to connect on
  // any sidecar, every sidecar of the group builds the mesh again under fresh keys (at most 3
  // attempts in all; see the .cc). Returns Unavailable (with Gloo's reason) when the mesh
  // cannot be built within `timeout`.
  StatusOr<std::shared_ptr<gloo::Context>> Connect(const std::string& group,
                                                   std::shared_ptr<Store> store, int node_rank,
                                                   int node_count,
                                                   std::chrono::milliseconds timeout);

  // The host this sidecar's connections listen on.
  const std::string& advertise_host() const { return advertise_host_; }

 private:
  // One attempt: the full mesh through `store`.
  StatusOr<std::shared_ptr<gloo::Context>> ConnectOnce(const std::string& group,
                                                       std::shared_ptr<Store> store, int node_rank,
                                                       int node_count,
                                                       std::chrono::milliseconds timeout);

  const std::string advertise_host_;
  std::mutex mutex_;
  std::shared_ptr<gloo::transport::Device> device_;  // guarded by mutex_; created on first use
};

}  // namespace collectived
