// collectivectl flight-recorder: the last ops of each group, as a table or as JSON.
#include <google/protobuf/util/json_util.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "collectived/v1/admin.grpc.pb.h"
#include "rpc/grpc_status.h"
#include "tools/collectivectl/commands.h"

namespace collectived::collectivectl {

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
    if (op.epoch() > 0) detail += "  epoch " + std::to_string(op.epoch());
    if (op.error().kind() != v1::OK) detail += "  " + op.error().message();
    std::printf("%-20s %6llu %-22s %-10s %10llu %-18s %10lld  %s\n", op.group().c_str(),
                static_cast<unsigned long long>(op.sequence_number()), op.op().c_str(),
                v1::DType_Name(op.dtype()).c_str(), static_cast<unsigned long long>(op.count()),
                op.state().c_str(), static_cast<long long>(op.duration_us()), detail.c_str());
  }
  return 0;
}

}  // namespace collectived::collectivectl
