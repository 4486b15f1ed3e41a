#include "clients/cpp/shm_buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>

namespace collectived {
namespace {

constexpr int kCreateAttempts = 8;

uint32_t RandomSuffix() {
  uint32_t value = 0;
  if (getrandom(&value, sizeof(value), GRND_NONBLOCK) == static_cast<ssize_t>(sizeof(value))) {
    return value;
  }
  // Early boot without entropy: the pid and counter already make the name unique among live
  // processes; the clock only guards against a stale segment left by a recycled pid.
  return static_cast<uint32_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

std::string NewName() {
  static std::atomic<uint64_t> counter{0};
  char name[64];
  std::snprintf(name, sizeof(name), "/collectived-%ld-%llu-%08x", static_cast<long>(getpid()),
                static_cast<unsigned long long>(counter.fetch_add(1)), RandomSuffix());
  return name;
}

std::string SystemError(int error) {
  return std::strerror(error);
}

// " (/dev/shm has N bytes free)", to make an out-of-space failure self-explanatory.
std::string FreeSpaceHint() {
  struct statvfs info {};
  if (statvfs("/dev/shm", &info) != 0) return "";
  unsigned long long free_bytes = static_cast<unsigned long long>(info.f_bavail) *
                                  static_cast<unsigned long long>(info.f_frsize);
  return " (/dev/shm has " + std::to_string(free_bytes) +
         " bytes free; in a container raise --shm-size or mount a larger memory-backed volume)";
}

}  // namespace

StatusOr<std::unique_ptr<ShmBuffer>> ShmBuffer::Create(size_t bytes) {
  if (bytes == 0) {
    return Status::InvalidArgument("a shared-memory buffer needs a positive size, got 0 bytes");
  }
  if (bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max()) ||
      bytes > static_cast<uint64_t>(std::numeric_limits<ptrdiff_t>::max())) {
    return Status::InvalidArgument("a shared-memory buffer of " + std::to_string(bytes) +
                                   " bytes is larger than any file or address space");
  }

  std::string name;
  int fd = -1;
  for (int attempt = 0; attempt < kCreateAttempts && fd < 0; ++attempt) {
    name = NewName();
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    return Status::Unavailable("cannot create shared-memory segment '" + name +
                               "': " + SystemError(errno));
  }

  // From here on, every failure must remove the name again.
  auto fail = [&](const std::string& what, int error, const std::string& hint = "") {
    close(fd);
    shm_unlink(name.c_str());
    return Status::Unavailable(what + " shared-memory segment '" + name + "' of " +
                               std::to_string(bytes) + " bytes: " + SystemError(error) + hint);
  };

  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail("cannot size", errno);
  // tmpfs allocates pages lazily: without reserving them now, a full /dev/shm would surface
  // later as SIGBUS on the first touch instead of as an error here.
  int error;
  do {
    error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  } while (error == EINTR);
  if (error == ENOSPC || error == EFBIG || error == ENOMEM) {
    return fail("cannot reserve memory for", error, FreeSpaceHint());
  }
  if (error != 0 && error != EOPNOTSUPP && error != EINVAL) {
    return fail("cannot reserve memory for", error);
  }

  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail("cannot map", errno);
  close(fd);  // the mapping keeps the segment open
  return std::unique_ptr<ShmBuffer>(
      new ShmBuffer(std::move(name), static_cast<std::byte*>(data), bytes));
}

ShmBuffer::~ShmBuffer() {
  munmap(data_, size_);
  if (linked_) shm_unlink(name_.c_str());
}

Status ShmBuffer::Unlink() {
  if (!linked_) return Status::Ok();
  if (shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    return Status::Unavailable("cannot unlink shared-memory segment '" + name_ +
                               "': " + SystemError(errno));
  }
  linked_ = false;
  return Status::Ok();
}

}  // namespace collectived
