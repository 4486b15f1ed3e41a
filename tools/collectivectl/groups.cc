// collectivectl groups: the live and failed groups of a sidecar.
#include <chrono>
#include <cstdio>

#include "collectived/v1/admin.grpc.pb.h"
#include "rpc/grpc_status.h"
#include "tools/collectivectl/commands.h"

namespace collectived::collectivectl {

int Groups(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::ListGroupsRequest request;
  request.set_include_failed(true);
  v1::ListGroupsResponse response;
  grpc::Status status = stub->ListGroups(&context, request, &response);
  if (!status.ok()) return Fail(FromGrpcStatus(status, &context));
  std::printf("%-24s %6s %10s %-14s %9s  %-20s %s\n", "GROUP", "SIZE", "SEQ", "STATE", "IN-FLIGHT",
              "LOCAL RANKS", "MEMBERS");
  for (const auto& g : response.groups()) {
    std::printf("%-24s %6d %10llu %-14s %9d  %-20s %s\n", g.name().c_str(), g.group_size(),
                static_cast<unsigned long long>(g.sequence_number()), g.state().c_str(),
                g.in_flight(), Join(g.local_group_ranks()).c_str(), Join(g.members()).c_str());
  }
  return 0;
}

}  // namespace collectived::collectivectl
