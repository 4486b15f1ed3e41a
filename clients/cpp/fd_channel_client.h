// FdChannelClient: a session's connection to its sidecar's fd channel (rpc/fd_channel_wire.h),
// where memory is handed over as a file descriptor (a buffer's memfd is registered) and the
// session's submission ring comes back as one. Connected and bound on first use with the
// session's one-time token, which only a client on the sidecar's Unix socket gets.
//
// Thread-safety: every method may be called from any thread; requests go one at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

#include "engine/vocabulary/status.h"
#include "rpc/fd_channel_wire.h"

namespace collectived {

class FdChannelClient {
 public:
  // For a session of the sidecar at `address` (its Unix socket names the channel's). A request
  // (none waits for other ranks) fails after `request_timeout` with a wedged sidecar.
  FdChannelClient(std::string address, std::chrono::milliseconds request_timeout);
  ~FdChannelClient();
  FdChannelClient(const FdChannelClient&) = delete;
  FdChannelClient& operator=(const FdChannelClient&) = delete;

  // The one-time token of SessionOpened (empty over TCP: no channel then) and the session's
  // label, for messages.
  void SetSession(std::string token, std::string label);
  bool has_token() const;

  // Registers the memory behind `fd` (not taken; at least `bytes`) with the sidecar. Returns the
  // buffer id; PermissionDenied over TCP; the sidecar's refusal; Unavailable when the channel
  // broke (it is dropped, and the next call connects again, without a token: refused).
  StatusOr<uint64_t> Register(int fd, size_t bytes);
  // Registers the CUDA VMM physical allocation whose POSIX file descriptor is `fd` (not taken),
  // `bytes` long on `device` (kRegisterCudaVmm). Returns the registration id; the errors of
  // Register.
  StatusOr<uint64_t> RegisterCudaVmm(int fd, uint64_t bytes, int device);
  // Gives back a registration of RegisterCudaVmm (kUnregisterCudaVmm).
  Status UnregisterCudaVmm(uint64_t id);
  // Opens the session's submission ring. Returns its memfd (the caller closes it).
  StatusOr<int> OpenRing();
  // Whether the channel is gone: never connected, closed, or hung up by the sidecar.
  bool Gone() const;
  void Close();

 private:
  // Connects and binds (mutex_ held).
  Status ConnectLocked();
  // Sends `kind` (with `fd`, `value` and `value1` for a registration) and reads the answer
  // (mutex_ held); the answer's descriptor goes to *received when it carries one.
  Status Exchange(FdChannelKind kind, int fd, uint64_t value, uint64_t* answer_value, int* received,
                  uint64_t value1 = 0);

  const std::string address_;
  const std::chrono::milliseconds request_timeout_;
  mutable std::mutex mutex_;
  std::string session_label_;  // guarded by mutex_
  std::string token_;          // guarded by mutex_; one-time
  int socket_ = -1;            // guarded by mutex_
  uint64_t next_request_ = 1;  // guarded by mutex_
};

}  // namespace collectived
