// Secrets: unguessable random identifiers from the kernel, and comparisons of secrets that take
// the same time whatever the inputs' contents (no early exit on the first differing byte, so a
// caller cannot learn a secret one byte at a time by timing its guesses).
//
// Thread-safety: both functions may be called from any thread.
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

// Whether `a` and `b` are equal. Runs in time that depends on the lengths only, never on where
// the contents differ. (An empty secret is never a credential: callers check for it first.)
bool SecretEquals(std::string_view a, std::string_view b);

}  // namespace collectived
