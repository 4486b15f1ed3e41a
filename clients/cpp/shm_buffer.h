// ShmBuffer: anonymous shared memory created by a client (a memfd) and mapped into its address
// space, so that its sidecar can map the same pages (the client passes the file descriptor over
// the session's fd channel) and run collectives on the client's tensors in place. The memory has
// no name anywhere: nothing is left behind in /dev/shm whatever happens to either process.
#pragma once

#include <cstddef>
#include <memory>

#include "engine/vocabulary/status.h"

namespace collectived {

// Owns one memfd region: its mapping and, until TakeFd(), its file descriptor.
//
// Thread-safety: data() and size() never change and may be called from any thread. TakeFd()
// must not race with itself or with the destructor. What threads do with the bytes behind data()
// is up to them (the sidecar writes into them while an op runs).
class ShmBuffer {
 public:
  // Creates a memfd of exactly `bytes` bytes (close-on-exec), reserves its memory, seals it
  // against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL: the sidecar can
  // then rely on its size and skips per-op size checks) and maps it read-write and shared. The
  // memory is zero-filled.
  //
  // Returns the buffer on success; the caller owns it. On failure nothing is left behind and it
  // returns:
  //  - InvalidArgument for `bytes` == 0 or a size no file or address space can hold;
  //  - Unavailable, with the system's reason, when the memory cannot be created, reserved or
  //    mapped ("No space left on device" or "Cannot allocate memory": the memory cgroup or
  //    tmpfs limit is reached).
  // Never throws.
  static StatusOr<std::unique_ptr<ShmBuffer>> Create(size_t bytes);

  // Maps the first `bytes` bytes of the caller's shared-memory file `fd` read-write and shared
  // (the caller keeps `fd`: fd() is -1). InvalidArgument for `bytes` == 0 or a file smaller than
  // `bytes` (what fstat says now: a file the caller shrinks later fails the ops that use it, in
  // the sidecar); Unavailable with the system's reason when it cannot be mapped. Never throws.
  static StatusOr<std::unique_ptr<ShmBuffer>> Map(int fd, size_t bytes);

  // Unmaps the memory and closes the file descriptor unless TakeFd() took it. A sidecar that
  // mapped it keeps its mapping; the memory is freed when the last mapping and fd go.
  ~ShmBuffer();

  ShmBuffer(const ShmBuffer&) = delete;
  ShmBuffer& operator=(const ShmBuffer&) = delete;

  // Start of the mapping, aligned to a page; valid for size() bytes until destruction.
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

  // The memfd, or -1 once taken.
  int fd() const { return fd_; }
  // Hands the memfd to the caller (who closes it); the mapping stays valid. Returns -1 when it
  // was taken already.
  int TakeFd();

 private:
  ShmBuffer(int fd, std::byte* data, size_t size) : fd_(fd), data_(data), size_(size) {}

  int fd_;
  std::byte* const data_;
  const size_t size_;
};

}  // namespace collectived
