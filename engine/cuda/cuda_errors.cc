#include "engine/cuda/cuda_errors.h"

#include <string>

namespace collectived {

Status CudaStatus(cudaError_t error, std::string_view what, ErrorKind kind) {
  if (error == cudaSuccess) return Status::Ok();
  return Status(kind, std::string(what) + ": " + cudaGetErrorName(error) + " (" +
                          cudaGetErrorString(error) + ")");
}

Status NcclStatus(ncclResult_t result, std::string_view what, ncclComm_t comm) {
  if (result == ncclSuccess || result == ncclInProgress) return Status::Ok();
  std::string message = std::string(what) + ": NCCL " + ncclGetErrorString(result);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && last[0] != '\0') message += " (" + std::string(last) + ")";
  }
  switch (result) {
    case ncclRemoteError:
    case ncclSystemError:
      return Status::PeerLost(message);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return Status::InvalidArgument(message);
    default:
      return Status::Internal(message);
  }
}

}  // namespace collectived
