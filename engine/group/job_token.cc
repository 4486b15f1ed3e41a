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

bool JobTokenMatches(std::string_view token, std::string_view scope, std::string_view commitment) {
  return ConstantTimeEquals(JobTokenCommitment(token, scope), commitment);
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  // Lengths are not secret (commitments have a fixed length); contents are.
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace collectived
