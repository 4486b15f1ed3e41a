// ShmSegment: a POSIX shared-memory segment that a client created, mapped into the sidecar so
// collectives can work on the client's tensors in place. Sizes come from fstat, never from the
// client, so every range can be checked against what is really mapped.
//
// A client could still shrink the segment (ftruncate) after registering it; touching the pages
// past its new end would raise SIGBUS in the sidecar. View checks the segment's current size
// on every use and refuses a range that is no longer backed. A shrink between that check and the
// op's access is not caught here: that needs sealed memory (memfd with F_SEAL_SHRINK).
//
// Thread-safety: immutable after Open; share it through std::shared_ptr (an op in flight keeps
// the mapping alive after the client unregisters it).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/status.h"
#include "engine/tensor.h"

namespace collectived {

class ShmSegment : public std::enable_shared_from_this<ShmSegment> {
 public:
  // Opens and maps the segment `name` (as given to shm_open, e.g. "/collectived-12-0") read-write.
  // Returns InvalidArgument for a malformed name, NotFound if it does not exist, InvalidArgument
  // if its real size is smaller than `expected_size` (0 = any non-empty size), and Unavailable
  // with the system's reason when it cannot be opened or mapped.
  static StatusOr<std::shared_ptr<ShmSegment>> Open(const std::string& name, size_t expected_size);

  ~ShmSegment();
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  const std::string& name() const { return name_; }
  size_t size() const { return size_; }

  // A view of [offset, offset + count * size(dtype)). Returns InvalidArgument if the range is
  // outside the segment, overflows, `offset` is not aligned to the dtype's size, or the client
  // shrank the segment so that the range is no longer backed.
  StatusOr<TensorView> View(size_t offset, size_t length, DType dtype, size_t count);

 private:
  ShmSegment(std::string name, int fd, std::byte* data, size_t size)
      : name_(std::move(name)), fd_(fd), data_(data), size_(size) {}

  // OK if the segment's current size still covers [0, end).
  Status CheckBacked(size_t end) const;

  const std::string name_;
  const int fd_;  // kept open to see the segment's current size
  std::byte* const data_;
  const size_t size_;
};

}  // namespace collectived
