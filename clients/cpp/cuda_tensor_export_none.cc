#include "clients/cpp/cuda_tensor_export.h"

namespace collectived {

bool ClientHasCuda() {
  return false;
}

namespace {

constexpr char kNoCuda[] =
    "this client library was built without CUDA (no CUDA toolkit and NCCL at build time, or "
    "-DCOLLECTIVED_WITH_GPU=OFF): it cannot pass CUDA tensors";

}  // namespace

void ReleaseReadyEvent(int, size_t) {}

size_t LeasedReadyEvents(int) {
  return 0;
}

StatusOr<ReadyEventLease> LeaseReadyEvent(int) {
  return Status::InvalidArgument(kNoCuda);
}

StatusOr<ExportedCudaTensor> ExportCudaTensor(const void*, size_t, int, void*, CudaVmmRegistrar*,
                                              ReadyEventLease*) {
  return Status::InvalidArgument(kNoCuda);
}

StatusOr<CudaPointerFacts> InspectCudaPointer(const void*, int) {
  return Status::InvalidArgument(kNoCuda);
}

StatusOr<ExportedCudaTensor> ExportCudaIpcTensor(const void*, size_t, int, void*,
                                                 const CudaPointerFacts&, ReadyEventLease*) {
  return Status::InvalidArgument(kNoCuda);
}

StatusOr<bool> IsCudaVmmMemory(const void*, int) {
  return Status::Unavailable(kNoCuda);
}

StatusOr<std::vector<CudaVmmChunk>> FindCudaVmmChunks(const void*, size_t, int) {
  return Status::Unavailable(kNoCuda);
}

StatusOr<int> ExportCudaVmmChunk(const CudaVmmChunk&, int) {
  return Status::Unavailable(kNoCuda);
}

bool CudaVmmChunkMapped(const CudaVmmChunk&, int) {
  return true;
}

void ReleaseCudaVmmChunk(const CudaVmmChunk&, int) {}

StatusOr<std::string> RecordCudaEvent(int, void*, ReadyEventLease*) {
  return Status::InvalidArgument(kNoCuda);
}

Status WaitForSidecarEvent(int, void*, const std::string&) {
  return Status::InvalidArgument(
      "this client library was built without CUDA: it cannot wait on a sidecar's CUDA event");
}

Status RegisterSignalWords(void*, size_t, int) {
  return Status::Unavailable(kNoCuda);
}

void UnregisterSignalWords(void*) {}

Status WaitForSignal(int, void*, const uint32_t*, uint32_t) {
  return Status::Unavailable(kNoCuda);
}

}  // namespace collectived
