// Mutual TLS material for collectived's TCP listener and for the channels that reach it: checks
// of the PEM files at start-up, the server credentials (which require and verify a client
// certificate) and the channel credentials of sidecars and remote clients. Certificates are
// read through gRPC's file watcher, so files replaced on disk (Kubernetes rotates mounted
// Secrets in place) are picked up without a restart.
#pragma once

#include <memory>
#include <string>

#include "engine/vocabulary/status.h"

namespace grpc {
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace collectived {

// The PEM files of one side of a TLS connection.
struct TlsFiles {
  std::string cert_file;  // certificate (chain), leaf first
  std::string key_file;   // the private key of that certificate
  std::string ca_file;    // CA certificates that verify the other side
};

// How often the files are re-read by default (seconds).
inline constexpr unsigned kDefaultTlsRefreshSeconds = 10;

// Checks that `path` can be read and holds at least one PEM certificate. Returns
// InvalidArgument "<what> <path>: ..." saying what is wrong (missing, unreadable, no
// certificate).
Status CheckCertificateFile(const std::string& path, const std::string& what);

// Checks that `key_path` holds a PEM private key and, when `cert_path` is non-empty, that it is
// the key of the first certificate there. InvalidArgument naming the file otherwise.
Status CheckPrivateKeyFile(const std::string& key_path, const std::string& cert_path,
                           const std::string& what);

// Server credentials for mutual TLS: presents files.cert_file/key_file, requires every client
// to present a certificate signed by files.ca_file (the handshake fails otherwise), re-reads
// the files every `refresh_seconds`. The files should have been checked first (an unreadable
// file makes every handshake fail).
std::shared_ptr<grpc::ServerCredentials> MutualTlsServerCredentials(const TlsFiles& files,
                                                                    unsigned refresh_seconds);

// TLS settings a client of a sidecar's TCP listener gives (flags or environment). Empty
// everywhere: plaintext.
struct TlsClientOptions {
  std::string ca_file;    // CA that signed the sidecar's certificate; empty = system roots
  std::string cert_file;  // client certificate, with key_file; empty = none
  std::string key_file;
  // The name expected in the server's certificate; empty = the host of the address.
  std::string server_name;
  unsigned refresh_seconds = kDefaultTlsRefreshSeconds;

  // Whether TLS is asked for (any of the files given).
  bool enabled() const { return !ca_file.empty() || !cert_file.empty() || !key_file.empty(); }

  // $COLLECTIVED_TLS_CA, $COLLECTIVED_TLS_CERT, $COLLECTIVED_TLS_KEY and
  // $COLLECTIVED_TLS_PEER_NAME (the daemon reads the same variables).
  static TlsClientOptions FromEnvironment();
};

inline constexpr char kTlsCaEnvironmentVariable[] = "COLLECTIVED_TLS_CA";
inline constexpr char kTlsCertEnvironmentVariable[] = "COLLECTIVED_TLS_CERT";
inline constexpr char kTlsKeyEnvironmentVariable[] = "COLLECTIVED_TLS_KEY";
inline constexpr char kTlsPeerNameEnvironmentVariable[] = "COLLECTIVED_TLS_PEER_NAME";

// How channels to sidecars' TCP listeners are secured. Default-constructed: plaintext. One
// value may be shared by any number of channels (the credentials and their file watcher are
// shared). Channels to Unix sockets are always plaintext (the socket's file permissions guard
// them).
struct ChannelSecurity {
  std::shared_ptr<grpc::ChannelCredentials> tls;  // null: plaintext
  std::string server_name;                        // overrides the address's host when set

  // Checks the files of `options` (cert and key come together) and builds the credentials.
  // Returns a plaintext ChannelSecurity when !options.enabled(); InvalidArgument naming the
  // file or the missing option otherwise.
  static StatusOr<ChannelSecurity> Make(const TlsClientOptions& options);
};

}  // namespace collectived
