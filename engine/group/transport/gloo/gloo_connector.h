// GlooConnector: gives the sidecars of one group a Gloo context over the TCP transport whose
// pairs are connected on first use (GlooPairs; rendezvous through the group's store), so forming
// a group opens no Gloo connection. One TCP device, listening on the advertised host, serves
// every group of the sidecar.
//
// Thread-safety: Connect may be called from several threads at once.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "engine/concurrency/clock.h"
#include "engine/group/transport/gloo/gloo_pairs.h"
#include "engine/store/store.h"
#include "engine/vocabulary/status.h"

namespace gloo::transport {
class Device;
}  // namespace gloo::transport

namespace collectived {

class GlooConnector {
 public:
  // The contexts' deadlines (a pair's wait for its peer's address) read `clock`, which must
  // outlive the connector and its contexts.
  explicit GlooConnector(std::string advertise_host, Clock& clock = Clock::Real());
  ~GlooConnector();

  // The context of node `node_rank` of `node_count` (>= 2) in group `group`, with no pair
  // connected yet: GlooBackend connects the pairs each Gloo call uses, meeting the peers through
  // `store` (scoped to this incarnation of the group; kept alive by the context). `timeout`
  // bounds a pair's wait for its peer to connect. Returns at once, without waiting for any
  // peer; Unavailable (with Gloo's reason) when the TCP device or the context cannot be
  // created.
  StatusOr<std::shared_ptr<GlooPairs>> Connect(const std::string& group,
                                               std::shared_ptr<Store> store, int node_rank,
                                               int node_count, std::chrono::milliseconds timeout);

  // The host this sidecar's connections listen on.
  const std::string& advertise_host() const { return advertise_host_; }

 private:
  const std::string advertise_host_;
  Clock& clock_;
  std::mutex mutex_;
  std::shared_ptr<gloo::transport::Device> device_;  // guarded by mutex_; created on first use
};

}  // namespace collectived
