// Memory as a client hands it to the sidecar, for the Sidecar facade's tests.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>

namespace collectived {

// A memfd of `bytes` bytes, or -1.
inline int NewMemfd(size_t bytes) {
  const int fd = memfd_create("sidecar-test", MFD_CLOEXEC);
  if (fd >= 0 && ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

}  // namespace collectived
