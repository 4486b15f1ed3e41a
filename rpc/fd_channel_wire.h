// The fd channel's wire format: how a local client hands its sidecar memory as a file
// descriptor. gRPC cannot carry file descriptors, so they travel on a second Unix socket beside
// the gRPC one (`<socket>.fd`, SOCK_SEQPACKET: one message per datagram), with SCM_RIGHTS.
//
// A connection first binds to a session with a one-time token that the session's Attach stream
// received (kBind). Then each kRegister carries exactly one descriptor and the size the client
// expects; the answer carries the buffer id to use in ShmRef.buffer_id. kRegisterCudaVmm carries
// the POSIX file descriptor of one CUDA VMM physical allocation (cuMemExportToShareableHandle), its
// size and device; the answer carries the id to use in CudaVmmRef.registration_ids, until
// kUnregisterCudaVmm gives the id back. kOpenRing asks for the
// session's submission ring (one per session), whose memfd comes back attached to the answer. Every
// message is a fixed 48-byte little-endian header, then a payload of at most kMaxPayload bytes: the
// token for kBind, a UTF-8 message for answers (the session label on success, the error otherwise).
// docs/api.md describes it for clients in other languages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/vocabulary/status.h"

namespace collectived {

enum class FdChannelKind : uint16_t {
  kBind = 1,      // payload: the token; answered by kBound
  kRegister = 2,  // value0: expected size; one fd attached; answered by kRegistered
  kOpenRing = 3,  // no fd; answered by kRingOpened
  // value0: the physical allocation's size, value1: its CUDA device; one fd attached (the
  // allocation's CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR handle); answered by kCudaVmmRegistered
  kRegisterCudaVmm = 4,
  // value0: a registration id of kCudaVmmRegistered that the client no longer maps (the memory
  // was unmapped and freed); no fd; answered by kCudaVmmUnregistered
  kUnregisterCudaVmm = 5,
  kBound = 0x81,              // error_kind, payload: the session label or the error
  kRegistered = 0x82,         // value0: buffer id, value1: mapped size, flags bit 0: sealed
  kRingOpened = 0x83,         // the ring's memfd attached; value0: its size (rpc/submission_ring.h)
  kCudaVmmRegistered = 0x84,  // value0: the registration id for CudaVmmRef.registration_ids
  kCudaVmmUnregistered = 0x85,  // error_kind only
};

struct FdChannelMessage {
  static constexpr uint32_t kMagic = 0x64666463;  // "cdfd"
  static constexpr uint16_t kVersion = 1;
  static constexpr size_t kHeaderBytes = 48;
  static constexpr size_t kMaxPayload = 4096;
  static constexpr uint32_t kFlagSealed = 1;

  FdChannelKind kind = FdChannelKind::kBind;
  uint64_t request_id = 0;
  uint64_t value0 = 0;
  uint64_t value1 = 0;
  int32_t error_kind = 0;  // ErrorKind of the answer; 0 = OK
  uint32_t flags = 0;
  std::string payload;
};

// The path of the fd channel that serves the gRPC socket `socket_path`.
std::string FdChannelPath(const std::string& socket_path);

// Sends `message` on the connected SOCK_SEQPACKET socket `socket`, with `fd` attached when
// fd >= 0. Unavailable with the system's reason on failure; InvalidArgument for a payload over
// kMaxPayload. Retries on EINTR.
Status SendFdChannelMessage(int socket, const FdChannelMessage& message, int fd = -1);

// Receives one message. `*fd` (may be null: then any descriptor received is closed) is set to
// the descriptor attached, or -1; more than one descriptor is refused (all are closed). Errors:
// Unavailable("closed") when the peer closed the connection, Unavailable with the system's
// reason, InvalidArgument for a malformed, truncated or foreign message. A descriptor is never
// leaked, whatever the outcome.
StatusOr<FdChannelMessage> ReceiveFdChannelMessage(int socket, int* fd);

}  // namespace collectived
