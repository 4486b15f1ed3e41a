// The daemon's configuration: command-line flags, each with an environment-variable fallback
// (flag > environment > default), parsed once at start-up.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "engine/sidecar/resource_ledger.h"
#include "engine/sidecar/session_quotas.h"
#include "engine/vocabulary/logging.h"
#include "engine/vocabulary/status.h"

namespace collectived {

struct DaemonConfig {
  // Unix socket for local clients; empty disables it.
  std::string socket_path = "/run/collectived/collectived.sock";
  // Permissions of the socket file: owner and group only by default.
  unsigned socket_mode = 0660;
  // TCP listener for peers, the store and remote clients; empty disables it.
  std::string listen_address = "0.0.0.0:7490";
  // Host name or address peers use to reach this sidecar; default: the host name.
  std::string advertise_host;
  // Prometheus /metrics endpoint; empty disables it.
  std::string metrics_address = "0.0.0.0:9490";
  LogLevel log_level = LogLevel::kInfo;
  // Admin credentials (AdminPolicy): a file holding the admin token (re-read when it changes;
  // empty: no admin token), and the client-certificate names that may act as admins over TCP.
  std::string admin_token_file;
  std::vector<std::string> admin_names;
  // Default timeout of store waits that do not name one.
  std::chrono::milliseconds store_timeout{300000};
  // Finished ops kept per group by the flight recorder.
  size_t flight_recorder_size = 256;
  // An op in flight longer than this is logged once and counted as stuck.
  std::chrono::milliseconds stuck_threshold{60000};
  size_t executor_threads = 0;  // 0: one per core
  size_t executor_blocking_threads = 64;
  size_t max_ops_in_flight = 16;
  size_t summary_agreement_from_sidecars = 64;  // GroupSpec::summary_agreement_from_nodes
  size_t split_digest_above_ranks = 2048;       // GroupSpec::split_digest_above_ranks
  // NCCL_HOSTID for this process: a test and benchmark setting that lets two sidecars on one
  // machine share one GPU (NCCL then treats them as two hosts and talks over its network
  // transport). Empty: NCCL's own host identity. Never set in deployments.
  std::string nccl_host_id;
  // At most this many groups get their own metric labels; the rest are aggregated as "_other".
  size_t metrics_max_groups = 64;
  // Per-op metrics and the flight recorder (off only to measure their cost).
  bool op_telemetry = true;
  // The most threads the gRPC server may use. Every attached session, blocking join and store
  // wait holds one; past the bound new calls get RESOURCE_EXHAUSTED instead of the sidecar
  // running out of memory or threads.
  int max_threads = 8192;
  // The most bytes (keys and values) this sidecar's rendezvous store holds.
  size_t store_max_bytes = size_t{1} << 30;
  // How many completed ops a session remembers for a late Wait.
  SessionQuotas session_quotas;
  // Ceilings set by flags (--max-X, --client-max-X); 0 keeps the machine's default
  // (ResourceCeilings::Defaults).
  ResourceCeilings ceiling_overrides;
  // Failed groups whose final state stays queryable, and where each is written as JSON ("":
  // nowhere).
  size_t failed_groups_kept = 32;
  std::string post_mortem_dir;
  // Without TLS, every TCP caller counts as a peer sidecar on the store (tests, demos).
  bool trust_plaintext_peers = false;
  // Certificate names (CN or SAN) of peer sidecars over mutual TLS: only they may touch the
  // store's group keys (StoreAccessPolicy).
  std::vector<std::string> sidecar_names = {"collectived"};
  // Grace period for in-flight RPCs at shutdown.
  std::chrono::milliseconds shutdown_grace{500};
  // At SIGTERM, how long collectives already in flight may finish (no new groups or ops are
  // accepted meanwhile) before the rest fail with "shutting down". Within Kubernetes'
  // terminationGracePeriodSeconds (30 s by default) with room for the grace period.
  std::chrono::milliseconds drain_timeout{10000};

  // Transport security of the TCP listener (all three files, or none).
  std::string tls_cert_file;  // this sidecar's certificate: served, and presented to peers
  std::string tls_key_file;   // its private key
  std::string tls_ca_file;    // the CA that signs peer sidecars and remote clients
  // The name sidecars expect in each other's certificate; empty = the host of the address.
  std::string tls_peer_name;
  unsigned tls_refresh_seconds = 10;  // how often the files are re-read
  // Serve plaintext on a non-loopback TCP address without TLS (refused otherwise).
  bool insecure_listen = false;

  bool tls_enabled() const { return !tls_cert_file.empty(); }
};

// Result of parsing: either a config to run with, or a request to print help/version.
struct ParsedCommandLine {
  DaemonConfig config;
  bool show_help = false;
  bool show_help_markdown = false;  // --help=markdown
  bool show_version = false;
};

// Parses `args` (without argv[0]) with fallbacks from `env` (variable name -> value).
// Accepts "--flag value" and "--flag=value". Returns InvalidArgument naming the flag (or the
// environment variable) on an unknown flag, a missing value or a malformed value.
StatusOr<ParsedCommandLine> ParseDaemonCommandLine(const std::vector<std::string>& args,
                                                   const std::map<std::string, std::string>& env);

// Checks the transport security of `config` before the daemon starts: the TLS files come all
// three or none, exist and parse as PEM (the key matching the certificate); without TLS, a TCP
// listener on a non-loopback address needs insecure_listen. Returns InvalidArgument naming the
// flag or the file and saying how to fix it.
Status CheckListenerSecurity(const DaemonConfig& config);

// Whether `listen_address` (HOST:PORT) binds only loopback: 127.0.0.0/8, ::1 or localhost.
bool IsLoopbackListenAddress(const std::string& listen_address);

// The TCP listener's security, as GetInfo, the build_info metric and the logs show it:
// "mutual-tls", "insecure (loopback)", "insecure (--insecure-listen)", or "off" without a TCP
// listener.
std::string TcpSecurityMode(const DaemonConfig& config);

// Reads the process environment into the map ParseDaemonCommandLine expects.
std::map<std::string, std::string> ProcessEnvironment();

// The text printed by --help.
std::string DaemonUsage();

// The flags as the Markdown table of the README's Configuration section (--help=markdown): one
// row per flag (the ceilings' flags in one row), its environment variable, its default and its
// meaning, all taken from the flag table that parses them.
std::string DaemonFlagsMarkdown();

}  // namespace collectived
