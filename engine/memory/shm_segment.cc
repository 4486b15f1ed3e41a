#include "engine/memory/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "engine/memory/mapping_fault_guard.h"

namespace collectived {
namespace {

constexpr size_t kNoGuard = std::numeric_limits<size_t>::max();

}  // namespace

StatusOr<std::shared_ptr<ShmSegment>> ShmSegment::Adopt(int fd, size_t expected_size,
                                                        std::string what) {
  if (fd < 0) return Status::InvalidArgument(what + ": no file descriptor was passed");
  auto refuse = [&](Status status) {
    close(fd);
    return status;
  };
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    return refuse(Status::InvalidArgument(
        what + ": the file descriptor cannot be inspected: " + std::strerror(errno)));
  }
  if (!S_ISREG(info.st_mode)) {
    return refuse(Status::InvalidArgument(
        what +
        ": the file descriptor is not a regular file (pass a memfd_create region or a "
        "shared-memory file, never a socket, pipe or device)"));
  }
  const int mode = fcntl(fd, F_GETFL);
  if (mode < 0 || (mode & O_ACCMODE) != O_RDWR) {
    return refuse(Status::InvalidArgument(
        what +
        ": the file descriptor is not open for reading and writing (collectives write "
        "their results in place)"));
  }
  const size_t size = static_cast<size_t>(info.st_size);
  if (size == 0 || size < expected_size) {
    return refuse(Status::InvalidArgument(what + ": the file has " + std::to_string(size) +
                                          " bytes, fewer than the " +
                                          std::to_string(expected_size) + " announced"));
  }
  // Only a memfd carries seals; for any other file F_GET_SEALS fails and the file is treated as
  // shrinkable.
  const int seals = fcntl(fd, F_GET_SEALS);
  const bool sealed = seals >= 0 && (seals & F_SEAL_SHRINK) != 0;
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    return refuse(Status::Unavailable(
        what + ": cannot map the file: " + std::strerror(error) +
        (error == EPERM ? " (a memfd sealed against writing cannot be used for collectives)"
                        : "")));
  }
  size_t guard = kNoGuard;
  if (!sealed) {
    StatusOr<size_t> slot = MappingFaultGuard::Guard(data, size);
    if (!slot.ok()) {
      munmap(data, size);
      return refuse(slot.status().WithContext(what));
    }
    guard = *slot;
  } else {
    // A mapping outlives its descriptor, and a sealed file cannot shrink: nothing needs the
    // descriptor any more, and a sidecar that kept one per buffer ran out of them.
    close(fd);
    fd = -1;
  }
  return std::shared_ptr<ShmSegment>(
      new ShmSegment(std::move(what), fd, static_cast<std::byte*>(data), size, sealed, guard));
}

ShmSegment::~ShmSegment() {
  attachment_.reset();  // a device registration of the pages goes before the pages do
  if (guard_slot_ != kNoGuard) MappingFaultGuard::Release(guard_slot_);
  munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

StatusOr<ShmSegment::Attachment> ShmSegment::Attach(
    const std::function<StatusOr<Attachment>(std::byte* data, size_t size)>& make) {
  std::lock_guard<std::mutex> lock(attachment_mutex_);
  if (!attachment_) {
    StatusOr<Attachment> made = make(data_, size_);
    if (!made.ok()) return made.status();
    attachment_ = std::move(*made);
  }
  return attachment_;
}

Status ShmSegment::CheckIntact() const {
  if (guard_slot_ == kNoGuard || !MappingFaultGuard::Faulted(guard_slot_)) return Status::Ok();
  return Status::InvalidArgument(what_ +
                                 ": its client shrank the file under an op (touching the lost "
                                 "pages raised SIGBUS, which the sidecar contained); the op's "
                                 "results are void and the buffer holds zeros from now on: "
                                 "unregister it (seal memfds with F_SEAL_SHRINK)");
}

Status ShmSegment::CheckBacked(size_t end) const {
  COLLECTIVED_RETURN_IF_ERROR(CheckIntact());
  if (sealed_) return Status::Ok();
  struct stat info {};
  if (fstat(fd_, &info) != 0) {
    return Status::Unavailable(what_ + ": cannot inspect its file: " + std::strerror(errno));
  }
  const size_t now = static_cast<size_t>(info.st_size);
  if (now >= end) return Status::Ok();
  return Status::InvalidArgument(what_ + ": its file shrank to " + std::to_string(now) +
                                 " bytes after it was registered with " + std::to_string(size_) +
                                 ": bytes up to " + std::to_string(end) +
                                 " are no longer backed (a client must not truncate a "
                                 "registered buffer; seal memfds with F_SEAL_SHRINK)");
}

StatusOr<TensorView> ShmSegment::View(size_t offset, size_t length, DType dtype, size_t count) {
  size_t element = DTypeSize(dtype);
  if (element == 0) return Status::InvalidArgument("tensor in " + what_ + " has no dtype");
  if (count > size_ / element || length != count * element) {
    return Status::InvalidArgument("tensor in " + what_ + ": length " + std::to_string(length) +
                                   " bytes does not match " + std::to_string(count) + " x " +
                                   std::string(DTypeName(dtype)));
  }
  if (offset > size_ || length > size_ - offset) {
    return Status::InvalidArgument("tensor range [" + std::to_string(offset) + ", " +
                                   std::to_string(offset) + "+" + std::to_string(length) +
                                   ") is outside " + what_ + " of " + std::to_string(size_) +
                                   " bytes");
  }
  if (offset % element != 0) {
    return Status::InvalidArgument("tensor offset " + std::to_string(offset) + " in " + what_ +
                                   " is not aligned to its dtype " + std::string(DTypeName(dtype)));
  }
  COLLECTIVED_RETURN_IF_ERROR(CheckBacked(offset + length));
  return TensorView{dtype, count, data_ + offset, shared_from_this(), Device{}, nullptr};
}

}  // namespace collectived
