#include "clients/cpp/cuda_export_table.h"

namespace collectived {
namespace {

const CudaExportTable kTable = {
    kCudaExportTableVersion, sizeof(CudaExportTable), &ClientHasCuda,      &ReleaseReadyEvent,
    &LeasedReadyEvents,      &LeaseReadyEvent,        &InspectCudaPointer, &ExportCudaIpcTensor,
    &ExportCudaTensor,       &IsCudaVmmMemory,        &FindCudaVmmChunks,  &ExportCudaVmmChunk,
    &CudaVmmChunkMapped,     &ReleaseCudaVmmChunk,    &RecordCudaEvent,    &WaitForSidecarEvent,
    &RegisterSignalWords,    &UnregisterSignalWords,  &WaitForSignal,
};

}  // namespace
}  // namespace collectived

extern "C" const collectived::CudaExportTable* collectived_cuda_export_table() {
  return &collectived::kTable;
}
