// RegisteredBuffers: the shared-memory buffers a client allocated and registered with its
// sidecar, owned here until freed. A request may only name buffers that are here: another
// session's buffer id means nothing to the sidecar, and a freed one is gone.
//
// Thread-safety: every method may be called from any thread. A request is built under Lock(),
// so that FreeBuffer cannot free a buffer the request is reading.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "clients/cpp/client.h"

namespace collectived {

class RegisteredBuffers {
 public:
  // Keeps `buffer`; returns the handle callers use.
  const RegisteredBuffer* Add(std::unique_ptr<RegisteredBuffer> buffer);
  // Gives `buffer` back to the caller (null when it is not here).
  std::unique_ptr<RegisteredBuffer> Take(const RegisteredBuffer* buffer);
  // Unmaps them all (the session ended: the sidecar released its mappings).
  void Clear();

  std::unique_lock<std::mutex> Lock() { return std::unique_lock<std::mutex>(mutex_); }
  // InvalidArgument naming the op, group and tensor for a tensor on a buffer that is not here.
  // REQUIRES: Lock() held.
  Status CheckOwnedLocked(const std::string& group, const CollectiveArgs& args) const;

 private:
  std::mutex mutex_;
  std::map<const RegisteredBuffer*, std::unique_ptr<RegisteredBuffer>> buffers_;  // by mutex_
};

}  // namespace collectived
