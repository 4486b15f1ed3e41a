#include "services/collectived/admin_service.h"

#include <map>
#include <set>

#include "engine/cuda/gpu_inventory.h"
#include "engine/vocabulary/logging.h"
#include "rpc/caller.h"
#include "rpc/grpc_status.h"
#include "services/collectived/translate.h"
#include "services/collectived/version.h"

namespace collectived {

namespace {

void FillSummary(const Group& group, v1::GroupSummary* summary) {
  const GroupTopology& topology = group.topology();
  const GroupSpec& spec = group.spec();
  summary->set_name(group.name());
  // A shrinking group's later epochs are Groups of its live ranks: shown in the group's numbering.
  summary->set_group_size(spec.GroupSize());
  for (int member : spec.group_members.empty() ? spec.members : spec.group_members) {
    summary->add_members(member);
  }
  for (int rank : topology.local_ranks()) summary->add_local_group_ranks(spec.GroupRankOf(rank));
  summary->set_epoch(spec.epoch);
  for (int rank : spec.LostGroupRanks()) summary->add_lost_group_ranks(rank);
  summary->set_sequence_number(group.SequenceNumber());
  summary->set_in_flight(static_cast<int32_t>(group.InFlight().size()));
  summary->set_device_type(v1::CPU);
  Status failure = group.failure();
  summary->set_state(failure.ok()                            ? "ready"
                     : failure.kind() == ErrorKind::kAborted ? "aborted"
                                                             : "failed");
}

// A group that failed here and is gone, as its post-mortem kept it: state "failed (gone)" or
// "aborted (gone)".
void FillSummary(const PostMortem& p, v1::GroupSummary* summary) {
  summary->set_name(p.group);
  summary->set_group_size(static_cast<int32_t>(p.members.size()));
  for (int member : p.members) summary->add_members(member);
  for (int rank : p.local_group_ranks) summary->add_local_group_ranks(rank);
  summary->set_sequence_number(p.sequence_number);
  int32_t in_flight = 0;
  for (const OpRecord& record : p.records) in_flight += record.InFlight() ? 1 : 0;
  summary->set_in_flight(in_flight);
  summary->set_device_type(p.device.rfind("cuda", 0) == 0 ? v1::CUDA : v1::CPU);
  summary->set_state(p.failure.kind() == ErrorKind::kAborted ? "aborted (gone)" : "failed (gone)");
}

void FillRecord(const OpRecord& r, v1::OpRecord* out) {
  out->set_group(r.group);
  out->set_epoch(r.epoch);
  out->set_sequence_number(r.sequence_number);
  out->set_op(std::string(OpKindName(r.kind)));
  out->set_dtype(static_cast<v1::DType>(static_cast<int>(r.dtype)));
  out->set_device(std::string(DeviceKindName(r.device)));
  out->set_count(r.count);
  if (r.reducing) {
    out->mutable_reduce_op()->set_kind(
        static_cast<v1::ReduceOp::Kind>(static_cast<int>(r.reduce_op.kind)));
    out->mutable_reduce_op()->set_scale(r.reduce_op.scale);
  }
  out->set_root(r.root);
  out->set_state(std::string(OpStateName(r.state)));
  FillError(r.status, out->mutable_error());
  out->set_issued_unix_us(
      std::chrono::duration_cast<std::chrono::microseconds>(r.issued.time_since_epoch()).count());
  out->set_duration_us(r.duration.count());
  for (int64_t t : r.RankArrivalUs()) out->add_rank_arrival_us(t);
  out->set_data_started_us(r.data_started_us);
  out->set_enqueued_us(r.enqueued_us);
  out->set_device_done_us(r.device_done_us);
  for (int rank : r.missing_ranks) out->add_missing_ranks(rank);
}

}  // namespace

AdminService::AdminService(const DaemonConfig& config, Sidecar& sidecar, const AdminPolicy& policy,
                           Metrics& metrics, std::function<std::string()> advertise_address)
    : config_(config),
      sidecar_(sidecar),
      policy_(policy),
      metrics_(metrics),
      advertise_address_(std::move(advertise_address)) {}

Status AdminService::CheckRead(const grpc::ServerContext& context, std::string_view method) {
  Status allowed = policy_.AuthorizeRead(context, method);
  if (!allowed.ok()) {
    metrics_.CountRefusedCall("Admin." + std::string(method), allowed.kind());
    LogWarning("admin call refused", {{"method", std::string(method)},
                                      {"caller", IdentifyCaller(context).Describe()},
                                      {"error", allowed.ToString()}});
  }
  return allowed;
}

Status AdminService::CheckChange(const grpc::ServerContext& context, std::string_view method,
                                 const std::string& group) {
  std::string how;
  Status allowed = policy_.AuthorizeChange(context, method, group, &how);
  const std::string caller = IdentifyCaller(context).Describe();
  if (!allowed.ok()) {
    metrics_.CountRefusedCall("Admin." + std::string(method), allowed.kind());
    LogWarning("admin call refused", {{"method", std::string(method)},
                                      {"group", group},
                                      {"caller", caller},
                                      {"error", allowed.ToString()}});
  } else {
    LogInfo("admin call allowed",
            {{"method", std::string(method)}, {"group", group}, {"caller", caller}, {"by", how}});
  }
  return allowed;
}

grpc::Status AdminService::ListGroups(grpc::ServerContext* context,
                                      const v1::ListGroupsRequest* request,
                                      v1::ListGroupsResponse* response) {
  if (Status allowed = CheckRead(*context, "ListGroups"); !allowed.ok())
    return ToGrpcStatus(allowed, context);
  std::set<std::string> live;
  for (const auto& group : sidecar_.ListGroups()) {
    live.insert(group->name());
    FillSummary(*group, response->add_groups());
  }
  if (request->include_failed()) {
    // Newest first, and a name reused by a live group shows only the live one.
    std::vector<PostMortem> kept = sidecar_.ListPostMortems();
    for (auto it = kept.rbegin(); it != kept.rend(); ++it) {
      if (live.insert(it->group).second) FillSummary(*it, response->add_groups());
    }
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::DescribeGroup(grpc::ServerContext* context,
                                         const v1::DescribeGroupRequest* request,
                                         v1::GroupDetail* response) {
  if (Status allowed = CheckRead(*context, "DescribeGroup"); !allowed.ok())
    return ToGrpcStatus(allowed, context);
  std::shared_ptr<Group> group = sidecar_.FindGroup(request->group());
  if (!group) {
    // A group that failed here lives on as its post-mortem.
    std::optional<PostMortem> post_mortem = sidecar_.FindPostMortem(request->group());
    if (!post_mortem) {
      return ToGrpcStatus(Status::NotFound("unknown group '" + request->group() + "'"), context);
    }
    FillSummary(*post_mortem, response->mutable_summary());
    for (size_t rank = 0; rank < post_mortem->members.size(); ++rank) {
      v1::RankPlacement* placement = response->add_placement();
      placement->set_group_rank(static_cast<int32_t>(rank));
      placement->set_global_rank(post_mortem->members[rank]);
      placement->set_sidecar(post_mortem->sidecar_of_rank[rank]);
      placement->set_sidecar_address(post_mortem->address_of_rank[rank]);
    }
    // The ops its failure caught, as they ended.
    for (const OpRecord& record : post_mortem->records) {
      if (post_mortem->Caught(record)) FillRecord(record, response->add_in_flight());
    }
    FillError(post_mortem->failure, response->mutable_failure());
    return grpc::Status::OK;
  }
  FillSummary(*group, response->mutable_summary());
  const GroupTopology& topology = group->topology();
  // The sessions behind this sidecar's ranks of the group, by group rank.
  std::map<int, std::shared_ptr<Session>> local_sessions;
  for (const auto& session : sidecar_.ListSessions()) {
    const int rank = session->GroupRankIn(group->spec().name);
    if (rank >= 0) local_sessions[rank] = session;
  }
  for (int rank = 0; rank < topology.group_size; ++rank) {
    v1::RankPlacement* placement = response->add_placement();
    const int group_rank = group->spec().GroupRankOf(rank);
    placement->set_group_rank(group_rank);
    placement->set_global_rank(group->spec().members[rank]);
    const int node = topology.node_of_rank[rank];
    placement->set_sidecar(topology.node_ids[node]);
    if (static_cast<size_t>(node) < topology.node_addresses.size())
      placement->set_sidecar_address(topology.node_addresses[node]);
    auto local = local_sessions.find(group_rank);
    if (local == local_sessions.end()) continue;
    const Session& session = *local->second;
    v1::SessionDetail* detail = placement->mutable_session();
    detail->set_label(session.label());
    detail->set_client_name(session.client_name());
    detail->set_announced_pid(session.pid());
    const PeerCredentials peer = session.peer();
    detail->set_peer_pid(peer.pid);
    detail->set_peer_uid(peer.uid);
    detail->set_peer_gid(peer.gid);
    detail->set_buffers(static_cast<int32_t>(session.BufferCount()));
    detail->set_registered_bytes(session.RegisteredBytes());
  }
  for (const OpRecord& record : group->FlightRecords(1)) {
    if (record.InFlight()) FillRecord(record, response->add_in_flight());
  }
  Status failure = group->failure();
  if (!failure.ok()) FillError(failure, response->mutable_failure());
  return grpc::Status::OK;
}

grpc::Status AdminService::GetFlightRecorder(grpc::ServerContext* context,
                                             const v1::GetFlightRecorderRequest* request,
                                             v1::FlightRecorder* response) {
  if (Status allowed = CheckRead(*context, "GetFlightRecorder"); !allowed.ok())
    return ToGrpcStatus(allowed, context);
  if (request->limit() < 0) {
    return ToGrpcStatus(Status::InvalidArgument("flight recorder limit must not be negative"),
                        context);
  }
  // The most recent `limit` records of each group (0: all), in flight ones included.
  const size_t limit = static_cast<size_t>(request->limit());
  auto add = [&](std::vector<OpRecord> records) {
    const size_t skip = limit > 0 && records.size() > limit ? records.size() - limit : 0;
    for (size_t i = skip; i < records.size(); ++i) FillRecord(records[i], response->add_ops());
  };
  if (request->group().empty()) {
    for (const auto& group : sidecar_.ListGroups()) add(group->FlightRecords(limit));
  } else if (auto group = sidecar_.FindGroup(request->group())) {
    add(group->FlightRecords(limit));
  } else if (std::optional<PostMortem> post_mortem = sidecar_.FindPostMortem(request->group())) {
    add(std::move(post_mortem->records));  // it failed here and is gone: as it was then
  } else {
    return ToGrpcStatus(Status::NotFound("unknown group '" + request->group() + "'"), context);
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::AbortGroup(grpc::ServerContext* context,
                                      const v1::AbortGroupRequest* request,
                                      v1::AbortGroupResponse* response) {
  if (Status allowed = CheckChange(*context, "AbortGroup", request->group()); !allowed.ok())
    return ToGrpcStatus(allowed, context);
  StatusOr<size_t> failed = sidecar_.AbortGroup(request->group(), request->reason());
  if (!failed.ok()) return ToGrpcStatus(failed.status(), context);
  response->set_failed_ops(static_cast<int32_t>(*failed));
  return grpc::Status::OK;
}

grpc::Status AdminService::GetInfo(grpc::ServerContext* context, const v1::GetInfoRequest*,
                                   v1::SidecarInfo* response) {
  if (Status allowed = CheckRead(*context, "GetInfo"); !allowed.ok())
    return ToGrpcStatus(allowed, context);
  response->set_version(kVersion);
  response->set_sidecar_id(advertise_address_());
  response->set_unix_socket(config_.socket_path);
  response->set_listen_address(config_.listen_address);
  response->set_advertise_address(advertise_address_());
  response->set_metrics_address(config_.metrics_address);
  response->set_gloo_available(kGlooAvailable);
  response->set_nccl_available(kNcclAvailable);
  response->set_tcp_security(TcpSecurityMode(config_));
  const GpuInventory& gpus = ProbeGpus();
  response->set_nccl_version(gpus.nccl_version);
  response->set_cuda_runtime_version(gpus.cuda_runtime_version);
  response->set_cuda_driver_version(gpus.cuda_driver_version);
  for (const GpuDevice& device : gpus.devices) {
    v1::GpuDevice* shown = response->add_gpus();
    shown->set_index(device.index);
    shown->set_name(device.name);
    shown->set_pci_bus_id(device.pci_bus_id);
    shown->set_memory_bytes(device.memory_bytes);
    shown->set_compute_capability(std::to_string(device.compute_major) + "." +
                                  std::to_string(device.compute_minor));
    shown->set_mps_enabled(device.mps_enabled);
  }
  response->set_gpu_status(gpus.Summary());
  response->set_live_sessions(static_cast<int32_t>(sidecar_.ListSessions().size()));
  response->set_live_groups(static_cast<int32_t>(sidecar_.ListGroups().size()));
  response->set_uptime_seconds(
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started_)
          .count());
  return grpc::Status::OK;
}

}  // namespace collectived
