#include "engine/cuda/cuda_errors.h"

#include <string>

namespace collectived {

Status CudaStatus(cudaError_t error, std::string_view what, ErrorKind kind) {
  if (error == cudaSuccess) return Status::Ok();
  // A failed call leaves its error pending on the thread, where the next kernel launch's check
  // (cudaGetLastError) would report it as its own: this status reports it, so it is taken.
  cudaGetLastError();
  return Status(kind, std::string(what) + ": " + cudaGetErrorName(error) + " (" +
                          cudaGetErrorString(error) + ")");
}

}  // namespace collectived
