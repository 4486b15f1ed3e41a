#include "services/collectived/group_service.h"

#include "rpc/grpc_status.h"

namespace collectived {

grpc::Status GroupService::CreateGroup(grpc::ServerContext* context,
                                       const v1::CreateGroupRequest* request,
                                       v1::CreateGroupResponse* response) {
  StatusOr<std::shared_ptr<Session>> session = runtime_.sessions().Find(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status(), context);
  if (request->device_type() == v1::CUDA) {
    return ToGrpcStatus(
        Status::InvalidArgument("group '" + request->name() +
                                "': CUDA groups are not served by this sidecar yet"),
        context);
  }
  if ((*session)->GroupRankIn(request->name()) >= 0) {
    return ToGrpcStatus(Status::InvalidArgument("this session already belongs to group '" +
                                                request->name() + "'; destroy it first"),
                        context);
  }
  StatusOr<std::shared_ptr<Store>> store = runtime_.StoreAt(request->store_address());
  if (!store.ok()) return ToGrpcStatus(store.status().WithContext("rendezvous store"), context);
  JoinRequest join;
  join.name = request->name();
  join.rank = request->rank();
  join.world_size = request->world_size();
  join.members.assign(request->members().begin(), request->members().end());
  join.store = *store;
  join.store_prefix = request->store_prefix();
  join.timeout = std::chrono::milliseconds(request->timeout_ms());
  join.job_token = request->job_token();
  StatusOr<Membership> membership = runtime_.groups().Join(join);
  if (!membership.ok()) return ToGrpcStatus(membership.status(), context);
  const Group& group = *membership->group;
  (*session)->AddMembership({request->name(), membership->group_rank, request->rank()});
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
  StatusOr<std::shared_ptr<Session>> session = runtime_.sessions().Find(request->session_id());
  if (!session.ok()) return ToGrpcStatus(session.status(), context);
  int group_rank = (*session)->GroupRankIn(request->group());
  if (group_rank < 0) {
    return ToGrpcStatus(
        Status::NotFound("this session is not part of group '" + request->group() + "'"), context);
  }
  int global_rank = -1;
  for (const auto& m : (*session)->Memberships()) {
    if (m.group == request->group()) global_rank = m.global_rank;
  }
  (*session)->RemoveMembership(request->group());
  (void)runtime_.groups().AbortRank(request->group(), group_rank,
                                    Status::Aborted("rank " + std::to_string(group_rank) +
                                                    " destroyed group '" + request->group() + "'"));
  // Peers that still use the group learn at once who left, instead of timing out (c10d groups
  // are torn down together; a rank that leaves early is lost to the others).
  (void)runtime_.groups().FailGroup(
      request->group(), Status::PeerLost("rank " + std::to_string(group_rank) + " (global rank " +
                                         std::to_string(global_rank) + ") left group '" +
                                         request->group() + "' (it destroyed the group)"));
  return ToGrpcStatus(runtime_.groups().Leave(request->group(), group_rank), context);
}

}  // namespace collectived
