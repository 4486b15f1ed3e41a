#include "engine/group/job_token.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>

#include <cstdio>
#include <cstdlib>

#include "engine/random_id.h"

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

}  // namespace

std::string HmacSha256(std::string_view key, std::string_view message) {
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length);
  return std::string(reinterpret_cast<const char*>(mac), length);
}

namespace {

[[noreturn]] void HmacUnavailable(const char* step) {
  std::fprintf(stderr, "collectived: OpenSSL cannot compute HMAC-SHA256 (%s failed)\n", step);
  std::abort();
}

// A context of HMAC-SHA256 keyed by `key`.
EVP_MAC_CTX* NewKeyedHmac(std::string_view key) {
  EVP_MAC* mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) HmacUnavailable("EVP_MAC_fetch");
  EVP_MAC_CTX* keyed = EVP_MAC_CTX_new(mac);
  EVP_MAC_free(mac);  // the context holds its own reference
  char digest_name[] = "SHA256";
  const OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest_name, 0),
      OSSL_PARAM_construct_end()};
  if (keyed == nullptr || EVP_MAC_init(keyed, reinterpret_cast<const unsigned char*>(key.data()),
                                       key.size(), params) != 1) {
    HmacUnavailable("EVP_MAC_init");
  }
  return keyed;
}

}  // namespace

KeyedHmacSha256::KeyedHmacSha256(std::string_view key) : keyed_(NewKeyedHmac(key)) {}

KeyedHmacSha256::~KeyedHmacSha256() {
  EVP_MAC_CTX_free(keyed_);
}

std::string KeyedHmacSha256::Digest(std::string_view message) const {
  // The keyed context is only read here (copied), so concurrent calls need no lock.
  EVP_MAC_CTX* ctx = EVP_MAC_CTX_dup(keyed_);
  unsigned char mac[EVP_MAX_MD_SIZE];
  size_t length = 0;
  const bool ok = ctx != nullptr &&
                  EVP_MAC_update(ctx, reinterpret_cast<const unsigned char*>(message.data()),
                                 message.size()) == 1 &&
                  EVP_MAC_final(ctx, mac, &length, sizeof(mac)) == 1;
  EVP_MAC_CTX_free(ctx);
  if (!ok) HmacUnavailable("a digest");
  return std::string(reinterpret_cast<const char*>(mac), length);
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
  EVP_Digest(a.data(), a.size(), digest_a, &length_a, EVP_sha256(), nullptr);
  EVP_Digest(b.data(), b.size(), digest_b, &length_b, EVP_sha256(), nullptr);
  return length_a == length_b && CRYPTO_memcmp(digest_a, digest_b, length_a) == 0 &&
         a.size() == b.size();
}

}  // namespace collectived
