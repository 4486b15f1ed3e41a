#include "services/collectived/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <initializer_list>

#include "engine/concurrency/clock.h"
#include "engine/cuda/gpu_inventory.h"
#include "engine/sidecar/sidecar.h"
#include "rpc/torch_names.h"
#include "services/collectived/version.h"

namespace collectived {
namespace {

// Log-spaced from 1 microsecond to 10 minutes (roughly half-decade steps).
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {1e-6, 3e-6, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3,  3e-3,  0.01, 0.03,
          0.1,  0.3,  1.0,  3.0,  10.0, 30.0, 100.0, 300.0, 600.0};
}

prometheus::MetricFamily GaugeFamily(const std::string& name, const std::string& help) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Gauge;
  return family;
}

void AddGauge(prometheus::MetricFamily& family, double value,
              std::initializer_list<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric metric;
  metric.label.assign(labels.begin(), labels.end());
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
}

}  // namespace

// Live state read at scrape time, so that gauges are never stale.
class Metrics::LiveCollector : public prometheus::Collectable {
 public:
  explicit LiveCollector(Metrics* owner) : owner_(owner) {}
  void Watch(Sidecar* sidecar) {
    std::lock_guard<std::mutex> lock(mutex_);
    sidecar_ = sidecar;
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (sidecar_ == nullptr) return {};
    auto sessions = GaugeFamily("collectived_sessions", "Live client sessions (trainers attached)");
    auto groups = GaugeFamily("collectived_groups", "Live groups on this sidecar");
    auto peers = GaugeFamily("collectived_peers", "Peer sidecars connected, summed over groups");
    auto shm =
        GaugeFamily("collectived_shm_registered_bytes", "Shared memory registered by sessions");
    auto inflight =
        GaugeFamily("collectived_inflight_ops", "Ops issued but not completed, by group");
    auto oldest = GaugeFamily("collectived_oldest_inflight_op_age_seconds",
                              "Age of the oldest in-flight op of each group (a hang signal)");
    size_t shm_bytes = 0;
    auto live_sessions = sidecar_->ListSessions();
    for (const auto& s : live_sessions) shm_bytes += s->RegisteredBytes();
    AddGauge(sessions, static_cast<double>(live_sessions.size()));
    AddGauge(shm, static_cast<double>(shm_bytes));
    auto live_groups = sidecar_->ListGroups();
    AddGauge(groups, static_cast<double>(live_groups.size()));
    double peer_count = 0;
    std::map<std::string, std::pair<double, double>> by_label;  // label -> (in flight, oldest age)
    const Clock::TimePoint now = sidecar_->runtime().clock().Now();
    for (const auto& group : live_groups) {
      peer_count += group->topology().node_count() - 1;
      std::string label;
      {
        std::lock_guard<std::mutex> owner_lock(owner_->mutex_);
        label = owner_->GroupLabel(group->name());
      }
      auto& entry = by_label[label];
      for (const InFlightOp& op : group->InFlight()) {
        entry.first += 1;
        entry.second =
            std::max(entry.second, std::chrono::duration<double>(now - op.first_arrival).count());
      }
    }
    AddGauge(peers, peer_count);
    for (const auto& [label, entry] : by_label) {
      AddGauge(inflight, entry.first, {{"group", label}, {"job_name", JobOfTorchGroupName(label)}});
      AddGauge(oldest, entry.second, {{"group", label}, {"job_name", JobOfTorchGroupName(label)}});
    }
    auto in_use = GaugeFamily("collectived_resource_in_use",
                              "What all sessions hold of each resource with a ceiling");
    auto limit = GaugeFamily("collectived_resource_limit",
                             "The sidecar-wide ceiling of each resource (--max-<resource>)");
    const ResourceLedger& ledger = sidecar_->resources();
    for (size_t i = 0; i < kResourceCount; ++i) {
      const Resource resource = static_cast<Resource>(i);
      const std::string name(ResourceName(resource));
      AddGauge(in_use, static_cast<double>(ledger.InUse(resource)), {{"resource", name}});
      AddGauge(limit, static_cast<double>(ledger.ceilings()[resource].total), {{"resource", name}});
    }
    return {sessions, groups, peers, shm, inflight, oldest, in_use, limit};
  }

 private:
  Metrics* const owner_;
  mutable std::mutex mutex_;
  Sidecar* sidecar_ = nullptr;
};

Metrics::Metrics(size_t max_groups, const std::string& tcp_security)
    : max_groups_(max_groups),
      registry_(std::make_shared<prometheus::Registry>()),
      live_(std::make_shared<LiveCollector>(this)),
      process_(std::make_shared<ProcessMetrics>()),
      ops_(prometheus::BuildCounter()
               .Name("collectived_ops_total")
               .Help("Ops finished on this sidecar, by group, op, status (ok, invalid, timeout, "
                     "peer_lost, aborted, desync, ...) and device (cpu, cuda)")
               .Register(*registry_)),
      bytes_(prometheus::BuildCounter()
                 .Name("collectived_bytes_total")
                 .Help("Bytes moved by completed ops (the op's size as nccl-tests counts it)")
                 .Register(*registry_)),
      bus_bytes_(prometheus::BuildCounter()
                     .Name("collectived_bus_bytes_total")
                     .Help("Bytes x nccl-tests bus factor of completed ops; rate() over "
                           "collectived_op_seconds_total gives bus bandwidth")
                     .Register(*registry_)),
      op_seconds_(prometheus::BuildCounter()
                      .Name("collectived_op_seconds_total")
                      .Help("Time spent in completed ops")
                      .Register(*registry_)),
      latency_(
          prometheus::BuildHistogram()
              .Name("collectived_op_latency_seconds")
              .Help(
                  "Op latency from the first local rank's issue to completion, by group, op, size "
                  "and device (cpu, cuda)")
              .Register(*registry_)),
      busbw_(prometheus::BuildGauge()
                 .Name("collectived_busbw_bytes_per_second")
                 .Help("Bus bandwidth of the last completed op of each kind (nccl-tests factors)")
                 .Register(*registry_)),
      skew_(prometheus::BuildHistogram()
                .Name("collectived_arrival_skew_seconds")
                .Help("Time between the first and the last rank arriving at an op")
                .Register(*registry_)),
      stragglers_(prometheus::BuildCounter()
                      .Name("collectived_straggler_total")
                      .Help("Ops at which this rank (hosted here) arrived last")
                      .Register(*registry_)),
      stuck_(prometheus::BuildCounter()
                 .Name("collectived_stuck_ops_total")
                 .Help("Ops in flight longer than the stuck threshold (counted once per op)")
                 .Register(*registry_)),
      backend_aborts_(
          prometheus::BuildCounter()
              .Name("collectived_backend_aborts_total")
              .Help("Data backends (NCCL communicators, Gloo connections) of a group aborted while "
                    "in use, by group, backend (nccl, gloo) and the status that caused it "
                    "(timeout, peer_lost, aborted, ...)")
              .Register(*registry_)),
      backend_errors_(prometheus::BuildCounter()
                          .Name("collectived_backend_errors_total")
                          .Help("Ops whose call into the data backend failed (a library error, "
                                "or a lost peer or timeout the library saw), by group, backend "
                                "(nccl, gloo) and status")
                          .Register(*registry_)),
      membership_changes_(prometheus::BuildCounter()
                              .Name("collectived_membership_changes_total")
                              .Help("Membership epochs a fault-tolerant group began here, by "
                                    "group and reason (rank_lost)")
                              .Register(*registry_)),
      peer_failures_(prometheus::BuildCounter()
                         .Name("collectived_peer_connection_failures_total")
                         .Help("Ops failed because a peer sidecar or rank was lost")
                         .Register(*registry_)
                         .Add({})),
      refused_(prometheus::BuildCounter()
                   .Name("collectived_refused_calls_total")
                   .Help("Calls refused by the trust checks, by gRPC method and code "
                         "(permission_denied: the caller may not do this; unauthenticated: it "
                         "presented no credential)")
                   .Register(*registry_)),
      resource_refusals_(prometheus::BuildCounter()
                             .Name("collectived_resource_refusals_total")
                             .Help("Requests refused because a ceiling of the sidecar was "
                                   "reached, by resource (the per-session share or the "
                                   "sidecar-wide total)")
                             .Register(*registry_)),
      listener_exhausted_(prometheus::BuildCounter()
                              .Name("collectived_listener_exhausted_total")
                              .Help("Times a listener stopped accepting connections for want of "
                                    "descriptors or memory (it rests and retries; health says "
                                    "NOT_SERVING meanwhile)")
                              .Register(*registry_)) {
  prometheus::BuildGauge()
      .Name("collectived_build_info")
      .Help(
          "Build information of this collectived: version, available backends, the NCCL version "
          "and the GPUs it sees, and the TCP listener's security")
      .Register(*registry_)
      .Add({{"version", kVersion},
            {"gloo", kGlooAvailable ? "true" : "false"},
            {"nccl", kNcclAvailable ? "true" : "false"},
            {"nccl_version", ProbeGpus().nccl_version},
            {"gpus", ProbeGpus().DeviceList()},
            {"tcp_security", tcp_security}})
      .Set(1);
}

Metrics::~Metrics() = default;

Status Metrics::Serve(const std::string& address) {
  StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(address, [this] { return Render(); });
  if (!server.ok()) return server.status();
  server_ = std::move(*server);
  return Status::Ok();
}

std::string Metrics::Render() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  for (const prometheus::Collectable* collectable :
       {static_cast<const prometheus::Collectable*>(live_.get()),
        static_cast<const prometheus::Collectable*>(process_.get())}) {
    std::vector<prometheus::MetricFamily> more = collectable->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

void Metrics::Watch(Sidecar* sidecar) {
  live_->Watch(sidecar);
}

int Metrics::port() const {
  return server_ ? server_->port() : 0;
}

std::string Metrics::StatusLabel(ErrorKind kind) {
  if (kind == ErrorKind::kInvalidArgument) return "invalid";
  return std::string(ErrorKindName(kind));
}

std::string Metrics::SizeBucket(uint64_t bytes) {
  static constexpr const char* kNames[] = {"<=1KiB", "<=64KiB", "<=1MiB", "<=16MiB", ">16MiB"};
  return kNames[SizeBucketIndex(bytes)];
}

int Metrics::SizeBucketIndex(uint64_t bytes) {
  if (bytes <= 1024) return 0;
  if (bytes <= 64 * 1024) return 1;
  if (bytes <= 1024 * 1024) return 2;
  if (bytes <= 16 * 1024 * 1024) return 3;
  return 4;
}

const std::string& Metrics::GroupLabel(const std::string& group) {
  static const std::string kOther = "_other";
  // A group created again under a departed name is live again.
  if (auto d = std::find(departed_.begin(), departed_.end(), group); d != departed_.end())
    departed_.erase(d);
  auto it = group_labels_.find(group);
  if (it != group_labels_.end()) return it->second;
  if (group_labels_.size() >= max_groups_) {
    if (departed_.empty()) return kOther;
    std::string evicted = departed_.front();
    departed_.pop_front();
    auto removers = removers_.find(evicted);
    if (removers != removers_.end()) {
      for (auto& remove : removers->second) remove();
      removers_.erase(removers);
    }
    op_series_.erase(evicted);
    stragglers_of_.erase(evicted);
    group_labels_.erase(evicted);
  }
  return group_labels_.emplace(group, group).first->second;
}

template <typename Metric, typename... Args>
Metric& Metrics::SeriesFor(prometheus::Family<Metric>& family, const std::string& group,
                           prometheus::Labels labels, Args&&... args) {
  std::string key = std::to_string(reinterpret_cast<uintptr_t>(&family));
  for (const auto& [k, v] : labels) key += "\x1f" + k + "=" + v;
  auto it = cache_.find(key);
  if (it != cache_.end()) return *static_cast<Metric*>(it->second);
  // job_name is a function of the group label (already in the key): worked out only when the
  // series is created, not on every op.
  labels.emplace("job_name", JobOfTorchGroupName(group));
  Metric& metric = family.Add(labels, std::forward<Args>(args)...);
  cache_.emplace(key, &metric);
  removers_[group].push_back([this, &family, &metric, key] {
    cache_.erase(key);
    family.Remove(&metric);
  });
  return metric;
}

prometheus::Counter& Metrics::CounterFor(prometheus::Family<prometheus::Counter>& family,
                                         const std::string& group, prometheus::Labels labels) {
  return SeriesFor(family, group, labels);
}

prometheus::Histogram& Metrics::HistogramFor(prometheus::Family<prometheus::Histogram>& family,
                                             const std::string& group, prometheus::Labels labels) {
  return SeriesFor(family, group, labels, LatencyBuckets());
}

Metrics::OpSeries& Metrics::OpSeriesFor(const std::string& group, const OpRecord& record) {
  const uint64_t shape = (static_cast<uint64_t>(record.kind) << 40) |
                         (static_cast<uint64_t>(record.status.kind()) << 32) |
                         (static_cast<uint64_t>(record.device) << 24) |
                         (static_cast<uint64_t>(static_cast<uint32_t>(record.dtype)) << 8) |
                         static_cast<uint64_t>(SizeBucketIndex(record.bytes));
  return op_series_[group][shape];
}

void Metrics::OnOpFinished(const OpRecord& record) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string& group = GroupLabel(record.group);
  OpSeries& series = OpSeriesFor(group, record);
  const auto op = [&record] { return std::string(OpKindName(record.kind)); };
  if (series.ops == nullptr) {
    series.ops = &CounterFor(ops_, group,
                             {{"group", group},
                              {"op", op()},
                              {"status", StatusLabel(record.status.kind())},
                              {"device", std::string(DeviceKindName(record.device))}});
  }
  series.ops->Increment();
  if (record.status.kind() == ErrorKind::kPeerLost) peer_failures_.Increment();
  if (!record.status.ok()) return;
  const double seconds = record.duration.count() / 1e6;
  if (series.bytes == nullptr) {
    series.bytes = &CounterFor(
        bytes_, group,
        {{"group", group}, {"op", op()}, {"dtype", std::string(DTypeName(record.dtype))}});
    series.bus_bytes = &CounterFor(bus_bytes_, group, {{"group", group}, {"op", op()}});
    series.op_seconds = &CounterFor(op_seconds_, group, {{"group", group}, {"op", op()}});
    series.latency = &HistogramFor(latency_, group,
                                   {{"group", group},
                                    {"op", op()},
                                    {"size", SizeBucket(record.bytes)},
                                    {"device", std::string(DeviceKindName(record.device))}});
  }
  series.bytes->Increment(static_cast<double>(record.bytes));
  series.bus_bytes->Increment(static_cast<double>(record.bytes) * record.bus_factor);
  series.op_seconds->Increment(seconds);
  series.latency->Observe(seconds);
  if (record.bytes > 0 && seconds > 0) {
    if (series.busbw == nullptr) series.busbw = &busbw_.Add({{"op", op()}});
    series.busbw->Set(static_cast<double>(record.bytes) * record.bus_factor / seconds);
  }
  if (record.group_size > 1 && record.sequence_number > 0 && record.last_rank >= 0) {
    if (series.skew == nullptr) {
      series.skew = &HistogramFor(skew_, group, {{"group", group}, {"op", op()}});
    }
    series.skew->Observe(record.skew.count() / 1e6);
    if (record.last_rank_is_local && record.skew.count() > 0) {
      prometheus::Counter*& straggler = stragglers_of_[group][record.last_rank];
      if (straggler == nullptr) {
        straggler = &CounterFor(stragglers_, group,
                                {{"group", group}, {"rank", std::to_string(record.last_rank)}});
      }
      straggler->Increment();
    }
  }
}

void Metrics::OnOpStuck(const OpRecord& record) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string group = GroupLabel(record.group);
  CounterFor(stuck_, group, {{"group", group}}).Increment();
}

std::string Metrics::BackendLabel(DeviceKind device) {
  return device == DeviceKind::kCuda ? "nccl" : "gloo";
}

void Metrics::OnBackendAborted(const std::string& group, DeviceKind device, ErrorKind reason) {
  CountBackendEvent(backend_aborts_, group, device, "reason", reason);
}

void Metrics::OnBackendError(const std::string& group, DeviceKind device, ErrorKind kind) {
  CountBackendEvent(backend_errors_, group, device, "status", kind);
}

void Metrics::OnMembershipChange(const std::string& group, int epoch, const std::string& reason) {
  (void)epoch;
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string label = GroupLabel(group);
  CounterFor(membership_changes_, label, {{"group", label}, {"reason", reason}}).Increment();
}

void Metrics::CountBackendEvent(prometheus::Family<prometheus::Counter>& family,
                                const std::string& group, DeviceKind device,
                                const std::string& kind_label, ErrorKind kind) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string label = GroupLabel(group);
  CounterFor(family, label,
             {{"group", label}, {"backend", BackendLabel(device)}, {kind_label, StatusLabel(kind)}})
      .Increment();
}

void Metrics::CountRefusedCall(std::string_view method, ErrorKind kind) {
  if (kind != ErrorKind::kPermissionDenied && kind != ErrorKind::kUnauthenticated) return;
  // Family::Add returns the existing series for labels already seen; it locks on its own.
  refused_.Add({{"method", std::string(method)}, {"code", std::string(ErrorKindName(kind))}})
      .Increment();
}

void Metrics::CountResourceRefusal(std::string_view resource) {
  resource_refusals_.Add({{"resource", std::string(resource)}}).Increment();
}

void Metrics::CountListenerExhaustion(std::string_view listener) {
  listener_exhausted_.Add({{"listener", std::string(listener)}}).Increment();
}

void Metrics::OnGroupGone(const std::string& group) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (group_labels_.count(group) == 0) return;  // aggregated under _other: those series stay
  if (std::find(departed_.begin(), departed_.end(), group) == departed_.end())
    departed_.push_back(group);
}

}  // namespace collectived
