#include "clients/cpp/shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

namespace collectived {

StatusOr<std::unique_ptr<ShmBuffer>> ShmBuffer::Create(size_t bytes) {
  if (bytes == 0) {
    return Status::InvalidArgument("a shared-memory buffer needs a positive size, got 0 bytes");
  }
  if (bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max()) ||
      bytes > static_cast<uint64_t>(std::numeric_limits<ptrdiff_t>::max())) {
    return Status::InvalidArgument("a shared-memory buffer of " + std::to_string(bytes) +
                                   " bytes is larger than any file or address space");
  }
  // A memfd has no size limit of its own (as /dev/shm had): reserving more than the machine
  // holds would run it out of memory instead of failing.
  const uint64_t machine =
      static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (bytes > machine) {
    return Status::Unavailable("cannot create a shared-memory buffer of " + std::to_string(bytes) +
                               " bytes: this machine has " + std::to_string(machine) +
                               " bytes of memory");
  }
  const int fd = memfd_create("collectived-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return Status::Unavailable(std::string("cannot create a memfd: ") + std::strerror(errno));
  }
  auto fail = [&](const std::string& what, int error) {
    close(fd);
    return Status::Unavailable(what + " a shared-memory buffer of " + std::to_string(bytes) +
                               " bytes: " + std::strerror(error));
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("cannot size", errno);
  // Pages are allocated lazily: without reserving them now, a memory limit would surface later
  // as SIGBUS on the first touch instead of as an error here.
  int error;
  do {
    error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (error == EINTR);
  if (error != 0 && error != EOPNOTSUPP && error != EINVAL) {
    return fail("cannot reserve memory for", error);
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail("cannot seal", errno);
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail("cannot map", errno);
  return std::unique_ptr<ShmBuffer>(new ShmBuffer(fd, static_cast<std::byte*>(data), bytes));
}

StatusOr<std::unique_ptr<ShmBuffer>> ShmBuffer::Map(int fd, size_t bytes) {
  if (bytes == 0) {
    return Status::InvalidArgument("a shared-memory buffer needs a positive size, got 0 bytes");
  }
  struct stat facts {};
  if (fstat(fd, &facts) != 0) {
    return Status::InvalidArgument("descriptor " + std::to_string(fd) +
                                   " is not a file: " + std::strerror(errno));
  }
  if (!S_ISREG(facts.st_mode) || facts.st_size < 0 ||
      static_cast<uint64_t>(facts.st_size) < bytes) {
    return Status::InvalidArgument(
        "descriptor " + std::to_string(fd) + " is not a shared-memory file of at least " +
        std::to_string(bytes) + " bytes (" +
        (S_ISREG(facts.st_mode) ? std::to_string(facts.st_size) + " bytes" : "not a file") + ")");
  }
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    return Status::Unavailable("cannot map " + std::to_string(bytes) + " bytes of descriptor " +
                               std::to_string(fd) + ": " + std::strerror(errno));
  }
  return std::unique_ptr<ShmBuffer>(new ShmBuffer(-1, static_cast<std::byte*>(data), bytes));
}

ShmBuffer::~ShmBuffer() {
  munmap(data_, size_);
  if (fd_ >= 0) close(fd_);
}

int ShmBuffer::TakeFd() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

}  // namespace collectived
