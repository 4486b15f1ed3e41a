// Statuses from the CUDA runtime's and NCCL's error codes, with the library's own words in the
// message ("what: cudaErrorInvalidValue (invalid argument)"). Only the GPU backend includes this.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string_view>

#include "engine/status.h"

namespace collectived {

// OK for cudaSuccess; otherwise a status of `kind` (Internal unless the caller knows better)
// whose message names `what` and the CUDA error.
Status CudaStatus(cudaError_t error, std::string_view what, ErrorKind kind = ErrorKind::kInternal);

// OK for ncclSuccess and ncclInProgress; PeerLost for ncclRemoteError and ncclSystemError (a
// peer or its connection failed), InvalidArgument for ncclInvalidArgument and ncclInvalidUsage,
// Internal otherwise. The message names `what`, NCCL's error string and, when there is one,
// `comm`'s last error.
Status NcclStatus(ncclResult_t result, std::string_view what, ncclComm_t comm = nullptr);

}  // namespace collectived
