// collectivectl describe: one group as its sidecar sees it, or with --cluster as every sidecar
// of the group does.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "collectived/v1/admin.grpc.pb.h"
#include "rpc/channel.h"
#include "rpc/grpc_status.h"
#include "tools/collectivectl/commands.h"

namespace collectived::collectivectl {
namespace {

// What one sidecar of a group says of it: its DescribeGroup and flight records, or why it
// could not be asked.
struct SidecarView {
  std::string address;
  bool answered = false;
  std::string error;
  v1::GroupDetail detail;
  uint64_t last_completed = 0;  // highest sequence number completed there (0: none)
};

SidecarView AskSidecar(const Options& options, std::shared_ptr<grpc::Channel> channel,
                       const std::string& address, const std::string& group) {
  SidecarView view;
  view.address = address;
  auto stub = v1::Admin::NewStub(channel);
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + options.timeout);
    v1::DescribeGroupRequest request;
    request.set_group(group);
    grpc::Status status = stub->DescribeGroup(&context, request, &view.detail);
    if (!status.ok()) {
      view.error = FromGrpcStatus(status, &context).ToString();
      return view;
    }
  }
  view.answered = true;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::GetFlightRecorderRequest request;
  request.set_group(group);
  v1::FlightRecorder recorder;
  if (stub->GetFlightRecorder(&context, request, &recorder).ok()) {
    for (const auto& op : recorder.ops()) {
      if (op.state() == "completed") {
        view.last_completed = std::max<uint64_t>(view.last_completed, op.sequence_number());
      }
    }
  }
  return view;
}

// Where rank `rank` of a group stands, as its sidecar `view` says; `front` is the earliest op
// in flight on any sidecar (null: none), which an idle rank has not issued.
std::string RankState(const SidecarView& view, int rank, const v1::OpRecord* front) {
  if (!view.answered) {
    return "sidecar " + (view.address.empty() ? std::string("(address unknown)") : view.address) +
           " gone or unreachable: " + view.error;
  }
  const v1::OpRecord* stuck_before = nullptr;
  const v1::OpRecord* waiting_in = nullptr;
  for (const auto& op : view.detail.in_flight()) {
    const bool missing = std::find(op.missing_ranks().begin(), op.missing_ranks().end(), rank) !=
                         op.missing_ranks().end();
    const v1::OpRecord*& slot = missing ? stuck_before : waiting_in;
    if (slot == nullptr || op.sequence_number() < slot->sequence_number()) slot = &op;
  }
  auto name = [](const v1::OpRecord& op) {
    return "seq " + std::to_string(op.sequence_number()) + " " + op.op() +
           (op.state() == "failed" ? " (failed: " + op.error().message().substr(0, 80) + ")" : "");
  };
  if (stuck_before) return "never issued " + name(*stuck_before);
  if (waiting_in) return "issued " + name(*waiting_in) + ", waiting for the others";
  if (front && front->sequence_number() > view.last_completed) {
    return "never issued " + name(*front) + " (other ranks did)";
  }
  return "idle";
}

int DescribeCluster(const Options& options, std::shared_ptr<grpc::Channel> channel,
                    const std::string& group) {
  SidecarView here = AskSidecar(options, channel, options.address, group);
  if (!here.answered) return Fail("describe " + group + ": " + here.error);
  // Every sidecar of the group by id, with the address it announced; this one answered above.
  std::map<std::string, std::string> address_of;
  std::string here_id;
  for (const auto& p : here.detail.placement()) {
    address_of[p.sidecar()] = p.sidecar_address();
    for (int local : here.detail.summary().local_group_ranks()) {
      if (local == p.group_rank()) here_id = p.sidecar();
    }
  }
  std::map<std::string, SidecarView> views;
  for (const auto& [id, address] : address_of) {
    if (id == here_id) {
      here.address = address.empty() ? options.address : address;
      views[id] = here;
      continue;
    }
    if (address.empty()) {
      views[id].error = "it announced no address (an older sidecar)";
      continue;
    }
    StatusOr<std::shared_ptr<grpc::Channel>> peer = OpenClientChannel(address, options.tls);
    if (!peer.ok()) {
      views[id].address = address;
      views[id].error = peer.status().ToString();
      continue;
    }
    views[id] = AskSidecar(options, *peer, address, group);
  }
  const auto& s = here.detail.summary();
  std::printf("group %s: %d ranks on %zu sidecars\n", s.name().c_str(), s.group_size(),
              views.size());
  for (const auto& [id, view] : views) {
    std::printf("  sidecar %s (%s): %s\n", view.address.c_str(), id.c_str(),
                view.answered ? (view.detail.summary().state() +
                                 (view.detail.summary().epoch() > 0
                                      ? ", epoch " + std::to_string(view.detail.summary().epoch())
                                      : std::string()) +
                                 (view.detail.has_failure()
                                      ? ": " + view.detail.failure().message().substr(0, 160)
                                      : std::string()))
                                    .c_str()
                              : "no answer");
  }
  // The earliest op some rank issued and the group has not finished.
  const v1::OpRecord* front = nullptr;
  for (const auto& [id, view] : views) {
    for (const auto& op : view.detail.in_flight()) {
      if (op.sequence_number() > 0 &&
          (front == nullptr || op.sequence_number() < front->sequence_number())) {
        front = &op;
      }
    }
  }
  std::printf("%-5s %-7s %-22s %-15s %s\n", "RANK", "GLOBAL", "SIDECAR", "LAST COMPLETED", "NOW");
  for (const auto& p : here.detail.placement()) {
    const SidecarView& view = views[p.sidecar()];
    const std::string completed = !view.answered ? "?"
                                  : view.last_completed == 0
                                      ? "none"
                                      : "seq " + std::to_string(view.last_completed);
    std::printf("%-5d %-7d %-22s %-15s %s\n", p.group_rank(), p.global_rank(),
                (view.address.empty() ? p.sidecar() : view.address).c_str(), completed.c_str(),
                RankState(view, p.group_rank(), front).c_str());
  }
  return 0;
}

}  // namespace

int Describe(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  if (options.command.size() == 3 && options.command[2] == "--cluster") {
    return DescribeCluster(options, channel, options.command[1]);
  }
  if (options.command.size() != 2) return Fail("describe needs a GROUP (and optionally --cluster)");
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::DescribeGroupRequest request;
  request.set_group(options.command[1]);
  v1::GroupDetail detail;
  grpc::Status status = stub->DescribeGroup(&context, request, &detail);
  if (!status.ok()) return Fail(FromGrpcStatus(status, &context));
  const auto& s = detail.summary();
  std::printf("group %s: size %d, sequence number %llu, state %s\n", s.name().c_str(),
              s.group_size(), static_cast<unsigned long long>(s.sequence_number()),
              s.state().c_str());
  if (s.epoch() > 0) {
    std::printf("membership epoch %d: lost group ranks %s\n", s.epoch(),
                Join(s.lost_group_ranks()).c_str());
  }
  if (detail.has_failure()) std::printf("failure: %s\n", detail.failure().message().c_str());
  std::printf("%-11s %-12s %-22s %s\n", "GROUP RANK", "GLOBAL RANK", "SIDECAR", "SESSION");
  for (const auto& p : detail.placement()) {
    std::string session = "-";
    if (p.has_session()) {
      const auto& d = p.session();
      // The peer credentials are the kernel's (SO_PEERCRED on the fd channel); the announced
      // pid is the client's word.
      session = d.label() + " '" + d.client_name() + "' " +
                (d.peer_pid() > 0
                     ? "pid " + std::to_string(d.peer_pid()) + " uid " +
                           std::to_string(d.peer_uid()) + " gid " + std::to_string(d.peer_gid())
                     : "announced pid " + std::to_string(d.announced_pid()) + " (no fd channel)") +
                ", " + std::to_string(d.buffers()) + " buffers";
    }
    std::printf("%-11d %-12d %-22s %s\n", p.group_rank(), p.global_rank(), p.sidecar().c_str(),
                session.c_str());
  }
  std::printf("in-flight ops: %d\n", detail.in_flight_size());
  for (const auto& op : detail.in_flight()) {
    std::printf("  seq %llu %s %s for %.3f s, local ranks not yet arrived: %s\n",
                static_cast<unsigned long long>(op.sequence_number()), op.op().c_str(),
                op.state().c_str(), op.duration_us() / 1e6, Join(op.missing_ranks()).c_str());
  }
  return 0;
}

}  // namespace collectived::collectivectl
