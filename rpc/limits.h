// The sizes both sides of the wire agree on.
#pragma once

#include <cstddef>

namespace collectived {

// The largest gRPC message a sidecar and its clients send or receive (both directions).
inline constexpr int kMaxMessageBytes = 64 << 20;

// Largest total of inline bytes one request (or its response) may carry: the message limit minus
// room for the rest of the message. A bigger message would not fail alone: gRPC would end the
// whole session. Use shared memory for big tensors.
inline constexpr size_t kMaxInlineBytes = static_cast<size_t>(kMaxMessageBytes) - (64u << 10);

// The longest error message sent in a gRPC status. Messages quote user input (group names, rank
// lists); gRPC sends the message as percent-encoded metadata and a peer refuses metadata over
// its limit (8 KiB by default) by ending the call or the whole stream, so longer messages are cut.
inline constexpr size_t kMaxErrorMessageBytes = 2048;

}  // namespace collectived
