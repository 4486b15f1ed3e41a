#include "engine/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace collectived {

StatusOr<std::shared_ptr<ShmSegment>> ShmSegment::Open(const std::string& name,
                                                       size_t expected_size) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() > 255) {
    return Status::InvalidArgument("shared-memory name '" + name +
                                   "' must look like /name (one leading slash, at most 255 bytes)");
  }
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    int error = errno;
    if (error == ENOENT) {
      return Status::NotFound("shared-memory segment '" + name + "' does not exist");
    }
    return Status::Unavailable("cannot open shared-memory segment '" + name +
                               "': " + std::strerror(error));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    int error = errno;
    close(fd);
    return Status::Unavailable("cannot stat shared-memory segment '" + name +
                               "': " + std::strerror(error));
  }
  size_t size = static_cast<size_t>(info.st_size);
  if (size == 0 || size < expected_size) {
    close(fd);
    return Status::InvalidArgument("shared-memory segment '" + name + "' has " +
                                   std::to_string(size) + " bytes, fewer than the " +
                                   std::to_string(expected_size) + " announced");
  }
  void* data = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    int error = errno;
    close(fd);
    return Status::Unavailable("cannot map shared-memory segment '" + name +
                               "': " + std::strerror(error));
  }
  return std::shared_ptr<ShmSegment>(new ShmSegment(name, fd, static_cast<std::byte*>(data), size));
}

ShmSegment::~ShmSegment() {
  munmap(data_, size_);
  close(fd_);
}

Status ShmSegment::CheckBacked(size_t end) const {
  struct stat info {};
  if (fstat(fd_, &info) != 0) {
    return Status::Unavailable("cannot stat shared-memory segment '" + name_ +
                               "': " + std::strerror(errno));
  }
  const size_t now = static_cast<size_t>(info.st_size);
  if (now >= end) return Status::Ok();
  return Status::InvalidArgument("shared-memory segment '" + name_ + "' shrank to " +
                                 std::to_string(now) + " bytes after it was registered with " +
                                 std::to_string(size_) + ": bytes up to " + std::to_string(end) +
                                 " are no longer backed (a client must not truncate a "
                                 "registered segment)");
}

StatusOr<TensorView> ShmSegment::View(size_t offset, size_t length, DType dtype, size_t count) {
  size_t element = DTypeSize(dtype);
  if (element == 0) return Status::InvalidArgument("tensor in '" + name_ + "' has no dtype");
  if (count > size_ / element || length != count * element) {
    return Status::InvalidArgument("tensor in '" + name_ + "': length " + std::to_string(length) +
                                   " bytes does not match " + std::to_string(count) + " x " +
                                   std::string(DTypeName(dtype)));
  }
  if (offset > size_ || length > size_ - offset) {
    return Status::InvalidArgument("tensor range [" + std::to_string(offset) + ", " +
                                   std::to_string(offset) + "+" + std::to_string(length) +
                                   ") is outside shared-memory segment '" + name_ + "' of " +
                                   std::to_string(size_) + " bytes");
  }
  if (offset % element != 0) {
    return Status::InvalidArgument("tensor offset " + std::to_string(offset) + " in '" + name_ +
                                   "' is not aligned to its dtype " +
                                   std::string(DTypeName(dtype)));
  }
  COLLECTIVED_RETURN_IF_ERROR(CheckBacked(offset + length));
  return TensorView{dtype, count, data_ + offset, shared_from_this(), Device{}};
}

}  // namespace collectived
