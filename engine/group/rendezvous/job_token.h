// Job tokens: the shared secret a job's ranks present when they create a group. The sidecars
// never store or show the token itself: they keep a commitment to it, HMAC-SHA256 keyed by the
// token over the group's scope (the store prefix and name), which a reader of the store cannot
// turn back into a token nor present in its place (joining needs the token, and the commitment
// is recomputed from what the joiner presents). Comparisons are constant-time.
#pragma once

#include <openssl/types.h>

#include <string>
#include <string_view>

namespace collectived {

// The most bytes a job token may have (a generated token is 32-64 characters).
inline constexpr size_t kMaxJobTokenBytes = 4096;

// The commitment to `token` within `scope` (64 hex digits), or "none" for the empty token (a
// group without a token).
std::string JobTokenCommitment(std::string_view token, std::string_view scope);

// The key that authenticates the records of the group at `scope` (SignedStore): 32 bytes,
// derived from `token` (not empty) and distinct from its commitment.
std::string JobRecordKey(std::string_view token, std::string_view scope);

// Whether `token` is the one `commitment` was made to within `scope`, in time independent of
// where they differ.
bool JobTokenMatches(std::string_view token, std::string_view scope, std::string_view commitment);

// HMAC-SHA256 of `message` under `key`: 32 raw bytes. The algorithm is looked up once per
// process (OpenSSL 3.0 looks it up under a process-wide lock), the key hashed on every call.
std::string HmacSha256(std::string_view key, std::string_view message);

// HMAC-SHA256 under one key, keyed once: Digest(m) == HmacSha256(key, m) without hashing the key
// again, for a key used on every op's path (SignedStore's). Thread-safe. A process whose OpenSSL
// cannot compute HMAC-SHA256 stops here, as RandomHex does without random bytes.
class KeyedHmacSha256 {
 public:
  explicit KeyedHmacSha256(std::string_view key);
  ~KeyedHmacSha256();
  KeyedHmacSha256(const KeyedHmacSha256&) = delete;
  KeyedHmacSha256& operator=(const KeyedHmacSha256&) = delete;

  std::string Digest(std::string_view message) const;

 private:
  EVP_MAC_CTX* const keyed_;  // keyed once; each Digest works on a copy
};

// Equality of two secrets (or commitments) in time independent of their contents and lengths.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace collectived
