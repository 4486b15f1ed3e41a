// collectivectl abort: fails a group's ops on every rank, with an admin or the job's token.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "collectived/v1/admin.grpc.pb.h"
#include "rpc/grpc_status.h"
#include "tools/collectivectl/commands.h"

namespace collectived::collectivectl {
namespace {

std::string TrimSpace(const std::string& text) {
  const char* space = " \t\r\n";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

}  // namespace

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

}  // namespace collectived::collectivectl
