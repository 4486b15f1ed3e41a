#include "rpc/tls.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "rpc/client_environment.h"

namespace collectived {
namespace {

// The contents of `path`, or InvalidArgument "<what> <path>: cannot read it: <reason>".
StatusOr<std::string> ReadFile(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status::InvalidArgument(what + " " + path + ": cannot read it: " + std::strerror(errno));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::InvalidArgument(what + " " + path + ": cannot read it");
  return text.str();
}

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

BioPtr MemoryBio(const std::string& text) {
  return BioPtr(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// The first PEM certificate of `text`, or null.
X509Ptr FirstCertificate(const std::string& text) {
  BioPtr bio = MemoryBio(text);
  X509Ptr cert(bio ? PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  ERR_clear_error();
  return cert;
}

}  // namespace

Status CheckCertificateFile(const std::string& path, const std::string& what) {
  StatusOr<std::string> text = ReadFile(path, what);
  if (!text.ok()) return text.status();
  if (!FirstCertificate(*text)) {
    return Status::InvalidArgument(
        what + " " + path + ": no PEM certificate in it (expected -----BEGIN CERTIFICATE-----)");
  }
  return Status::Ok();
}

Status CheckPrivateKeyFile(const std::string& key_path, const std::string& cert_path,
                           const std::string& what) {
  StatusOr<std::string> text = ReadFile(key_path, what);
  if (!text.ok()) return text.status();
  BioPtr bio = MemoryBio(*text);
  KeyPtr key(bio ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  ERR_clear_error();
  if (!key) {
    return Status::InvalidArgument(
        what + " " + key_path +
        ": no PEM private key in it (expected -----BEGIN PRIVATE KEY----- or a variant; "
        "encrypted keys are not supported)");
  }
  if (cert_path.empty()) return Status::Ok();
  StatusOr<std::string> cert_text = ReadFile(cert_path, "certificate");
  if (!cert_text.ok()) return cert_text.status();
  X509Ptr cert = FirstCertificate(*cert_text);
  if (!cert) return Status::Ok();  // the certificate's own check reports it
  bool matches = X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!matches) {
    return Status::InvalidArgument(what + " " + key_path +
                                   ": this private key does not belong to the certificate in " +
                                   cert_path);
  }
  return Status::Ok();
}

std::shared_ptr<grpc::ServerCredentials> MutualTlsServerCredentials(const TlsFiles& files,
                                                                    unsigned refresh_seconds) {
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      files.key_file, files.cert_file, files.ca_file, refresh_seconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

TlsClientOptions TlsClientOptions::FromEnvironment() {
  TlsClientOptions options;
  options.ca_file = ClientSetting(kTlsCaEnvironmentVariable).value_or("");
  options.cert_file = ClientSetting(kTlsCertEnvironmentVariable).value_or("");
  options.key_file = ClientSetting(kTlsKeyEnvironmentVariable).value_or("");
  options.server_name = ClientSetting(kTlsPeerNameEnvironmentVariable).value_or("");
  return options;
}

StatusOr<ChannelSecurity> ChannelSecurity::Make(const TlsClientOptions& options) {
  ChannelSecurity security;
  if (!options.enabled()) return security;
  if (options.cert_file.empty() != options.key_file.empty()) {
    return Status::InvalidArgument(options.cert_file.empty()
                                       ? "a TLS client key was given without its certificate"
                                       : "a TLS client certificate was given without its key");
  }
  if (!options.ca_file.empty()) {
    COLLECTIVED_RETURN_IF_ERROR(CheckCertificateFile(options.ca_file, "TLS CA file"));
  }
  if (!options.cert_file.empty()) {
    COLLECTIVED_RETURN_IF_ERROR(
        CheckCertificateFile(options.cert_file, "TLS client certificate file"));
    COLLECTIVED_RETURN_IF_ERROR(
        CheckPrivateKeyFile(options.key_file, options.cert_file, "TLS client key file"));
  }
  grpc::experimental::TlsChannelCredentialsOptions tls;
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key_file, options.cert_file, options.ca_file,
      options.refresh_seconds == 0 ? kDefaultTlsRefreshSeconds : options.refresh_seconds);
  tls.set_certificate_provider(provider);
  if (!options.ca_file.empty()) tls.watch_root_certs();
  if (!options.cert_file.empty()) tls.watch_identity_key_cert_pairs();
  security.tls = grpc::experimental::TlsCredentials(tls);
  if (!security.tls) return Status::Internal("gRPC refused the TLS channel options");
  security.server_name = options.server_name;
  return security;
}

}  // namespace collectived
