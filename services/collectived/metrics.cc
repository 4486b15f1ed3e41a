#include "services/collectived/metrics.h"

#include <prometheus/gauge.h>

#include "services/collectived/version.h"

namespace collectived {

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {
  prometheus::BuildGauge()
      .Name("collectived_build_info")
      .Help("Build information of this collectived: version and available backends")
      .Register(*registry_)
      .Add({{"version", kVersion},
            {"gloo", kGlooAvailable ? "true" : "false"},
            {"nccl", kNcclAvailable ? "true" : "false"}})
      .Set(1);
}

Status Metrics::Serve(const std::string& address) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(address);
  } catch (const std::exception& error) {
    return Status::Unavailable("cannot serve metrics on " + address + ": " + error.what());
  }
  exposer_->RegisterCollectable(registry_);
  return Status::Ok();
}

int Metrics::port() const {
  if (!exposer_) return 0;
  auto ports = exposer_->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

}  // namespace collectived
