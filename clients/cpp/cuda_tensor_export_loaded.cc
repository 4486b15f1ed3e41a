// The CUDA tensor export of a library that links no CUDA library: libcollectived_cuda.so, next
// to the library this file is built into, is opened at the first call that needs CUDA, and every
// call goes through its CudaExportTable. Until then (and for ever in a process that passes no
// CUDA tensor) no CUDA library is loaded; where it cannot be opened (no CUDA runtime on the
// machine), every export fails with the loader's words.
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "clients/cpp/cuda_export_table.h"

namespace collectived {
namespace {

struct Loaded {
  const CudaExportTable* table = nullptr;
  std::string why;  // when table is null
};

// The directory of the library this function is in, with a trailing '/'; "" when unknown.
std::string OwnDirectory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&OwnDirectory), &info) == 0 || info.dli_fname == nullptr) {
    return "";
  }
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

const Loaded& Load() {
  static Loaded loaded;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string path = OwnDirectory() + "libcollectived_cuda.so";
    void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* error = dlerror();
      loaded.why = "cannot load " + path + ": " + (error != nullptr ? error : "unknown error");
      return;
    }
    using TableOf = const CudaExportTable* (*)();
    auto table_of = reinterpret_cast<TableOf>(dlsym(library, "collectived_cuda_export_table"));
    const CudaExportTable* table = table_of != nullptr ? table_of() : nullptr;
    if (table == nullptr || table->version != kCudaExportTableVersion ||
        table->size != sizeof(CudaExportTable)) {
      loaded.why = path + " is not of this build (its CUDA export table differs)";
      return;  // the library stays loaded: unloading what may have started threads is unsafe
    }
    loaded.table = table;
  });
  return loaded;
}

Status NoCuda() {
  return Status::InvalidArgument("this client cannot export CUDA tensors: " + Load().why);
}

// The table only where it was loaded already: for the calls that give back what an earlier
// call took (nothing to give back when it never loaded) and for diagnostics.
const CudaExportTable* LoadedAlready() {
  return Load().table;
}

}  // namespace

bool ClientHasCuda() {
  const CudaExportTable* table = Load().table;
  return table != nullptr && table->client_has_cuda();
}

void ReleaseReadyEvent(int device, size_t slot) {
  if (const CudaExportTable* table = LoadedAlready()) table->release_ready_event(device, slot);
}

size_t LeasedReadyEvents(int device) {
  const CudaExportTable* table = LoadedAlready();
  return table != nullptr ? table->leased_ready_events(device) : 0;
}

StatusOr<ReadyEventLease> LeaseReadyEvent(int device) {
  const CudaExportTable* table = Load().table;
  if (table == nullptr) return NoCuda();
  return table->lease_ready_event(device);
}

StatusOr<CudaPointerFacts> InspectCudaPointer(const void* data, int device) {
  const CudaExportTable* table = Load().table;
  if (table == nullptr) return NoCuda();
  return table->inspect_cuda_pointer(data, device);
}

StatusOr<ExportedCudaTensor> ExportCudaIpcTensor(const void* data, size_t bytes, int device,
                                                 void* stream, const CudaPointerFacts& facts,
                                                 ReadyEventLease* lease) {
  const CudaExportTable* table = Load().table;
  if (table == nullptr) return NoCuda();
  return table->export_cuda_ipc_tensor(data, bytes, device, stream, facts, lease);
}

StatusOr<ExportedCudaTensor> ExportCudaTensor(const void* data, size_t bytes, int device,
                                              void* stream, CudaVmmRegistrar* vmm,
                                              ReadyEventLease* lease) {
  const CudaExportTable* table = Load().table;
  if (table == nullptr) return NoCuda();
  return table->export_cuda_tensor(data, bytes, device, stream, vmm, lease);
}

StatusOr<bool> IsCudaVmmMemory(const void* data, int device) {
  const CudaExportTable* table = Load().table;
  if (table == nullptr) return Status::Unavailable(NoCuda().message());
  return table->is_cuda_vmm_memory(data, device);
}

StatusOr<std::vector<CudaVmmChunk>> FindCudaVmmChunks(const void* data, size_t bytes, int device) {
  const CudaExportTable* table = Load().table;
  if (table == nullptr) return NoCuda();
  return table->find_cuda_vmm_chunks(data, bytes, device);
}

StatusOr<int> ExportCudaVmmChunk(const CudaVmmChunk& chunk, int device) {
  const CudaExportTable* table = Load().table;
  if (table == nullptr) return NoCuda();
  return table->export_cuda_vmm_chunk(chunk, device);
}

bool CudaVmmChunkMapped(const CudaVmmChunk& chunk, int device) {
  const CudaExportTable* table = LoadedAlready();
  return table == nullptr || table->cuda_vmm_chunk_mapped(chunk, device);
}

void ReleaseCudaVmmChunk(const CudaVmmChunk& chunk, int device) {
  if (const CudaExportTable* table = LoadedAlready()) table->release_cuda_vmm_chunk(chunk, device);
}

StatusOr<std::string> RecordCudaEvent(int device, void* stream, ReadyEventLease* lease) {
  const CudaExportTable* table = Load().table;
  if (table == nullptr) return NoCuda();
  return table->record_cuda_event(device, stream, lease);
}

Status WaitForSidecarEvent(int device, void* stream, const std::string& event_handle) {
  const CudaExportTable* table = Load().table;
  if (table == nullptr) return NoCuda();
  return table->wait_for_sidecar_event(device, stream, event_handle);
}

Status RegisterSignalWords(void* data, size_t bytes, int device) {
  const CudaExportTable* table = Load().table;
  if (table == nullptr) return Status::Unavailable(NoCuda().message());
  return table->register_signal_words(data, bytes, device);
}

void UnregisterSignalWords(void* data) {
  if (const CudaExportTable* table = LoadedAlready()) table->unregister_signal_words(data);
}

Status WaitForSignal(int device, void* stream, const uint32_t* word, uint32_t value) {
  const CudaExportTable* table = Load().table;
  if (table == nullptr) return Status::Unavailable(NoCuda().message());
  return table->wait_for_signal(device, stream, word, value);
}

}  // namespace collectived
