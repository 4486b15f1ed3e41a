#include "tests/sidecar/device_block.h"

#ifdef COLLECTIVED_WITH_NCCL
#include <cuda_runtime_api.h>

#include "engine/cuda/cuda_errors.h"
#endif

namespace collectived::sidecar_test {

#ifdef COLLECTIVED_WITH_NCCL

StatusOr<std::shared_ptr<DeviceBlock>> DeviceBlock::Allocate(int device, size_t bytes,
                                                             const void* init) {
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  void* data = nullptr;
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&data, bytes == 0 ? 1 : bytes), "cudaMalloc"));
  auto block =
      std::shared_ptr<DeviceBlock>(new DeviceBlock(device, static_cast<std::byte*>(data), bytes));
  if (bytes != 0) {
    COLLECTIVED_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(data, init, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to device"));
    // From pageable memory the copy may return before the device has the bytes: a stream that
    // does not wait for the legacy default stream (DeviceStream) must find them there.
    COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  }
  return block;
}

DeviceBlock::~DeviceBlock() {
  cudaSetDevice(device_);
  cudaFree(data_);
}

StatusOr<std::unique_ptr<DeviceStream>> DeviceStream::Create(int device) {
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  cudaStream_t stream = nullptr;
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                         "cudaStreamCreateWithFlags"));
  return std::unique_ptr<DeviceStream>(new DeviceStream(device, stream));
}

DeviceStream::~DeviceStream() {
  cudaSetDevice(device_);
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Status CopyFromDevice(int device, const void* source, void* target, size_t bytes) {
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  if (bytes == 0) return Status::Ok();
  return CudaStatus(cudaMemcpy(target, source, bytes, cudaMemcpyDeviceToHost),
                    "cudaMemcpy from device");
}

#else

namespace {
Status NoCuda() {
  return Status::InvalidArgument("built without the GPU backend: no CUDA");
}
}  // namespace

StatusOr<std::shared_ptr<DeviceBlock>> DeviceBlock::Allocate(int, size_t, const void*) {
  return NoCuda();
}

DeviceBlock::~DeviceBlock() = default;

StatusOr<std::unique_ptr<DeviceStream>> DeviceStream::Create(int) {
  return NoCuda();
}

DeviceStream::~DeviceStream() = default;

Status CopyFromDevice(int, const void*, void*, size_t) {
  return NoCuda();
}

#endif

}  // namespace collectived::sidecar_test
