#include "engine/cuda/cuda_ipc_opener.h"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "engine/cuda/cuda_allocation.h"
#include "engine/cuda/cuda_driver_calls.h"
#include "engine/cuda/cuda_errors.h"
#include "engine/cuda/cuda_ipc_event.h"

namespace collectived {

StatusOr<IpcOpener::Allocation> CudaIpcOpener::OpenMemory(int device, std::string_view handle) {
  cudaIpcMemHandle_t ipc{};
  if (handle.size() != sizeof(ipc)) {
    return Status::InvalidArgument("CUDA IPC memory handle of " + std::to_string(handle.size()) +
                                   " bytes; cudaIpcMemHandle_t has " + std::to_string(sizeof(ipc)));
  }
  std::memcpy(&ipc, handle.data(), sizeof(ipc));
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device),
                                         "cudaSetDevice(" + std::to_string(device) + ")",
                                         ErrorKind::kInvalidArgument));
  void* base = nullptr;
  const cudaError_t opened = cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess) {
    Status status =
        CudaStatus(opened, "opening the CUDA IPC memory handle", ErrorKind::kInvalidArgument);
    return Status::InvalidArgument(status.message() + kLegacyIpcHint);
  }
  StatusOr<CudaAllocation> allocation = FindCudaAllocation(base);
  if (!allocation.ok()) {
    cudaIpcCloseMemHandle(base);
    return Status::Internal("the CUDA driver did not report the size of a shared allocation: " +
                            allocation.status().message());
  }
  // The handle names the start of the allocation; whatever precedes `base` is not the client's.
  const size_t before = static_cast<size_t>(static_cast<std::byte*>(base) - allocation->base);
  return Allocation{static_cast<std::byte*>(base), allocation->bytes - before};
}

void CudaIpcOpener::CloseMemory(int device, const Allocation& allocation) {
  cudaSetDevice(device);
  cudaIpcCloseMemHandle(allocation.base);
}

StatusOr<std::shared_ptr<DeviceEvent>> CudaIpcOpener::OpenEvent(int device,
                                                                std::string_view handle) {
  StatusOr<std::shared_ptr<CudaIpcEvent>> event = CudaIpcEvent::Open(device, handle);
  if (!event.ok()) return event.status();
  return std::shared_ptr<DeviceEvent>(*event);
}

namespace {

// The driver's VMM calls with `device` current; InvalidArgument when there are none.
StatusOr<const CudaDriverCalls*> VmmOn(int device) {
  StatusOr<const CudaDriverCalls*> driver = DriverCalls();
  if (!driver.ok()) return Status::InvalidArgument(driver.status().message());
  COLLECTIVED_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device),
                                         "cudaSetDevice(" + std::to_string(device) + ")",
                                         ErrorKind::kInvalidArgument));
  return driver;
}

}  // namespace

StatusOr<IpcOpener::VmmImport> CudaIpcOpener::ImportVmm(int device, int fd, uint64_t bytes) {
  StatusOr<const CudaDriverCalls*> found = VmmOn(device);
  if (!found.ok()) {
    close(fd);
    return found.status();
  }
  const CudaDriverCalls& cu = **found;
  CUmemGenericAllocationHandle handle = 0;
  const CUresult imported =
      cu.import_from_shareable_handle(&handle, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  close(fd);  // the imported handle holds the memory now
  COLLECTIVED_RETURN_IF_ERROR(CuStatus(imported, "importing the VMM allocation's file descriptor",
                                       ErrorKind::kInvalidArgument));
  // The size is the client's word: it must be a multiple of the granularity and the allocation
  // must hold it, which a trial mapping of that size checks (cuMemMap refuses to map past the end).
  Status checked;
  CUmemAllocationProp props{};
  size_t granularity = 0;
  checked = CuStatus(cu.get_allocation_properties(&props, handle),
                     "reading the VMM allocation's properties", ErrorKind::kInvalidArgument);
  if (checked.ok()) {
    checked = CuStatus(
        cu.get_allocation_granularity(&granularity, &props, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "reading the VMM allocation's granularity", ErrorKind::kInvalidArgument);
  }
  if (checked.ok() && (granularity == 0 || bytes % granularity != 0)) {
    checked = Status::InvalidArgument("size " + std::to_string(bytes) +
                                      " is not a multiple of the allocation granularity " +
                                      std::to_string(granularity));
  }
  if (checked.ok()) {
    CUdeviceptr trial = 0;
    checked = CuStatus(cu.address_reserve(&trial, bytes, 0, 0, 0),
                       "reserving " + std::to_string(bytes) + " bytes of address space",
                       ErrorKind::kInvalidArgument);
    if (checked.ok()) {
      const CUresult mapped = cu.map(trial, bytes, 0, handle, 0);
      if (mapped == CUDA_SUCCESS) {
        cu.unmap(trial, bytes);
      } else {
        checked = CuStatus(mapped,
                           "the allocation does not hold the " + std::to_string(bytes) +
                               " bytes the client gave as its size",
                           ErrorKind::kInvalidArgument);
      }
      cu.address_free(trial, bytes);
    }
  }
  if (!checked.ok()) {
    cu.release(handle);
    return checked;
  }
  return VmmImport{static_cast<uint64_t>(handle), static_cast<size_t>(bytes)};
}

void CudaIpcOpener::ReleaseVmm(int device, const VmmImport& import) {
  StatusOr<const CudaDriverCalls*> cu = VmmOn(device);
  if (cu.ok()) (*cu)->release(static_cast<CUmemGenericAllocationHandle>(import.handle));
}

StatusOr<IpcOpener::Allocation> CudaIpcOpener::MapVmm(int device,
                                                      const std::vector<VmmImport>& parts) {
  StatusOr<const CudaDriverCalls*> found = VmmOn(device);
  if (!found.ok()) return found.status();
  const CudaDriverCalls& cu = **found;
  size_t total = 0;
  for (const VmmImport& part : parts) {
    if (part.bytes > SIZE_MAX - total) {
      return Status::InvalidArgument("the VMM allocations' sizes overflow the address space");
    }
    total += part.bytes;
  }
  if (total == 0) return Status::InvalidArgument("no VMM allocation to map");
  CUdeviceptr base = 0;
  COLLECTIVED_RETURN_IF_ERROR(
      CuStatus(cu.address_reserve(&base, total, 0, 0, 0),
               "reserving " + std::to_string(total) + " bytes of address space for VMM memory",
               ErrorKind::kResourceExhausted));
  size_t mapped = 0;
  Status status;
  for (const VmmImport& part : parts) {
    status = CuStatus(cu.map(base + mapped, part.bytes, 0,
                             static_cast<CUmemGenericAllocationHandle>(part.handle), 0),
                      "mapping a VMM allocation of " + std::to_string(part.bytes) + " bytes",
                      ErrorKind::kInvalidArgument);
    if (!status.ok()) break;
    mapped += part.bytes;
  }
  if (status.ok()) {
    CUmemAccessDesc access{};
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    status =
        CuStatus(cu.set_access(base, total, &access, 1),
                 "making the VMM mapping readable and writable by device " + std::to_string(device),
                 ErrorKind::kInvalidArgument);
  }
  if (!status.ok()) {
    if (mapped > 0) cu.unmap(base, mapped);
    cu.address_free(base, total);
    return status;
  }
  return Allocation{reinterpret_cast<std::byte*>(base), total};
}

void CudaIpcOpener::UnmapVmm(int device, const Allocation& mapping) {
  StatusOr<const CudaDriverCalls*> cu = VmmOn(device);
  if (!cu.ok()) return;
  // No view holds the mapping: every op that used it completed (as for CloseMemory).
  const CUdeviceptr base = reinterpret_cast<CUdeviceptr>(mapping.base);
  (*cu)->unmap(base, mapping.bytes);
  (*cu)->address_free(base, mapping.bytes);
}

}  // namespace collectived
