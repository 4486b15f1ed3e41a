// collectivectl: the command line of collectived. Talks to a sidecar found through --address,
// $COLLECTIVED_ADDRESS or the default socket.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "clients/cpp/client.h"
#include "collectived/v1/admin.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "rpc/address.h"
#include "rpc/channel.h"
#include "rpc/grpc_status.h"
#include "rpc/remote_store.h"

namespace collectived {
namespace {

constexpr char kUsage[] =
    "Usage: collectivectl [--address ADDR] [--timeout-ms N] [TLS OPTIONS] COMMAND [ARGS]\n"
    "\n"
    "Finds the sidecar through --address, else $COLLECTIVED_ADDRESS, else\n"
    "unix:///run/collectived/collectived.sock. ADDR is unix:///path or host:port.\n"
    "\n"
    "TLS options (TCP addresses only; a sidecar with mutual TLS needs all of them but\n"
    "--tls-server-name):\n"
    "  --tls-ca FILE             CA that signed the sidecar's certificate ($COLLECTIVED_TLS_CA)\n"
    "  --tls-cert FILE           client certificate ($COLLECTIVED_TLS_CERT)\n"
    "  --tls-key FILE            its private key ($COLLECTIVED_TLS_KEY)\n"
    "  --tls-server-name NAME    name expected in the sidecar's certificate (default: the\n"
    "                            address's host; $COLLECTIVED_TLS_PEER_NAME)\n"
    "\n"
    "Commands:\n"
    "  health [SERVICE]          gRPC health check; exit 0 when SERVING\n"
    "  info                      version, listeners, TCP security and backends of the sidecar\n"
    "  groups                    groups of the sidecar: members, local ranks, sequence numbers;\n"
    "                            then the failed groups it still keeps (state \"failed (gone)\")\n"
    "  describe GROUP            placement of every rank and the group's in-flight ops\n"
    "  describe GROUP --cluster  asks every sidecar of the group (at the addresses they\n"
    "                            announced, with this command's credentials) and prints one\n"
    "                            picture: per rank its sidecar, the last op completed there and\n"
    "                            the op it is stuck before or waiting in, or that its sidecar is\n"
    "                            gone. Live and failed groups alike\n"
    "  abort [--admin-token-file FILE] [--job-token-env VAR] GROUP [REASON]\n"
    "                            fail the group's ops on every rank (aborted by an operator).\n"
    "                            Needs an admin credential: the admin token read from FILE\n"
    "                            (default $COLLECTIVED_ADMIN_TOKEN_FILE), or the group's job\n"
    "                            token read from the environment variable VAR (never from the\n"
    "                            command line, where other users could read it)\n"
    "  flight-recorder [GROUP] [--limit N] [--json]\n"
    "                            the last ops of each group: state, per-rank arrival, duration\n"
    "  store set KEY VALUE       set a key in the sidecar's rendezvous store\n"
    "  store get KEY             print a key's value (waits up to --timeout-ms)\n"
    "  store add KEY DELTA       add to an integer key; prints the new value\n"
    "  store append KEY VALUE    append to a key\n"
    "  store check KEY...        prints present/missing for each key; exit 0 if all exist\n"
    "  store wait KEY...         wait until every key exists (up to --timeout-ms)\n"
    "  store delete KEY          delete a key\n"
    "  store num-keys            number of keys in the store\n"
    "  smoke --ranks ADDR,ADDR,... [--store HOST:PORT] [--count N] [--inline]\n"
    "                            run every collective on a new group with one rank (a thread\n"
    "                            with its own session) per ADDR, check each result and print\n"
    "                            a table; the same ADDR twice = 2 ranks on that sidecar.\n"
    "                            --store: the rendezvous store (default: the first ADDR if it\n"
    "                            is host:port, else that sidecar's advertised TCP address);\n"
    "                            --count: float32 elements per tensor (default 1000);\n"
    "                            --inline: tensors travel in the requests instead of shared\n"
    "                            memory. Ops time out after --timeout-ms if given, else 30 s.\n"
    "                            Exit 0 when every collective is OK.\n";

struct Options {
  std::string address;
  std::chrono::milliseconds timeout{5000};
  bool timeout_set = false;                                    // --timeout-ms given
  TlsClientOptions tls = TlsClientOptions::FromEnvironment();  // flags override
  std::vector<std::string> command;
};

int Fail(const std::string& message) {
  std::fprintf(stderr, "collectivectl: %s\n", message.c_str());
  return 1;
}

int Fail(const Status& status) {
  return Fail(status.ToString());
}

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
  // What the sidecar can do with GPUs, when its admin API lets this caller read it.
  grpc::ClientContext info_context;
  info_context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::SidecarInfo info;
  if (v1::Admin::NewStub(channel)->GetInfo(&info_context, v1::GetInfoRequest(), &info).ok()) {
    std::printf("gpu: %s\n", info.gpu_status().c_str());
  }
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
      "tcp security: %s\nmetrics:    %s\ngloo:       %s\nnccl:       %s\nuptime:     %lld s\n",
      info.version().c_str(), info.sidecar_id().c_str(), info.unix_socket().c_str(),
      info.listen_address().c_str(), info.advertise_address().c_str(), info.tcp_security().c_str(),
      info.metrics_address().c_str(), info.gloo_available() ? "yes" : "no",
      info.nccl_available() ? "yes" : "no", static_cast<long long>(info.uptime_seconds()));
  std::printf("gpu:        %s\n", info.gpu_status().c_str());
  for (const v1::GpuDevice& gpu : info.gpus()) {
    std::printf("  cuda:%d    %s, sm %s, %.1f GiB, %s, %s\n", gpu.index(), gpu.name().c_str(),
                gpu.compute_capability().c_str(),
                static_cast<double>(gpu.memory_bytes()) / (1024.0 * 1024.0 * 1024.0),
                gpu.pci_bus_id().c_str(),
                !gpu.has_mps_enabled() ? "MPS unknown"
                : gpu.mps_enabled()    ? "MPS"
                                       : "no MPS");
  }
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

std::string TrimSpace(const std::string& text) {
  const char* space = " \t\r\n";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

int Abort(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  std::string token_file;
  if (const char* from_env = std::getenv("COLLECTIVED_ADMIN_TOKEN_FILE")) token_file = from_env;
  std::string job_token_env;
  std::vector<std::string> positional;
  for (size_t i = 1; i < options.command.size(); ++i) {
    const std::string& arg = options.command[i];
    const bool has_value = i + 1 < options.command.size();
    if (arg == "--admin-token-file" && has_value) {
      token_file = options.command[++i];
    } else if (arg == "--job-token-env" && has_value) {
      job_token_env = options.command[++i];
    } else if (positional.empty() && arg.rfind("--", 0) == 0) {
      return Fail("abort: unknown or incomplete option '" + arg + "' (see --help)");
    } else {
      positional.push_back(arg);
    }
  }
  if (positional.empty()) return Fail("abort needs a GROUP");
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  if (!token_file.empty()) {
    std::ifstream in(token_file, std::ios::binary);
    std::stringstream content;
    content << in.rdbuf();
    const std::string token = TrimSpace(content.str());
    if (!in || token.empty())
      return Fail("abort: cannot read an admin token from " + token_file +
                  " (--admin-token-file / COLLECTIVED_ADMIN_TOKEN_FILE)");
    context.AddMetadata("authorization", "Bearer " + token);
  }
  if (!job_token_env.empty()) {
    const char* value = std::getenv(job_token_env.c_str());
    const std::string token = value ? TrimSpace(value) : "";
    if (token.empty())
      return Fail("abort: the environment variable " + job_token_env +
                  " (--job-token-env) holds no job token");
    context.AddMetadata("collectived-job-token", token);
  }
  v1::AbortGroupRequest request;
  request.set_group(positional[0]);
  std::string reason;
  for (size_t i = 1; i < positional.size(); ++i) reason += (i > 1 ? " " : "") + positional[i];
  request.set_reason(reason);
  v1::AbortGroupResponse response;
  grpc::Status status = stub->AbortGroup(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
    return Fail(FromGrpcStatus(status, &context).ToString() +
                "\n(give the admin token with --admin-token-file FILE or "
                "$COLLECTIVED_ADMIN_TOKEN_FILE, or the job's token with --job-token-env VAR)");
  }
  if (!status.ok()) return Fail(FromGrpcStatus(status, &context));
  std::printf("aborted group %s (%d in-flight ops failed)\n", request.group().c_str(),
              response.failed_ops());
  return 0;
}

int FlightRecorderCommand(const Options& options, std::shared_ptr<grpc::Channel> channel) {
  v1::GetFlightRecorderRequest request;
  bool json = false;
  for (size_t i = 1; i < options.command.size(); ++i) {
    const std::string& arg = options.command[i];
    if (arg == "--json") {
      json = true;
    } else if (arg == "--limit" && i + 1 < options.command.size()) {
      request.set_limit(std::atoi(options.command[++i].c_str()));
    } else if (arg.rfind("--", 0) == 0) {
      return Fail("flight-recorder: unknown option '" + arg + "'");
    } else {
      request.set_group(arg);
    }
  }
  auto stub = v1::Admin::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::FlightRecorder recorder;
  grpc::Status status = stub->GetFlightRecorder(&context, request, &recorder);
  if (!status.ok()) return Fail(FromGrpcStatus(status, &context));
  if (json) {
    std::string text;
    google::protobuf::util::JsonPrintOptions print;
    print.add_whitespace = true;
    print.always_print_primitive_fields = true;
    (void)google::protobuf::util::MessageToJsonString(recorder, &text, print);
    std::printf("%s\n", text.c_str());
    return 0;
  }
  std::printf("%-20s %6s %-22s %-10s %10s %-18s %10s  %s\n", "GROUP", "SEQ", "OP", "DTYPE", "COUNT",
              "STATE", "DUR(us)", "ARRIVAL(us) BY RANK / ERROR");
  for (const auto& op : recorder.ops()) {
    std::string detail;
    for (int i = 0; i < op.rank_arrival_us_size(); ++i) {
      detail +=
          (i ? " " : "") +
          (op.rank_arrival_us(i) < 0 ? std::string("-") : std::to_string(op.rank_arrival_us(i)));
    }
    if (op.missing_ranks_size() > 0) detail += "  missing: " + Join(op.missing_ranks());
    if (op.error().kind() != v1::OK) detail += "  " + op.error().message();
    std::printf("%-20s %6llu %-22s %-10s %10llu %-18s %10lld  %s\n", op.group().c_str(),
                static_cast<unsigned long long>(op.sequence_number()), op.op().c_str(),
                v1::DType_Name(op.dtype()).c_str(), static_cast<unsigned long long>(op.count()),
                op.state().c_str(), static_cast<long long>(op.duration_us()), detail.c_str());
  }
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
    // Each key by name: which one is missing is what a reader wants to know.
    bool all = true;
    for (const std::string& key : keys) {
      auto present = store.Check({key});
      if (!present.ok()) return Fail(present.status());
      std::printf("%s %s\n", *present ? "present" : "missing", key.c_str());
      all = all && *present;
    }
    return all ? 0 : 1;
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

// ---- smoke: every collective against running sidecars ----------------------------------------

struct SmokeOptions {
  std::vector<std::string> ranks;  // one sidecar address per rank
  std::string store;
  size_t count = 1000;
  bool inline_tensors = false;
  std::chrono::milliseconds timeout{30000};
};

// Values that stay exact in float32 when summed over a few ranks.
float SmokeValue(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
}
float SmokeSum(int n, size_t i) {
  return static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 13 + 1));
}
// What rank `from` sends to rank `to` (alltoall, scatter), element i.
float SmokeBlock(int from, int to, size_t i) {
  return static_cast<float>(10000 * from + 100 * to + i % 100);
}

// The tensors of one rank, carved out of its registered buffer (or, with --inline, out of host
// memory whose bytes travel in the requests).
class SmokeArena {
 public:
  SmokeArena(const RegisteredBuffer* shm, size_t bytes)
      : shm_(shm), host_(shm ? 0 : bytes), size_(bytes) {}

  void Reset() { used_ = 0; }
  // A tensor of `count` float32 filled with `fill(i)`. The arena is sized for the largest case
  // (SmokeArenaBytes): running out is a bug.
  ClientTensor Take(size_t count, const std::function<float(size_t)>& fill) {
    size_t offset = used_;
    used_ += (count * sizeof(float) + 63) / 64 * 64;
    if (used_ > size_) std::abort();
    ClientTensor t = shm_ ? ClientTensor::Shm(*shm_, offset, DType::kFloat32, count)
                          : ClientTensor::Inline(host_.data() + offset, DType::kFloat32, count);
    float* data = Data(t);
    for (size_t i = 0; i < count; ++i) data[i] = fill(i);
    return t;
  }
  static float* Data(const ClientTensor& t) {
    return reinterpret_cast<float*>(t.shm ? t.shm->data() + t.offset
                                          : static_cast<std::byte*>(t.host));
  }

 private:
  const RegisteredBuffer* shm_;
  std::vector<std::byte> host_;
  size_t size_;
  size_t used_ = 0;
};

// Enough for the largest case (alltoall/allgather_coalesced: about 4n + 4 tensors of count).
size_t SmokeArenaBytes(int n, size_t count) {
  return (4 * static_cast<size_t>(n) + 8) * ((count + 16) * sizeof(float) + 64);
}

struct SmokeRank {
  int rank;
  int n;
  Client* client;
  std::string group;
  SmokeArena* arena;
  std::chrono::milliseconds wait;  // bound on every Wait

  Status Await(const std::shared_ptr<ClientWork>& work) const { return work->Wait(wait); }
  ClientTensor Take(size_t count, const std::function<float(size_t)>& fill) {
    return arena->Take(count, fill);
  }
  ClientTensor Empty(size_t count) {
    return arena->Take(count, [](size_t) { return -1.0f; });
  }

  // Compares `t` with expected(i); the first mismatch of the case is kept in `wrong`.
  void Expect(const std::string& what, const ClientTensor& t,
              const std::function<float(size_t)>& expected) {
    const float* data = SmokeArena::Data(t);
    for (size_t i = 0; i < t.count && wrong.empty(); ++i) {
      if (data[i] != expected(i)) {
        wrong = what + "[" + std::to_string(i) + "] = " + std::to_string(data[i]) + ", expected " +
                std::to_string(expected(i));
      }
    }
  }
  std::string wrong;  // empty while every checked element was right
};

using SmokeCase = std::pair<const char*, std::function<Status(SmokeRank&)>>;

std::vector<SmokeCase> SmokeCases(size_t c) {
  const size_t c2 = c / 2 + 1;  // a second, different size for the coalesced ops
  std::vector<SmokeCase> cases;
  cases.emplace_back("allreduce", [c](SmokeRank& r) {
    ClientTensor t = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->AllReduce(r.group, t, ReduceOp::Sum())));
    r.Expect("tensor", t, [&](size_t i) { return SmokeSum(r.n, i); });
    return Status::Ok();
  });
  cases.emplace_back("allreduce_coalesced", [c, c2](SmokeRank& r) {
    ClientTensor a = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    ClientTensor b = r.Take(c2, [&](size_t i) { return SmokeValue(r.rank, i) + 1; });
    COLLECTIVED_RETURN_IF_ERROR(
        r.Await(r.client->AllReduceCoalesced(r.group, {a, b}, ReduceOp::Sum())));
    r.Expect("tensors[0]", a, [&](size_t i) { return SmokeSum(r.n, i); });
    r.Expect("tensors[1]", b, [&](size_t i) { return SmokeSum(r.n, i) + r.n; });
    return Status::Ok();
  });
  cases.emplace_back("broadcast", [c](SmokeRank& r) {
    const int root = r.n - 1;
    ClientTensor t =
        r.Take(c, [&](size_t i) { return r.rank == root ? SmokeValue(root, i) : -1.0f; });
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->Broadcast(r.group, t, root)));
    r.Expect("tensor", t, [&](size_t i) { return SmokeValue(root, i); });
    return Status::Ok();
  });
  cases.emplace_back("reduce", [c](SmokeRank& r) {
    const int root = 1 % r.n;
    ClientTensor t = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->Reduce(r.group, t, root, ReduceOp::Sum())));
    if (r.rank == root)
      r.Expect("tensor on the root", t, [&](size_t i) { return SmokeSum(r.n, i); });
    return Status::Ok();
  });
  cases.emplace_back("allgather", [c](SmokeRank& r) {
    ClientTensor in = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    std::vector<ClientTensor> out;
    for (int s = 0; s < r.n; ++s) out.push_back(r.Empty(c));
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->AllGather(r.group, in, out)));
    for (int s = 0; s < r.n; ++s) {
      r.Expect("output[" + std::to_string(s) + "]", out[s],
               [&](size_t i) { return SmokeValue(s, i); });
    }
    return Status::Ok();
  });
  cases.emplace_back("allgather_into_tensor", [c](SmokeRank& r) {
    ClientTensor in = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    ClientTensor out = r.Empty(c * r.n);
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->AllGatherIntoTensor(r.group, in, out)));
    r.Expect("output", out, [&](size_t i) { return SmokeValue(static_cast<int>(i / c), i % c); });
    return Status::Ok();
  });
  cases.emplace_back("allgather_coalesced", [c, c2](SmokeRank& r) {
    const size_t sizes[2] = {c, c2};
    std::vector<ClientTensor> in, out;
    for (int k = 0; k < 2; ++k)
      in.push_back(r.Take(sizes[k], [&](size_t i) { return SmokeValue(r.rank, i) + 100 * k; }));
    for (int k = 0; k < 2; ++k) {
      for (int s = 0; s < r.n; ++s) out.push_back(r.Empty(sizes[k]));
    }
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->AllGatherCoalesced(r.group, in, out)));
    for (int k = 0; k < 2; ++k) {
      for (int s = 0; s < r.n; ++s) {
        r.Expect("output[" + std::to_string(k * r.n + s) + "]", out[k * r.n + s],
                 [&](size_t i) { return SmokeValue(s, i) + 100 * k; });
      }
    }
    return Status::Ok();
  });
  cases.emplace_back("reduce_scatter", [c](SmokeRank& r) {
    std::vector<ClientTensor> in;
    for (int s = 0; s < r.n; ++s)
      in.push_back(r.Take(c, [&](size_t i) { return SmokeValue(r.rank, s * c + i); }));
    ClientTensor out = r.Empty(c);
    COLLECTIVED_RETURN_IF_ERROR(
        r.Await(r.client->ReduceScatter(r.group, in, out, ReduceOp::Sum())));
    r.Expect("output", out, [&](size_t i) { return SmokeSum(r.n, r.rank * c + i); });
    return Status::Ok();
  });
  cases.emplace_back("reduce_scatter_tensor", [c](SmokeRank& r) {
    ClientTensor in = r.Take(c * r.n, [&](size_t i) { return SmokeValue(r.rank, i); });
    ClientTensor out = r.Empty(c);
    COLLECTIVED_RETURN_IF_ERROR(
        r.Await(r.client->ReduceScatterTensor(r.group, in, out, ReduceOp::Sum())));
    r.Expect("output", out, [&](size_t i) { return SmokeSum(r.n, r.rank * c + i); });
    return Status::Ok();
  });
  cases.emplace_back("alltoall", [c](SmokeRank& r) {
    std::vector<ClientTensor> in, out;
    for (int s = 0; s < r.n; ++s)
      in.push_back(r.Take(c, [&](size_t i) { return SmokeBlock(r.rank, s, i); }));
    for (int s = 0; s < r.n; ++s) out.push_back(r.Empty(c));
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->AllToAll(r.group, in, out)));
    for (int s = 0; s < r.n; ++s) {
      r.Expect("output[" + std::to_string(s) + "]", out[s],
               [&](size_t i) { return SmokeBlock(s, r.rank, i); });
    }
    return Status::Ok();
  });
  cases.emplace_back("alltoall_single", [c](SmokeRank& r) {
    // Uneven splits: rank a sends split(a, b) elements to rank b.
    const size_t unit = std::max<size_t>(1, c / (4 * r.n));
    auto split = [&](int a, int b) { return static_cast<uint64_t>((a + 2 * b) % 3 + 1) * unit; };
    std::vector<uint64_t> in_splits, out_splits;
    std::vector<float> in_values, expected;
    for (int b = 0; b < r.n; ++b) {
      in_splits.push_back(split(r.rank, b));
      out_splits.push_back(split(b, r.rank));
      for (size_t j = 0; j < in_splits.back(); ++j) in_values.push_back(SmokeBlock(r.rank, b, j));
      for (size_t j = 0; j < out_splits.back(); ++j) expected.push_back(SmokeBlock(b, r.rank, j));
    }
    ClientTensor in = r.Take(in_values.size(), [&](size_t i) { return in_values[i]; });
    ClientTensor out = r.Empty(expected.size());
    COLLECTIVED_RETURN_IF_ERROR(
        r.Await(r.client->AllToAllSingle(r.group, in, out, in_splits, out_splits)));
    r.Expect("output", out, [&](size_t i) { return expected[i]; });
    return Status::Ok();
  });
  cases.emplace_back("gather", [c](SmokeRank& r) {
    const int root = 0;
    ClientTensor in = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    std::vector<ClientTensor> out;
    if (r.rank == root) {
      for (int s = 0; s < r.n; ++s) out.push_back(r.Empty(c));
    }
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->Gather(r.group, in, out, root)));
    for (size_t s = 0; s < out.size(); ++s) {
      r.Expect("output[" + std::to_string(s) + "] on the root", out[s],
               [&](size_t i) { return SmokeValue(static_cast<int>(s), i); });
    }
    return Status::Ok();
  });
  cases.emplace_back("scatter", [c](SmokeRank& r) {
    const int root = r.n - 1;
    std::vector<ClientTensor> in;
    if (r.rank == root) {
      for (int s = 0; s < r.n; ++s)
        in.push_back(r.Take(c, [&](size_t i) { return SmokeBlock(root, s, i); }));
    }
    ClientTensor out = r.Empty(c);
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->Scatter(r.group, in, out, root)));
    r.Expect("output", out, [&](size_t i) { return SmokeBlock(root, r.rank, i); });
    return Status::Ok();
  });
  cases.emplace_back("barrier", [](SmokeRank& r) { return r.Await(r.client->Barrier(r.group)); });
  cases.emplace_back("send/recv", [c](SmokeRank& r) {
    // A ring: every rank sends to the next and receives from the previous, tag 7.
    const int next = (r.rank + 1) % r.n, previous = (r.rank + r.n - 1) % r.n;
    ClientTensor out = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    ClientTensor in = r.Empty(c);
    auto send = r.client->Send(r.group, out, next, /*tag=*/7);
    auto recv = r.client->Recv(r.group, in, previous, /*tag=*/7);
    Status sent = r.Await(send);
    Status received = r.Await(recv);
    COLLECTIVED_RETURN_IF_ERROR(sent);
    COLLECTIVED_RETURN_IF_ERROR(received);
    r.Expect("received tensor", in, [&](size_t i) { return SmokeValue(previous, i); });
    return Status::Ok();
  });
  return cases;
}

// The rendezvous store: --store, else the first address if it is host:port, else that sidecar's
// advertised TCP address (Admin.GetInfo).
StatusOr<std::string> SmokeStore(const SmokeOptions& smoke, const Options& options) {
  if (!smoke.store.empty()) return smoke.store;
  const std::string& first = smoke.ranks[0];
  if (first.rfind("unix:", 0) != 0) return first;
  auto channel = OpenClientChannel(first, options.tls);
  if (!channel.ok()) return channel.status();
  auto stub = v1::Admin::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::SidecarInfo info;
  grpc::Status status = stub->GetInfo(&context, v1::GetInfoRequest(), &info);
  if (!status.ok())
    return FromGrpcStatus(status, &context).WithContext("asking " + first + " for its TCP address");
  std::string address =
      info.advertise_address().empty() ? info.listen_address() : info.advertise_address();
  if (address.empty())
    return Status::InvalidArgument(first + " has no TCP listener: pass --store HOST:PORT");
  return address;
}

std::string OneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

int Smoke(const Options& options) {
  SmokeOptions smoke;
  if (options.timeout_set) smoke.timeout = options.timeout;
  const auto& args = options.command;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    bool has_value = i + 1 < args.size();
    if (arg == "--ranks" && has_value) {
      std::string list = args[++i];
      size_t start = 0;
      for (;;) {
        size_t comma = list.find(',', start);
        smoke.ranks.push_back(list.substr(start, comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (arg == "--store" && has_value) {
      smoke.store = args[++i];
    } else if (arg == "--count" && has_value) {
      char* end = nullptr;
      long long count = std::strtoll(args[++i].c_str(), &end, 10);
      if (*end != '\0' || count < 1 || count > (1 << 24))
        return Fail("--count needs an integer in [1, 16777216]");
      smoke.count = static_cast<size_t>(count);
    } else if (arg == "--inline") {
      smoke.inline_tensors = true;
    } else {
      return Fail("smoke: unknown or incomplete option '" + arg + "' (see --help)");
    }
  }
  if (smoke.ranks.size() < 2)
    return Fail("smoke needs --ranks with at least two addresses (one per rank)");
  for (const std::string& address : smoke.ranks) {
    if (StatusOr<std::string> target = ToGrpcTarget(address); !target.ok())
      return Fail(target.status());
  }
  StatusOr<std::string> store = SmokeStore(smoke, options);
  if (!store.ok()) return Fail(store.status());

  const int n = static_cast<int>(smoke.ranks.size());
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::random_device random;
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "%08x", random());
  const std::string group =
      std::string("smoke-") + host + "-" + std::to_string(getpid()) + "-" + suffix;
  const std::vector<SmokeCase> cases = SmokeCases(smoke.count);
  const auto wait = smoke.timeout + std::chrono::seconds(10);

  struct Outcome {
    Status status;
    bool wrong = false;
    double ms = 0;
  };
  // outcomes[case][rank]; setup[rank] for connecting and joining.
  std::vector<std::vector<Outcome>> outcomes(cases.size(), std::vector<Outcome>(n));
  std::vector<Status> setup(n);
  std::vector<GroupInfo> infos(n);
  std::vector<Status> destroyed(n);
  std::atomic<bool> setup_failed{false};
  std::barrier sync(n);

  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      ClientOptions client_options;
      client_options.address = smoke.ranks[rank];
      client_options.tls = options.tls;
      client_options.client_name = "collectivectl smoke rank " + std::to_string(rank);
      client_options.connect_timeout = std::max(options.timeout, std::chrono::milliseconds(5000));
      std::unique_ptr<Client> client;
      const RegisteredBuffer* buffer = nullptr;
      const size_t arena_bytes = SmokeArenaBytes(n, smoke.count);
      auto connected = Client::Connect(client_options);
      if (!connected.ok()) {
        setup[rank] = connected.status();
      } else {
        client = std::move(*connected);
        if (!smoke.inline_tensors) {
          auto allocated = client->AllocateBuffer(arena_bytes);
          if (allocated.ok())
            buffer = *allocated;
          else
            setup[rank] = allocated.status().WithContext("allocating a shared-memory buffer");
        }
      }
      if (!setup[rank].ok()) setup_failed = true;
      sync.arrive_and_wait();  // every rank has a session before anyone waits in the rendezvous
      if (setup_failed) return;
      GroupOptions group_options;
      group_options.name = group;
      group_options.rank = rank;
      group_options.world_size = n;
      group_options.store_address = *store;
      group_options.timeout = smoke.timeout;
      auto info = client->CreateGroup(group_options);
      if (info.ok())
        infos[rank] = *info;
      else
        setup[rank] = info.status().WithContext("creating group '" + group + "'");
      if (!setup[rank].ok()) setup_failed = true;
      sync.arrive_and_wait();
      if (setup_failed) return;

      SmokeArena arena(buffer, arena_bytes);
      SmokeRank self{rank, n, client.get(), group, &arena, wait, {}};
      for (size_t k = 0; k < cases.size(); ++k) {
        arena.Reset();
        Outcome& outcome = outcomes[k][rank];
        auto start = std::chrono::steady_clock::now();
        self.wrong.clear();
        outcome.status = cases[k].second(self);
        if (outcome.status.ok() && !self.wrong.empty()) {
          outcome.status = Status::Internal("wrong result: " + self.wrong);
          outcome.wrong = true;
        }
        outcome.ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        sync.arrive_and_wait();  // one collective at a time, on every rank
      }
      destroyed[rank] = client->DestroyGroup(group);
    });
  }
  for (std::thread& thread : threads) thread.join();

  if (setup_failed) {
    for (int rank = 0; rank < n; ++rank) {
      if (!setup[rank].ok()) {
        std::fprintf(stderr, "collectivectl: smoke: rank %d (%s): %s\n", rank,
                     smoke.ranks[rank].c_str(), OneLine(setup[rank].ToString()).c_str());
      }
    }
    return 1;
  }
  std::printf(
      "smoke: group '%s', %d ranks on %d sidecar%s, store %s, %zu float32 elements per tensor, %s "
      "tensors\n",
      group.c_str(), n, infos[0].num_sidecars, infos[0].num_sidecars == 1 ? "" : "s",
      store->c_str(), smoke.count, smoke.inline_tensors ? "inline" : "shared-memory");
  std::printf("%-24s %-7s %10s  %s\n", "COLLECTIVE", "RESULT", "TIME (ms)", "DETAIL");
  size_t passed = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    double ms = 0;
    int first_bad = -1;
    for (int rank = 0; rank < n; ++rank) {
      ms = std::max(ms, outcomes[k][rank].ms);
      if (first_bad < 0 && !outcomes[k][rank].status.ok()) first_bad = rank;
    }
    if (first_bad < 0) {
      ++passed;
      std::printf("%-24s %-7s %10.2f\n", cases[k].first, "OK", ms);
      continue;
    }
    const Outcome& bad = outcomes[k][first_bad];
    std::string detail = "rank " + std::to_string(first_bad) + ": " +
                         OneLine(bad.wrong ? bad.status.message() : bad.status.ToString());
    int others = 0;
    for (int rank = first_bad + 1; rank < n; ++rank) others += !outcomes[k][rank].status.ok();
    if (others > 0)
      detail += " (and " + std::to_string(others) + " more rank" + (others > 1 ? "s" : "") + ")";
    std::printf("%-24s %-7s %10.2f  %s\n", cases[k].first, bad.wrong ? "WRONG" : "FAILED", ms,
                detail.c_str());
  }
  bool destroy_ok = true;
  for (int rank = 0; rank < n; ++rank) {
    if (!destroyed[rank].ok()) {
      destroy_ok = false;
      std::printf("destroying the group failed on rank %d: %s\n", rank,
                  OneLine(destroyed[rank].ToString()).c_str());
    }
  }
  std::printf("smoke: %zu of %zu collectives OK%s\n", passed, cases.size(),
              destroy_ok ? ", group destroyed" : "");
  std::fflush(stdout);
  return passed == cases.size() && destroy_ok ? 0 : 1;
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
    } else if ((arg == "--address" || arg == "--timeout-ms" || arg == "--tls-ca" ||
                arg == "--tls-cert" || arg == "--tls-key" || arg == "--tls-server-name") &&
               i + 1 < argc) {
      std::string value = argv[++i];
      if (arg == "--address") {
        options.address = value;
      } else if (arg == "--tls-ca") {
        options.tls.ca_file = value;
      } else if (arg == "--tls-cert") {
        options.tls.cert_file = value;
      } else if (arg == "--tls-key") {
        options.tls.key_file = value;
      } else if (arg == "--tls-server-name") {
        options.tls.server_name = value;
      } else {
        char* end = nullptr;
        long long ms = std::strtoll(value.c_str(), &end, 10);
        if (end == value.c_str() || *end != '\0' || ms < 0) {
          return Fail("--timeout-ms needs a non-negative integer, got '" + value + "'");
        }
        options.timeout = std::chrono::milliseconds(ms);
        options.timeout_set = true;
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
  if (options.command[0] == "smoke") return Smoke(options);
  options.address = ResolveSidecarAddress(options.address);
  auto channel = OpenClientChannel(options.address, options.tls);
  if (!channel.ok()) return Fail(channel.status());
  const std::string& command = options.command[0];
  if (command == "health") return Health(options, *channel);
  if (command == "info") return Info(options, *channel);
  if (command == "store") return StoreCommand(options, *channel);
  if (command == "groups") return Groups(options, *channel);
  if (command == "describe") return Describe(options, *channel);
  if (command == "abort") return Abort(options, *channel);
  if (command == "flight-recorder") return FlightRecorderCommand(options, *channel);
  return Fail("unknown command '" + command + "' (see --help)");
}

}  // namespace
}  // namespace collectived

int main(int argc, char** argv) {
  return collectived::Run(argc, argv);
}
