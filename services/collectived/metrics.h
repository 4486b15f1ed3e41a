// The daemon's Prometheus metrics (prometheus-cpp) on /metrics: every family is prefixed
// collectived_. Ops are counted by an OpObserver the engine calls for every finished or stuck
// op; live state (sessions, groups, in-flight ops and their age) is read at scrape time.
//
// Label cardinality is bounded: labels are group, op, dtype, a size bucket, status, (for
// stragglers) a group rank of this sidecar and (for refused calls) a gRPC method name and a
// code — never sequence numbers, timestamps, sizes, peers or anything a caller sent. At most
// `max_groups` distinct groups are labelled at once. A group that leaves this sidecar keeps its
// series (so a scrape after a short job still sees it) until its slot is needed by a new group,
// oldest departed first; when every slot holds a live group, new groups are aggregated under
// group="_other".
//
// Every series labelled by group also carries job_name, the job part of a group named
// `<job>-pg<index>-<hex>` (the torch backend's names) and empty otherwise: a function of the
// group label, so it adds no series. (Not "job": Prometheus keeps that for the scrape job.)
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

#include "engine/group/core/flight_recorder.h"
#include "engine/vocabulary/status.h"
#include "services/collectived/metrics_http_server.h"
#include "services/collectived/process_metrics.h"

namespace collectived {

class Sidecar;

class Metrics : public OpObserver {
 public:
  // `tcp_security` labels collectived_build_info (TcpSecurityMode in config.h).
  explicit Metrics(size_t max_groups = 64, const std::string& tcp_security = "");
  ~Metrics() override;

  // Starts serving /metrics on `address` (HOST:PORT). Returns Unavailable if it cannot bind.
  // The server stops with this object, at once.
  Status Serve(const std::string& address);
  // Makes live gauges (sessions, groups, in-flight ops) read from `sidecar` at scrape time.
  void Watch(Sidecar* sidecar);
  prometheus::Registry& registry() { return *registry_; }
  // The bound port (useful with port 0), or 0 when not serving.
  int port() const;

  // The page a scrape gets: every family in the text format.
  std::string Render() const;

  void OnOpFinished(const OpRecord& record) override;
  void OnOpStuck(const OpRecord& record) override;
  void OnGroupGone(const std::string& group) override;
  void OnBackendAborted(const std::string& group, DeviceKind device, ErrorKind reason) override;
  void OnBackendError(const std::string& group, DeviceKind device, ErrorKind kind) override;
  void OnMembershipChange(const std::string& group, int epoch, const std::string& reason) override;

  // The data backend of a group on `device`: "gloo" (cpu) or "nccl" (cuda).
  static std::string BackendLabel(DeviceKind device);

  // Counts a call refused for want of a credential (`kind` kUnauthenticated) or because the
  // caller may not do it (kPermissionDenied) in collectived_refused_calls_total{method, code}.
  // `method` must be a constant of the code, the gRPC service and method ("Admin.AbortGroup",
  // "Collectives.Run", "Session.Attach" for submissions on the session stream, "Store.Set"),
  // never text from a request, so the label stays a small fixed set. Other kinds are not
  // refusals and are ignored.
  void CountRefusedCall(std::string_view method, ErrorKind kind);
  // Counts a request refused at a resource ceiling in
  // collectived_resource_refusals_total{resource}. `resource` is a constant of the code
  // ("descriptors", "mapped_bytes", "groups", "doorbells", ...), never text from a request.
  void CountResourceRefusal(std::string_view resource);
  // Counts a listener ("unix", "fd_channel") that stopped accepting for want of descriptors or
  // memory, in collectived_listener_exhausted_total{listener}.
  void CountListenerExhaustion(std::string_view listener);

  // The status label of an error kind: ok, invalid, timeout, peer_lost, aborted, desync, ...
  static std::string StatusLabel(ErrorKind kind);
  // The size bucket label of an op of `bytes` bytes: "<=1KiB", "<=64KiB", "<=1MiB", "<=16MiB",
  // ">16MiB".
  static std::string SizeBucket(uint64_t bytes);
  // Its index, 0 to 4, in that order.
  static int SizeBucketIndex(uint64_t bytes);

 private:
  class LiveCollector;

  // The label standing for `group` (itself, or "_other" beyond max_groups). Requires mutex_.
  const std::string& GroupLabel(const std::string& group);
  // The series of `family` with `labels`, created once and cached; removed with its group.
  template <typename Metric, typename... Args>
  Metric& SeriesFor(prometheus::Family<Metric>& family, const std::string& group,
                    prometheus::Labels labels, Args&&... args);
  prometheus::Counter& CounterFor(prometheus::Family<prometheus::Counter>& family,
                                  const std::string& group, prometheus::Labels labels);
  // Counts one backend abort or error of `group` in `family`, labelled kind_label=kind.
  void CountBackendEvent(prometheus::Family<prometheus::Counter>& family, const std::string& group,
                         DeviceKind device, const std::string& kind_label, ErrorKind kind);
  prometheus::Histogram& HistogramFor(prometheus::Family<prometheus::Histogram>& family,
                                      const std::string& group, prometheus::Labels labels);

  // The series a finished op of one shape updates, found once per group label and shape (op,
  // status, device, dtype, size bucket) and then reused: an op costs two lookups, not a dozen
  // label maps (they were most of the sidecar's CPU per small op). Null until first needed, so
  // that a scrape shows the same series as when each op built its own.
  struct OpSeries {
    prometheus::Counter* ops = nullptr;
    prometheus::Counter* bytes = nullptr;
    prometheus::Counter* bus_bytes = nullptr;
    prometheus::Counter* op_seconds = nullptr;
    prometheus::Histogram* latency = nullptr;
    prometheus::Gauge* busbw = nullptr;
    prometheus::Histogram* skew = nullptr;
  };
  // The series of `record`'s shape under group label `group` (from GroupLabel). Requires mutex_.
  OpSeries& OpSeriesFor(const std::string& group, const OpRecord& record);

  const size_t max_groups_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<LiveCollector> live_;
  std::shared_ptr<ProcessMetrics> process_;
  std::unique_ptr<MetricsHttpServer> server_;  // after what it renders: stopped first

  prometheus::Family<prometheus::Counter>& ops_;
  prometheus::Family<prometheus::Counter>& bytes_;
  prometheus::Family<prometheus::Counter>& bus_bytes_;
  prometheus::Family<prometheus::Counter>& op_seconds_;
  prometheus::Family<prometheus::Histogram>& latency_;
  prometheus::Family<prometheus::Gauge>& busbw_;
  prometheus::Family<prometheus::Histogram>& skew_;
  prometheus::Family<prometheus::Counter>& stragglers_;
  prometheus::Family<prometheus::Counter>& stuck_;
  prometheus::Family<prometheus::Counter>& backend_aborts_;
  prometheus::Family<prometheus::Counter>& backend_errors_;
  prometheus::Family<prometheus::Counter>& membership_changes_;
  prometheus::Counter& peer_failures_;
  prometheus::Family<prometheus::Counter>& refused_;
  prometheus::Family<prometheus::Counter>& resource_refusals_;
  prometheus::Family<prometheus::Counter>& listener_exhausted_;

  std::mutex mutex_;
  std::map<std::string, std::string> group_labels_;  // group -> label, for labelled groups
  std::deque<std::string> departed_;                 // labelled groups that left, oldest first
  // Series created per group label, so they can be removed when the group leaves.
  std::map<std::string, std::vector<std::function<void()>>> removers_;
  std::unordered_map<std::string, void*> cache_;  // family|labels -> metric
  // group label -> op shape -> its series; a group's entry goes with its series (removers_).
  std::unordered_map<std::string, std::unordered_map<uint64_t, OpSeries>> op_series_;
  // group label -> rank -> its stragglers counter, likewise.
  std::unordered_map<std::string, std::unordered_map<int, prometheus::Counter*>> stragglers_of_;
};

}  // namespace collectived
