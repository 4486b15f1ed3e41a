// collectivectl: the command line of collectived. Talks to a sidecar found through --address,
// $COLLECTIVED_ADDRESS or the default socket.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "clients/cpp/address.h"
#include "clients/cpp/channel.h"
#include "clients/cpp/remote_store.h"
#include "collectived/v1/admin.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "services/collectived/grpc_status.h"

namespace collectived {
namespace {

constexpr char kUsage[] =
    "Usage: collectivectl [--address ADDR] [--timeout-ms N] COMMAND [ARGS]\n"
    "\n"
    "Finds the sidecar through --address, else $COLLECTIVED_ADDRESS, else\n"
    "unix:///run/collectived/collectived.sock. ADDR is unix:///path or host:port.\n"
    "\n"
    "Commands:\n"
    "  health [SERVICE]          gRPC health check; exit 0 when SERVING\n"
    "  info                      version, listeners and backends of the sidecar\n"
    "  groups                    groups of the sidecar: members, local ranks, sequence numbers\n"
    "  describe GROUP            placement of every rank and the group's in-flight ops\n"
    "  abort GROUP [REASON]      fail the group's ops on every rank (aborted by an operator)\n"
    "  store set KEY VALUE       set a key in the sidecar's rendezvous store\n"
    "  store get KEY             print a key's value (waits up to --timeout-ms)\n"
    "  store add KEY DELTA       add to an integer key; prints the new value\n"
    "  store append KEY VALUE    append to a key\n"
    "  store check KEY...        exit 0 if every key exists\n"
    "  store wait KEY...         wait until every key exists (up to --timeout-ms)\n"
    "  store delete KEY          delete a key\n"
    "  store num-keys            number of keys in the store\n";

struct Options {
  std::string address;
  std::chrono::milliseconds timeout{5000};
  std::vector<std::string> command;
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "collectivectl: %s\n", message.c_str());
  return 1;
}

int Fail(const Status& status) { return Fail(status.ToString()); }

int Health(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  grpc::health::v1::HealthCheckRequest request;
  if (options.command.size() > 1) request.set_service(options.command[1]);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    return Fail("health check of " + options.address + " failed: " + status.error_message());
  }
  std::printf("%s: %s\n", options.address.c_str(),
              grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()).c_str());
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? 0 : 1;
}

int Info(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::SidecarInfo info;
  grpc::Status status = stub->GetInfo(&context, v1::GetInfoRequest(), &info);
  if (!status.ok()) return Fail(FromGrpcStatus(status, &context));
  std::printf(
      "version:    %s\nsidecar:    %s\nsocket:     %s\nlisten:     %s\nadvertise:  %s\n"
      "metrics:    %s\ngloo:       %s\nnccl:       %s\nuptime:     %lld s\n",
      info.version().c_str(), info.sidecar_id().c_str(), info.unix_socket().c_str(),
      info.listen_address().c_str(), info.advertise_address().c_str(),
      info.metrics_address().c_str(), info.gloo_available() ? "yes" : "no",
      info.nccl_available() ? "yes" : "no", static_cast<long long>(info.uptime_seconds()));
  return 0;
}

std::string Join(const google::protobuf::RepeatedField<int32_t>& ranks) {
  std::string text = "[";
  for (int i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text + "]";
}

int Groups(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::ListGroupsResponse response;
  grpc::Status status = stub->ListGroups(&context, v1::ListGroupsRequest(), &response);
  if (!status.ok()) return Fail(FromGrpcStatus(status, &context));
  std::printf("%-24s %6s %10s %-8s %9s  %-20s %s\n", "GROUP", "SIZE", "SEQ", "STATE", "IN-FLIGHT",
              "LOCAL RANKS", "MEMBERS");
  for (const auto& g : response.groups()) {
    std::printf("%-24s %6d %10llu %-8s %9d  %-20s %s\n", g.name().c_str(), g.group_size(),
                static_cast<unsigned long long>(g.sequence_number()), g.state().c_str(), g.in_flight(),
                Join(g.local_group_ranks()).c_str(), Join(g.members()).c_str());
  }
  return 0;
}

int Describe(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  if (options.command.size() != 2) return Fail("describe needs a GROUP");
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::DescribeGroupRequest request;
  request.set_group(options.command[1]);
  v1::GroupDetail detail;
  grpc::Status status = stub->DescribeGroup(&context, request, &detail);
  if (!status.ok()) return Fail(FromGrpcStatus(status, &context));
  const auto& s = detail.summary();
  std::printf("group %s: size %d, sequence number %llu, state %s\n", s.name().c_str(), s.group_size(),
              static_cast<unsigned long long>(s.sequence_number()), s.state().c_str());
  if (detail.has_failure()) std::printf("failure: %s\n", detail.failure().message().c_str());
  std::printf("%-11s %-12s %s\n", "GROUP RANK", "GLOBAL RANK", "SIDECAR");
  for (const auto& p : detail.placement()) {
    std::printf("%-11d %-12d %s\n", p.group_rank(), p.global_rank(), p.sidecar().c_str());
  }
  std::printf("in-flight ops: %d\n", detail.in_flight_size());
  for (const auto& op : detail.in_flight()) {
    std::printf("  seq %llu %s %s for %.3f s, local ranks not yet arrived: %s\n",
                static_cast<unsigned long long>(op.sequence_number()), op.op().c_str(), op.state().c_str(),
                op.duration_us() / 1e6, Join(op.missing_ranks()).c_str());
  }
  return 0;
}

int Abort(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  if (options.command.size() < 2) return Fail("abort needs a GROUP");
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::AbortGroupRequest request;
  request.set_group(options.command[1]);
  std::string reason;
  for (size_t i = 2; i < options.command.size(); ++i) reason += (i > 2 ? " " : "") + options.command[i];
  request.set_reason(reason);
  v1::AbortGroupResponse response;
  grpc::Status status = stub->AbortGroup(&context, request, &response);
  if (!status.ok()) return Fail(FromGrpcStatus(status, &context));
  std::printf("aborted group %s (%d in-flight ops failed)\n", request.group().c_str(), response.failed_ops());
  return 0;
}

int StoreCommand(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  const auto& args = options.command;
  if (args.size() < 2) return Fail("store needs a subcommand (see --help)");
  RemoteStore store(channel);
  const std::string& verb = args[1];
  auto need = [&](size_t count) { return args.size() == count + 2; };
  std::vector<std::string> keys(args.begin() + 2, args.end());
  if (verb == "set" && need(2)) {
    Status status = store.Set(args[2], args[3]);
    return status.ok() ? 0 : Fail(status);
  }
  if (verb == "get" && need(1)) {
    auto value = store.Get(args[2], options.timeout);
    if (!value.ok()) return Fail(value.status());
    std::fwrite(value->data(), 1, value->size(), stdout);
    std::printf("\n");
    return 0;
  }
  if (verb == "add" && need(2)) {
    char* end = nullptr;
    long long delta = std::strtoll(args[3].c_str(), &end, 10);
    if (end == args[3].c_str() || *end != '\0') return Fail("DELTA must be an integer: " + args[3]);
    auto value = store.Add(args[2], delta);
    if (!value.ok()) return Fail(value.status());
    std::printf("%lld\n", static_cast<long long>(*value));
    return 0;
  }
  if (verb == "append" && need(2)) {
    Status status = store.Append(args[2], args[3]);
    return status.ok() ? 0 : Fail(status);
  }
  if (verb == "check" && args.size() >= 3) {
    auto present = store.Check(keys);
    if (!present.ok()) return Fail(present.status());
    std::printf("%s\n", *present ? "present" : "missing");
    return *present ? 0 : 1;
  }
  if (verb == "wait" && args.size() >= 3) {
    Status status = store.Wait(keys, options.timeout);
    return status.ok() ? 0 : Fail(status);
  }
  if (verb == "delete" && need(1)) {
    auto deleted = store.DeleteKey(args[2]);
    if (!deleted.ok()) return Fail(deleted.status());
    std::printf("%s\n", *deleted ? "deleted" : "not found");
    return 0;
  }
  if (verb == "num-keys" && need(0)) {
    auto count = store.NumKeys();
    if (!count.ok()) return Fail(count.status());
    std::printf("%lld\n", static_cast<long long>(*count));
    return 0;
  }
  return Fail("bad store command (see --help)");
}

int Run(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!options.command.empty()) {
      options.command.push_back(arg);
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if ((arg == "--address" || arg == "--timeout-ms") && i + 1 < argc) {
      std::string value = argv[++i];
      if (arg == "--address") {
        options.address = value;
      } else {
        char* end = nullptr;
        long long ms = std::strtoll(value.c_str(), &end, 10);
        if (end == value.c_str() || *end != '\0' || ms < 0) {
          return Fail("--timeout-ms needs a non-negative integer, got '" + value + "'");
        }
        options.timeout = std::chrono::milliseconds(ms);
      }
    } else if (arg.rfind("--", 0) == 0) {
      return Fail("unknown or incomplete option '" + arg + "' (see --help)");
    } else {
      options.command.push_back(arg);
    }
  }
  if (options.command.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  options.address = ResolveSidecarAddress(options.address);
  auto channel = OpenSidecarChannel(options.address);
  if (!channel.ok()) return Fail(channel.status());
  const std::string& command = options.command[0];
  if (command == "health") return Health(options, *channel);
  if (command == "info") return Info(options, *channel);
  if (command == "store") return StoreCommand(options, *channel);
  if (command == "groups") return Groups(options, *channel);
  if (command == "describe") return Describe(options, *channel);
  if (command == "abort") return Abort(options, *channel);
  return Fail("unknown command '" + command + "' (see --help)");
}

}  // namespace
}  // namespace collectived

int main(int argc, char** argv) { return collectived::Run(argc, argv); }
