// ProcessMetrics: the sidecar process's own resources at scrape time, in the names Prometheus's
// client libraries use (process_resident_memory_bytes, process_open_fds, ...), so that the
// dashboards and alerts written for any exporter work on it unchanged. Read from /proc/self.
#pragma once

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <vector>

namespace collectived {

class ProcessMetrics : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace collectived
