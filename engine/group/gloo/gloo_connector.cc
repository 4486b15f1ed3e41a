#include "engine/group/gloo/gloo_connector.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "engine/group/gloo/gloo_peer_name_guard.h"
#include "engine/group/gloo/gloo_rendezvous_store.h"

namespace collectived {

GlooConnector::GlooConnector(std::string advertise_host)
    : advertise_host_(std::move(advertise_host)) {
  LinkGlooPeerNameGuard();
}

GlooConnector::~GlooConnector() = default;

StatusOr<std::shared_ptr<gloo::Context>> GlooConnector::Connect(const std::string& group,
                                                                std::shared_ptr<Store> store,
                                                                int node_rank, int node_count,
                                                                std::chrono::milliseconds timeout) {
  try {
    std::shared_ptr<gloo::transport::Device> device;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!device_) {
        gloo::transport::tcp::attr attr;
        attr.hostname = advertise_host_;
        device_ = gloo::transport::tcp::CreateDevice(attr);
      }
      device = device_;
    }
    auto context = std::make_shared<gloo::rendezvous::Context>(node_rank, node_count);
    context->setTimeout(timeout);
    // Peers' records are read in batches (one MultiGet each), not key by key.
    GlooRendezvousStore gloo_store(
        std::move(store), timeout,
        GlooRendezvousStore::ConnectFullMeshReads(node_rank, node_count));
    context->connectFullMesh(gloo_store, device);
    return std::shared_ptr<gloo::Context>(context);
  } catch (const std::exception& error) {
    return Status::Unavailable("cannot connect the sidecars of group '" + group +
                               "': " + error.what());
  }
}

}  // namespace collectived
