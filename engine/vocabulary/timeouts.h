// The timeouts whose zero value means something special, named, and the longest timeout the
// engine accepts. Every front end (gRPC today, a shared-memory ring later) passes these instead
// of a bare 0.
#pragma once

#include <chrono>

namespace collectived {

// OpRequest::timeout: the op uses its group's timeout (the one the group was created with).
inline constexpr std::chrono::milliseconds kUseGroupTimeout{0};

// c10d's default process-group timeout, for groups created without one.
inline constexpr std::chrono::milliseconds kDefaultGroupTimeout = std::chrono::minutes(30);

// JoinRequest::timeout: the rendezvous, and by default each op, get kDefaultGroupTimeout.
inline constexpr std::chrono::milliseconds kUseDefaultJoinTimeout{0};

// The longest op or group timeout accepted (7 days, as the store's): longer ones are refused
// rather than let a deadline computed from them overflow the clock.
inline constexpr std::chrono::milliseconds kMaxTimeout = std::chrono::hours(24 * 7);

// Sidecar::Wait: waits until the op completes, however long that takes (the op itself still
// fails at its own timeout). Any timeout <= 0 means the same.
inline constexpr std::chrono::milliseconds kWaitForever{0};

}  // namespace collectived
