// How a service answers a call whose refusals are counted: the engine's Status becomes the gRPC
// status (ToGrpcStatus), and a refusal (PERMISSION_DENIED, UNAUTHENTICATED) is first counted in
// collectived_refused_calls_total under the call's method and logged (the method, the caller's
// listener and peer, the message: never a secret, which messages do not carry).
#pragma once

#include <grpcpp/grpcpp.h>

#include <string_view>

#include "engine/vocabulary/status.h"
#include "services/collectived/metrics.h"

namespace collectived {

// `method` is "Service.Method", a constant of the caller (see Metrics::CountRefusedCall).
grpc::Status Answer(Metrics& metrics, std::string_view method, const Status& status,
                    grpc::ServerContextBase* context);

}  // namespace collectived
