#include "clients/cpp/cuda_tensor_export.h"

namespace collectived {

bool ClientHasCuda() {
  return false;
}

StatusOr<ExportedCudaTensor> ExportCudaTensor(const void*, size_t, int, void*) {
  return Status::InvalidArgument(
      "this client library was built without CUDA (no CUDA toolkit and NCCL at build time, or "
      "-DCOLLECTIVED_WITH_GPU=OFF): it cannot pass CUDA tensors");
}

Status WaitForSidecarEvent(int, void*, const std::string&) {
  return Status::InvalidArgument(
      "this client library was built without CUDA: it cannot wait on a sidecar's CUDA event");
}

}  // namespace collectived
