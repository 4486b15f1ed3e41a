// ShmBuffer: a POSIX shared-memory segment created by a client and mapped into its address space,
// so that its sidecar can map the same pages (Session.RegisterBuffer) and run collectives on the
// client's tensors in place, without copying them.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/status.h"

namespace collectived {

// Owns one segment: the mapping and, until Unlink() or destruction, its name in /dev/shm.
//
// Thread-safety: name(), data() and size() never change and may be called from any thread.
// Unlink() must not race with itself or with the destructor. What threads do with the bytes
// behind data() is up to them (the sidecar writes into them while an op runs).
class ShmBuffer {
 public:
  // Creates a new segment of exactly `bytes` bytes with a fresh name
  // ("/collectived-<pid>-<counter>-<random>", O_CREAT|O_EXCL, mode 0600: only processes of the
  // same user, or root, can open it), reserves its memory and maps it read-write and shared.
  // The memory is zero-filled.
  //
  // Returns the buffer on success; the caller owns it. On failure nothing is left behind (no
  // name in /dev/shm, no mapping) and it returns:
  //  - InvalidArgument for `bytes` == 0 or a size no file or address space can hold;
  //  - Unavailable, with the system's reason, when the segment cannot be created, sized or
  //    mapped; "No space left on device" means /dev/shm is too small (containers: --shm-size
  //    or a memory-backed emptyDir).
  // Never throws.
  static StatusOr<std::unique_ptr<ShmBuffer>> Create(size_t bytes);

  // Unmaps the memory and removes the name unless Unlink() already did. Other processes that
  // mapped the segment (the sidecar) keep their mapping; the memory is freed when the last
  // mapping goes.
  ~ShmBuffer();

  ShmBuffer(const ShmBuffer&) = delete;
  ShmBuffer& operator=(const ShmBuffer&) = delete;

  // The name as given to shm_open (starts with '/'); it stays the same after Unlink().
  const std::string& name() const { return name_; }
  // Start of the mapping, aligned to a page; valid for size() bytes until destruction.
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

  // Removes the name from /dev/shm now, keeping the mapping. Once the sidecar has mapped the
  // segment nobody needs the name any more, and without it a client killed by SIGKILL leaks no
  // memory. Returns OK (also when already unlinked) or Unavailable with the system's reason.
  Status Unlink();
  bool linked() const { return linked_; }

 private:
  ShmBuffer(std::string name, std::byte* data, size_t size)
      : name_(std::move(name)), data_(data), size_(size) {}

  const std::string name_;
  std::byte* const data_;
  const size_t size_;
  bool linked_ = true;
};

}  // namespace collectived
