// NcclStatus (cuda_errors.h), in a file of its own so that what links only the CUDA runtime's half
// (the Python client's libcollectived_cuda.so) does not need libnccl.
#include <string>

#include "engine/cuda/cuda_errors.h"

namespace collectived {

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
