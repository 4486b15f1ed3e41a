// ShmSegment: memory a client handed the sidecar as a file descriptor (a memfd, or the fd
// behind a torch shared storage), mapped so that collectives work on the client's tensors in
// place. The sidecar never opens memory by name: it maps only what a client already holds. Sizes
// come from fstat, never from the client, so every range is checked against what is mapped.
//
// A client may still shrink its file after handing it over, unless it sealed a memfd against
// shrinking (F_SEAL_SHRINK). For a segment without that seal, View checks the file's current
// size on every use, and the mapping is guarded (MappingFaultGuard): a shrink that races an op
// turns the mapping into zeros and marks the segment faulted, and CheckIntact fails the op. The
// sidecar never dies of SIGBUS.
//
// Thread-safety: immutable after Adopt apart from the fault flag and the attachment (Attach is
// thread-safe); share it through
// std::shared_ptr (an op in flight keeps the mapping alive after the client unregisters it).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "engine/vocabulary/status.h"
#include "engine/vocabulary/tensor.h"

namespace collectived {

class ShmSegment : public std::enable_shared_from_this<ShmSegment> {
 public:
  // Takes ownership of `fd` (closed on failure too) and maps the whole file read-write and
  // shared. `what` names the segment in messages ("buffer 3 of session s17"). Refused with
  // InvalidArgument: an fd that is not open, not a regular file (a memfd or a tmpfs/shm file),
  // not open for reading and writing, an empty file, or one smaller than `expected_size`
  // (0 = any size). Unavailable with the system's reason when it cannot be mapped;
  // ResourceExhausted when no fault guard is left for an unsealed file.
  static StatusOr<std::shared_ptr<ShmSegment>> Adopt(int fd, size_t expected_size,
                                                     std::string what);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& what() const { return what_; }
  size_t size() const { return size_; }
  // True when the client sealed the memfd against shrinking: no check is needed on use, and the
  // segment keeps no file descriptor.
  bool sealed() const { return sealed_; }

  // A view of [offset, offset + count * size(dtype)). Returns InvalidArgument if the range is
  // outside the segment, overflows, `offset` is not aligned to the dtype's size, the client
  // shrank the file so that the range is no longer backed, or a shrink already faulted it.
  StatusOr<TensorView> View(size_t offset, size_t length, DType dtype, size_t count);

  // OK unless the client shrank the file under an op that used this segment (after which the
  // mapping holds zeros): the op's results are void and it must fail with this error.
  Status CheckIntact() const;

  // The start of the mapping (page-aligned), for registering it with a device.
  std::byte* data() const { return data_; }

  // Something tied to the mapping's life, made once by the first caller's `make(data(),
  // size())` (a registration of the pages with a device: CUDA's cudaHostRegister) and dropped
  // before the mapping goes. A failed `make` is returned and tried again by the next caller.
  using Attachment = std::shared_ptr<void>;
  StatusOr<Attachment> Attach(
      const std::function<StatusOr<Attachment>(std::byte* data, size_t size)>& make);

 private:
  ShmSegment(std::string what, int fd, std::byte* data, size_t size, bool sealed, size_t guard)
      : what_(std::move(what)),
        fd_(fd),
        data_(data),
        size_(size),
        sealed_(sealed),
        guard_slot_(guard) {}

  // OK if the file's current size still covers [0, end).
  Status CheckBacked(size_t end) const;

  const std::string what_;
  const int fd_;  // kept open to see the file's current size; -1 when sealed (closed at once)
  std::byte* const data_;
  const size_t size_;
  const bool sealed_;
  const size_t guard_slot_;  // MappingFaultGuard slot; kNoGuard when sealed
  std::mutex attachment_mutex_;
  Attachment attachment_;  // guarded by attachment_mutex_
};

}  // namespace collectived
