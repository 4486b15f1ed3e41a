// Unguessable identifiers: random bytes from the kernel, as hex. (Secrets are compared with
// ConstantTimeEquals, engine/group/rendezvous/job_token.h.)
//
// Thread-safety: RandomHex may be called from any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace collectived {

// `bytes` random bytes from the kernel (getrandom(2), which blocks only until the kernel's pool
// is first initialised at boot), as 2*`bytes` lowercase hex characters. The process aborts with
// a message on stderr if the kernel gives no randomness: no identifier is better than a
// guessable one.
std::string RandomHex(size_t bytes);

// `bytes` as 2*size lowercase hex characters.
std::string ToHex(std::string_view bytes);
// The `bytes` bytes that ToHex wrote as `text` (lowercase hex, exactly 2*`bytes` characters),
// into `out`. Returns false, leaving `out` unspecified, for any other text.
bool FromHex(std::string_view text, void* out, size_t bytes);

}  // namespace collectived
