// The CUDA IPC handles a trainer has made, by allocation, so that cudaIpcGetMemHandle (a call
// into the driver) runs once per allocation instead of once per op. An allocation is named by
// its device, its base and the driver's buffer id (CU_POINTER_ATTRIBUTE_BUFFER_ID, unique
// within the process for as long as the process lives), so memory freed and allocated again at
// the same address is a miss, never a stale handle.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>

namespace collectived {

class IpcHandleCache {
 public:
  // Buffer id 0: the driver gave none, and nothing is cached.
  static constexpr uint64_t kNoBufferId = 0;

  explicit IpcHandleCache(size_t capacity = 4096);

  // The handle made for this allocation, if it is cached.
  std::optional<std::string> Find(int device, uint64_t base, uint64_t bytes, uint64_t buffer_id);
  // Caches `handle` for the allocation, replacing what was cached at its base (older memory
  // there); past the capacity the least recently used entry goes.
  void Put(int device, uint64_t base, uint64_t bytes, uint64_t buffer_id, std::string handle);

  size_t size() const;

 private:
  using Key = std::tuple<int, uint64_t>;  // device, base
  struct Entry {
    uint64_t bytes;
    uint64_t buffer_id;
    std::string handle;
    uint64_t last_used;
  };

  const size_t capacity_;
  mutable std::mutex mutex_;
  std::map<Key, Entry> entries_;  // guarded by mutex_
  uint64_t clock_ = 0;            // guarded by mutex_
};

}  // namespace collectived
