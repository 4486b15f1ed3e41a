#include "engine/cuda/cuda_errors.h"

#include <string>

namespace collectived {

Status CudaStatus(cudaError_t error, std::string_view what, ErrorKind kind) {
  if (error == cudaSuccess) return Status::Ok();
  return Status(kind, std::string(what) + ": " + cudaGetErrorName(error) + " (" +
                          cudaGetErrorString(error) + ")");
}

}  // namespace collectived
