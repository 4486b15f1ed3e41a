#include "engine/group/gloo/gloo_connector.h"

#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <vector>

#include "engine/group/gloo/gloo_peer_name_guard.h"
#include "engine/group/gloo/gloo_rendezvous_store.h"
#include "engine/logging.h"
#include "engine/store/prefix_store.h"

namespace collectived {

GlooConnector::GlooConnector(std::string advertise_host)
    : advertise_host_(std::move(advertise_host)) {
  LinkGlooPeerNameGuard();
}

GlooConnector::~GlooConnector() = default;

namespace {

using Clock = std::chrono::steady_clock;

// Building the mesh, a pair's connection is now and then reset (seen under heavy group churn:
// "Connection reset by peer"). Every sidecar of the group then builds it again under fresh keys:
// all of them, since one whose own pairs connected must not keep a mesh the others rebuild.
constexpr int kConnectAttempts = 3;

std::chrono::milliseconds Left(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

}  // namespace

StatusOr<std::shared_ptr<gloo::Context>> GlooConnector::Connect(const std::string& group,
                                                                std::shared_ptr<Store> store,
                                                                int node_rank, int node_count,
                                                                std::chrono::milliseconds timeout) {
  const Clock::time_point deadline = Clock::now() + timeout;
  std::vector<std::string> outcome_keys;
  for (int node = 0; node < node_count; ++node) {
    outcome_keys.push_back("outcome/" + std::to_string(node));
  }
  Status failed;
  for (int attempt = 1; attempt <= kConnectAttempts; ++attempt) {
    auto attempt_store = std::make_shared<PrefixStore>("attempt" + std::to_string(attempt), store);
    StatusOr<std::shared_ptr<gloo::Context>> context =
        ConnectOnce(group, attempt_store, node_rank, node_count, Left(deadline));
    // Every sidecar tells how its attempt went; all of them retry if any failed.
    Status told = attempt_store->Set(outcome_keys[node_rank], context.ok() ? "ok" : "failed");
    if (!told.ok())
      return context.ok() ? told.WithContext("connecting group '" + group + "'") : context.status();
    StatusOr<std::vector<std::string>> outcomes =
        attempt_store->MultiGet(outcome_keys, Left(deadline));
    if (!outcomes.ok()) {
      // A sidecar that never reports is gone or stuck: no retry helps.
      return context.ok() ? Status::Unavailable("cannot connect the sidecars of group '" + group +
                                                "': " + outcomes.status().message())
                          : context.status();
    }
    if (std::all_of(outcomes->begin(), outcomes->end(),
                    [](const std::string& outcome) { return outcome == "ok"; })) {
      return context;
    }
    failed = context.ok() ? Status::Unavailable("cannot connect the sidecars of group '" + group +
                                                "': a peer sidecar failed to connect")
                          : context.status();
    LogWarning("building the Gloo mesh failed", {{"group", group},
                                                 {"attempt", std::to_string(attempt)},
                                                 {"of", std::to_string(kConnectAttempts)},
                                                 {"error", failed.message()}});
  }
  return failed;
}

StatusOr<std::shared_ptr<gloo::Context>> GlooConnector::ConnectOnce(
    const std::string& group, std::shared_ptr<Store> store, int node_rank, int node_count,
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
