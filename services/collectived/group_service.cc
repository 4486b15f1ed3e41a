#include "services/collectived/group_service.h"

#include "rpc/grpc_status.h"
#include "services/collectived/refusals.h"
#include "services/collectived/session_binding.h"

namespace collectived {

grpc::Status GroupService::CreateGroup(grpc::ServerContext* context,
                                       const v1::CreateGroupRequest* request,
                                       v1::CreateGroupResponse* response) {
  const SessionRef session{request->session_id(), SessionBinding(*context)};
  JoinRequest join;
  join.name = request->name();
  join.device = request->device_type() == v1::CUDA ? DeviceKind::kCuda : DeviceKind::kCpu;
  join.device_index = request->cuda_device();
  join.rank = request->rank();
  join.world_size = request->world_size();
  join.members.assign(request->members().begin(), request->members().end());
  join.store_prefix = request->store_prefix();
  // On the wire, timeout_ms 0 means the default join timeout.
  join.timeout = request->timeout_ms() == 0 ? kUseDefaultJoinTimeout
                                            : std::chrono::milliseconds(request->timeout_ms());
  join.job_token = request->job_token();
  join.abandoned = [context] {
    return context->IsCancelled() ? Status::Aborted(
                                        "the client cancelled CreateGroup (it disconnected or its "
                                        "deadline passed)")
                                  : Status::Ok();
  };
  StatusOr<Membership> membership =
      sidecar_.JoinGroup(session, std::move(join), request->store_address());
  if (!membership.ok()) return Answer(metrics_, "Groups.CreateGroup", membership.status(), context);
  const Group& group = *membership->group;
  response->set_group(group.name());
  response->set_group_rank(membership->group_rank);
  response->set_group_size(group.topology().group_size);
  for (int member : group.spec().members) response->add_members(member);
  for (int rank : group.topology().local_ranks()) response->add_local_group_ranks(rank);
  response->set_num_sidecars(group.topology().node_count());
  response->set_sequence_number(group.SequenceNumber(membership->group_rank));
  return grpc::Status::OK;
}

grpc::Status GroupService::DestroyGroup(grpc::ServerContext* context,
                                        const v1::DestroyGroupRequest* request,
                                        v1::DestroyGroupResponse*) {
  return Answer(metrics_, "Groups.DestroyGroup",
                sidecar_.DestroyGroup(SessionRef{request->session_id(), SessionBinding(*context)},
                                      request->group()),
                context);
}

}  // namespace collectived
