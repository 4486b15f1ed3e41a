// Statuses from the CUDA runtime's and NCCL's error codes, with the library's own words in the
// message ("what: cudaErrorInvalidValue (invalid argument)"). Only the GPU backend includes this.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <string_view>

#include "engine/vocabulary/status.h"

namespace collectived {

// OK for cudaSuccess; otherwise a status of `kind` (Internal unless the caller knows better)
// whose message names `what` and the CUDA error, and the thread's pending CUDA error is cleared
// (cudaGetLastError), so that a later launch does not report this failure as its own.
Status CudaStatus(cudaError_t error, std::string_view what, ErrorKind kind = ErrorKind::kInternal);

// OK for ncclSuccess and ncclInProgress; PeerLost for ncclRemoteError and ncclSystemError (a
// peer or its connection failed), InvalidArgument for ncclInvalidArgument and ncclInvalidUsage,
// Internal otherwise. The message names `what`, NCCL's error string and, when there is one,
// `comm`'s last error.
Status NcclStatus(ncclResult_t result, std::string_view what, ncclComm_t comm = nullptr);

// Appended to the error of memory the legacy CUDA IPC API would not share or open, on both
// sides (the client's export, the sidecar's open): what such memory is and the setting that
// avoids it.
inline constexpr char kLegacyIpcHint[] =
    " (VMM allocations, such as PyTorch's expandable_segments, cannot be shared through the "
    "legacy CUDA IPC API: run the trainer with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False)";

}  // namespace collectived
