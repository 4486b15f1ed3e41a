#include "rpc/parse_failure_interceptor.h"

#include <google/protobuf/descriptor.h>

#include <string>

#include "engine/vocabulary/status.h"
#include "rpc/grpc_status.h"

namespace collectived {
namespace {

using grpc::experimental::InterceptionHookPoints;

// Whether `method` ("/package.Service/Method") is a method of a compiled-in service: only such a
// method has a request message that could fail to parse (an unknown method is UNIMPLEMENTED).
bool IsKnownMethod(const char* method) {
  std::string name = method ? method : "";
  if (name.size() < 2 || name[0] != '/') return false;
  name.erase(0, 1);
  const size_t slash = name.find('/');
  if (slash == std::string::npos) return false;
  name[slash] = '.';
  return google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(name) != nullptr;
}

// gRPC's answer when a request's bytes do not parse: INTERNAL from the synchronous handlers,
// UNIMPLEMENTED from the callback ones, both without a message. Our handlers always give one.
// gRPC's built-in health service (grpc.health.v1, not a compiled-in protobuf service) answers
// its own INTERNAL "could not parse request" to Watch.
bool IsParseFailure(const grpc::Status& status, const char* method) {
  const grpc::StatusCode code = status.error_code();
  if (code == grpc::StatusCode::INTERNAL && status.error_message() == "could not parse request") {
    return true;
  }
  return (code == grpc::StatusCode::INTERNAL || code == grpc::StatusCode::UNIMPLEMENTED) &&
         status.error_message().empty() && IsKnownMethod(method);
}

class ParseFailureInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit ParseFailureInterceptor(grpc::experimental::ServerRpcInfo* info) : info_(info) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      if (IsParseFailure(methods->GetSendStatus(), info_->method())) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            std::string("the request to ") + info_->method() +
                " could not be parsed as its protobuf message (malformed or truncated bytes)"));
        methods->GetSendTrailingMetadata()->emplace(
            kErrorKindMetadataKey, std::string(ErrorKindName(ErrorKind::kInvalidArgument)));
      }
    }
    methods->Proceed();
  }

 private:
  grpc::experimental::ServerRpcInfo* const info_;
};

}  // namespace

grpc::experimental::Interceptor* ParseFailureInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new ParseFailureInterceptor(info);
}

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
ParseFailureInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> creators;
  creators.push_back(std::make_unique<ParseFailureInterceptorFactory>());
  return creators;
}

}  // namespace collectived
