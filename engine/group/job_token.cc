#include "engine/group/job_token.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace collectived {
namespace {

constexpr std::string_view kDomain = "collectived job token v1";

}  // namespace

std::string JobTokenCommitment(std::string_view token, std::string_view scope) {
  if (token.empty()) return "none";
  // The domain separates these MACs from any other use of the same secret.
  std::string message(kDomain);
  message.push_back('\0');
  message.append(scope);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  hex.reserve(2 * length);
  for (unsigned int i = 0; i < length; ++i) {
    hex.push_back(kHex[mac[i] >> 4]);
    hex.push_back(kHex[mac[i] & 0xF]);
  }
  return hex;
}

std::string JobRecordKey(std::string_view token, std::string_view scope) {
  std::string message("collectived record key v1");
  message.push_back('\0');
  message.append(scope);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac, &length);
  return std::string(reinterpret_cast<const char*>(mac), length);
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
