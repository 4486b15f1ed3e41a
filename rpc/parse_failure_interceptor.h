// A server interceptor that reports a request gRPC could not parse as INVALID_ARGUMENT naming
// the method, instead of what gRPC's generated handlers answer without a message (INTERNAL from
// synchronous handlers, UNIMPLEMENTED from callback ones): a malformed request is the client's
// fault, INTERNAL would page the operator and UNIMPLEMENTED would mislead the client.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

namespace collectived {

class ParseFailureInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

// The interceptor creators a server built with these rules needs (pass to
// ServerBuilder::experimental().SetInterceptorCreators).
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
ParseFailureInterceptors();

}  // namespace collectived
