// The daemon's Prometheus registry and its /metrics endpoint (prometheus-cpp). Every metric is
// prefixed collectived_; later subsystems register their families on registry().
#pragma once

#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "engine/status.h"

namespace collectived {

class Metrics {
 public:
  Metrics();
  // Starts serving /metrics on `address` (HOST:PORT). Returns Unavailable if it cannot bind.
  Status Serve(const std::string& address);
  prometheus::Registry& registry() { return *registry_; }
  // The bound port (useful with port 0), or 0 when not serving.
  int port() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
};

}  // namespace collectived
