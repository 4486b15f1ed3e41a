#include "engine/group/rendezvous/job_token.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>

#include <cstdio>
#include <cstdlib>

#include "engine/vocabulary/random_id.h"

namespace collectived {
namespace {

// The MAC of `scope` under `token` for one use (`domain`): the domain separates the uses of the
// same secret.
std::string ScopedMac(std::string_view token, std::string_view domain, std::string_view scope) {
  std::string message(domain);
  message.push_back('\0');
  message.append(scope);
  return HmacSha256(token, message);
}

[[noreturn]] void HmacUnavailable(const char* step) {
  std::fprintf(stderr, "collectived: OpenSSL cannot compute HMAC-SHA256 (%s failed)\n", step);
  std::abort();
}

// OpenSSL 3 looks an algorithm up by name on every implicit fetch (the one-shot HMAC(),
// EVP_sha256() in EVP_Digest, a digest named in EVP_MAC_init), and OpenSSL 3.0 does so under a
// process-wide write lock: with thousands of ranks joining at once, each signing its store calls,
// that lock was most of a join. Both algorithms are fetched once; every HMAC context is a copy of
// one whose digest is set, re-keyed.
const EVP_MD* Sha256() {
  static EVP_MD* const md = [] {
    EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    if (fetched == nullptr) HmacUnavailable("EVP_MD_fetch");
    return fetched;
  }();
  return md;
}

// An HMAC-SHA256 context under an empty key (fully initialized, so that it can be copied).
const EVP_MAC_CTX* HmacTemplate() {
  static EVP_MAC_CTX* const initialized = [] {
    EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    if (mac == nullptr) HmacUnavailable("EVP_MAC_fetch");
    EVP_MAC_CTX* ctx = EVP_MAC_CTX_new(mac);
    EVP_MAC_free(mac);  // the context holds its own reference
    char digest_name[] = "SHA256";
    const OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest_name, 0),
        OSSL_PARAM_construct_end()};
    static const unsigned char kEmpty[1] = {0};
    if (ctx == nullptr || EVP_MAC_init(ctx, kEmpty, 0, params) != 1) {
      HmacUnavailable("EVP_MAC_init");
    }
    return ctx;
  }();
  return initialized;
}

// A context of HMAC-SHA256 keyed by `key`.
EVP_MAC_CTX* NewKeyedHmac(std::string_view key) {
  // The template is only read (copied), so concurrent calls need no lock.
  EVP_MAC_CTX* keyed = EVP_MAC_CTX_dup(HmacTemplate());
  if (keyed == nullptr || EVP_MAC_init(keyed, reinterpret_cast<const unsigned char*>(key.data()),
                                       key.size(), nullptr) != 1) {
    HmacUnavailable("EVP_MAC_init");
  }
  return keyed;
}

// The MAC of `message` by `keyed`, which it consumes.
std::string FinishHmac(EVP_MAC_CTX* keyed, std::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  size_t length = 0;
  const bool ok = keyed != nullptr &&
                  EVP_MAC_update(keyed, reinterpret_cast<const unsigned char*>(message.data()),
                                 message.size()) == 1 &&
                  EVP_MAC_final(keyed, mac, &length, sizeof(mac)) == 1;
  EVP_MAC_CTX_free(keyed);
  if (!ok) HmacUnavailable("a digest");
  return std::string(reinterpret_cast<const char*>(mac), length);
}

}  // namespace

std::string HmacSha256(std::string_view key, std::string_view message) {
  return FinishHmac(NewKeyedHmac(key), message);
}

KeyedHmacSha256::KeyedHmacSha256(std::string_view key) : keyed_(NewKeyedHmac(key)) {}

KeyedHmacSha256::~KeyedHmacSha256() {
  EVP_MAC_CTX_free(keyed_);
}

std::string KeyedHmacSha256::Digest(std::string_view message) const {
  // The keyed context is only read here (copied), so concurrent calls need no lock.
  return FinishHmac(EVP_MAC_CTX_dup(keyed_), message);
}

std::string JobTokenCommitment(std::string_view token, std::string_view scope) {
  if (token.empty()) return "none";
  return ToHex(ScopedMac(token, "collectived job token v1", scope));
}

std::string JobRecordKey(std::string_view token, std::string_view scope) {
  return ScopedMac(token, "collectived record key v1", scope);
}

bool JobTokenMatches(std::string_view token, std::string_view scope, std::string_view commitment) {
  return ConstantTimeEquals(JobTokenCommitment(token, scope), commitment);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Compare digests, so that neither the contents nor the length of a secret (an admin token of
  // unknown length) shows in the time taken.
  unsigned char digest_a[EVP_MAX_MD_SIZE];
  unsigned char digest_b[EVP_MAX_MD_SIZE];
  unsigned int length_a = 0;
  unsigned int length_b = 0;
  EVP_Digest(a.data(), a.size(), digest_a, &length_a, Sha256(), nullptr);
  EVP_Digest(b.data(), b.size(), digest_b, &length_b, Sha256(), nullptr);
  return length_a == length_b && CRYPTO_memcmp(digest_a, digest_b, length_a) == 0 &&
         a.size() == b.size();
}

}  // namespace collectived
