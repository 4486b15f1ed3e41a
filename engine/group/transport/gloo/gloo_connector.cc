#include "engine/group/transport/gloo/gloo_connector.h"

#include <gloo/transport/tcp/device.h>

#include <exception>
#include <utility>

#include "engine/group/transport/gloo/gloo_peer_name_guard.h"

namespace collectived {

GlooConnector::GlooConnector(std::string advertise_host, Clock& clock)
    : advertise_host_(std::move(advertise_host)), clock_(clock) {
  LinkGlooPeerNameGuard();
}

GlooConnector::~GlooConnector() = default;

StatusOr<std::shared_ptr<GlooPairs>> GlooConnector::Connect(const std::string& group,
                                                            std::shared_ptr<Store> store,
                                                            int node_rank, int node_count,
                                                            std::chrono::milliseconds timeout) {
  std::shared_ptr<gloo::transport::Device> device;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!device_) {
      gloo::transport::tcp::attr attr;
      attr.hostname = advertise_host_;
      device_ = gloo::transport::tcp::CreateDevice(attr);
    }
    device = device_;
  } catch (const std::exception& error) {
    return Status::Unavailable("cannot connect the sidecars of group '" + group +
                               "': Gloo's TCP device: " + error.what());
  }
  return GlooPairs::Create(group, node_rank, node_count, std::move(device), std::move(store),
                           timeout, clock_);
}

}  // namespace collectived
