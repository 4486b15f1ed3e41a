#include "services/collectived/config.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <deque>
#include <functional>
#include <optional>

#include "rpc/tls.h"

extern char** environ;

namespace collectived {
namespace {

struct FlagSpec {
  std::string_view flag;
  std::string_view env;
  std::string_view help;
  std::function<Status(DaemonConfig&, const std::string&)> apply;
  // A switch: "--flag" alone means "--flag=true".
  bool is_switch = false;
};

Status ParseMillis(const std::string& text, std::string_view what, std::chrono::milliseconds* out) {
  long long value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0) {
    return Status::InvalidArgument(std::string(what) + ": expected a non-negative number of " +
                                   "milliseconds, got '" + text + "'");
  }
  *out = std::chrono::milliseconds(value);
  return Status::Ok();
}

Status ParseCount(const std::string& text, std::string_view what, size_t low, size_t high,
                  size_t* out) {
  size_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < low || value > high) {
    return Status::InvalidArgument(std::string(what) + ": expected " + std::to_string(low) + ".." +
                                   std::to_string(high) + ", got '" + text + "'");
  }
  *out = value;
  return Status::Ok();
}

Status CheckHostPort(const std::string& text, std::string_view what) {
  if (text.empty()) return Status::Ok();
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) {
    return Status::InvalidArgument(std::string(what) + ": expected HOST:PORT, got '" + text + "'");
  }
  int port = 0;
  const char* begin = text.data() + colon + 1;
  auto [end, error] = std::from_chars(begin, text.data() + text.size(), port);
  if (error != std::errc() || end != text.data() + text.size() || port < 0 || port > 65535) {
    return Status::InvalidArgument(std::string(what) + ": bad port in '" + text + "'");
  }
  return Status::Ok();
}

// A comma-separated list of names, none empty.
Status ParseNames(const std::string& text, std::string_view what, std::vector<std::string>* out) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    std::string name = text.substr(start, comma - start);
    if (name.empty()) {
      return Status::InvalidArgument(std::string(what) +
                                     ": expected comma-separated names, got an empty one in '" +
                                     text + "'");
    }
    names.push_back(std::move(name));
    start = comma + 1;
  }
  *out = std::move(names);
  return Status::Ok();
}

Status ParseSwitch(const std::string& text, std::string_view what, bool* out) {
  if (text == "1" || text == "true" || text == "yes" || text == "on") {
    *out = true;
  } else if (text.empty() || text == "0" || text == "false" || text == "no" || text == "off") {
    *out = false;
  } else {
    return Status::InvalidArgument(std::string(what) + ": expected 1/true/yes/on or " +
                                   "0/false/no/off, got '" + text + "'");
  }
  return Status::Ok();
}

// "--max-X" and "--client-max-X" for every resource of the ledger (ResourceCeilings).
void AppendResourceFlags(std::vector<FlagSpec>* flags) {
  // FlagSpec holds views: the generated texts live as long as the table.
  static std::deque<std::string> texts;
  auto keep = [](std::string text) -> std::string_view {
    return texts.emplace_back(std::move(text));
  };
  const ResourceCeilings defaults = ResourceCeilings::Defaults(MachineLimits::OfThisProcess());
  for (size_t i = 0; i < kResourceCount; ++i) {
    const Resource resource = static_cast<Resource>(i);
    std::string env(ResourceName(resource));
    std::transform(env.begin(), env.end(), env.begin(),
                   [](unsigned char c) { return std::toupper(c); });
    for (const bool total : {false, true}) {
      if (!total && defaults[resource].per_client == 0) continue;  // no per-client share
      const std::string flag = total ? TotalFlag(resource) : ClientShareFlag(resource);
      const uint64_t fallback = total ? defaults[resource].total : defaults[resource].per_client;
      std::string help =
          std::string(total ? "The most " : "Each client process's share of ") +
          std::string(ResourceName(resource)) +
          (total ? " all clients together may hold" : " (its sessions together may hold no more)") +
          "; past it requests get RESOURCE_EXHAUSTED naming this flag. Default on this "
          "machine " +
          std::to_string(fallback) + " (derived from its memory and limits)";
      flags->push_back(
          {keep(flag), keep((total ? "COLLECTIVED_MAX_" : "COLLECTIVED_CLIENT_MAX_") + env),
           keep(std::move(help)), [flag, resource, total](DaemonConfig& c, const std::string& v) {
             size_t n = 0;
             COLLECTIVED_RETURN_IF_ERROR(ParseCount(v, flag, 1, size_t{1} << 50, &n));
             ResourceCeiling& ceiling = c.ceiling_overrides[resource];
             (total ? ceiling.total : ceiling.per_client) = n;
             return Status::Ok();
           }});
    }
  }
}

const std::vector<FlagSpec>& Flags() {
  static const std::vector<FlagSpec> flags = [] {
    std::vector<FlagSpec> fixed = {
        {"--socket", "COLLECTIVED_SOCKET",
         "Unix socket for local clients (\"\" disables). Default /run/collectived/collectived.sock",
         [](DaemonConfig& c, const std::string& v) {
           c.socket_path = v;
           return Status::Ok();
         }},
        {"--socket-mode", "COLLECTIVED_SOCKET_MODE",
         "Octal permissions of the socket. Default 0660",
         [](DaemonConfig& c, const std::string& v) {
           unsigned mode = 0;
           auto [end, error] = std::from_chars(v.data(), v.data() + v.size(), mode, 8);
           if (error != std::errc() || end != v.data() + v.size() || mode > 0777) {
             return Status::InvalidArgument(
                 "--socket-mode: expected octal permissions like 0660, got '" + v + "'");
           }
           c.socket_mode = mode;
           return Status::Ok();
         }},
        {"--listen", "COLLECTIVED_LISTEN",
         "HOST:PORT of the TCP listener for peers, the store and remote clients (\"\" disables). "
         "Default 0.0.0.0:7490",
         [](DaemonConfig& c, const std::string& v) {
           COLLECTIVED_RETURN_IF_ERROR(CheckHostPort(v, "--listen"));
           c.listen_address = v;
           return Status::Ok();
         }},
        {"--advertise", "COLLECTIVED_ADVERTISE",
         "Host name or address peers use to reach this sidecar. Default: the host name",
         [](DaemonConfig& c, const std::string& v) {
           c.advertise_host = v;
           return Status::Ok();
         }},
        {"--metrics", "COLLECTIVED_METRICS",
         "HOST:PORT of the Prometheus /metrics endpoint (\"\" disables). Default 0.0.0.0:9490",
         [](DaemonConfig& c, const std::string& v) {
           COLLECTIVED_RETURN_IF_ERROR(CheckHostPort(v, "--metrics"));
           c.metrics_address = v;
           return Status::Ok();
         }},
        {"--log-level", "COLLECTIVED_LOG_LEVEL", "debug, info, warning or error. Default info",
         [](DaemonConfig& c, const std::string& v) {
           if (!ParseLogLevel(v, &c.log_level)) {
             return Status::InvalidArgument(
                 "--log-level: expected debug, info, warning or error, got '" + v + "'");
           }
           return Status::Ok();
         }},
        {"--admin-token-file", "COLLECTIVED_ADMIN_TOKEN_FILE",
         "File holding the admin token (its content, trimmed), re-read when it changes; callers "
         "present it as 'authorization: Bearer <token>' to abort groups. Default: none",
         [](DaemonConfig& c, const std::string& v) {
           c.admin_token_file = v;
           return Status::Ok();
         }},
        {"--admin-names", "COLLECTIVED_ADMIN_NAMES",
         "Comma-separated client-certificate names (SAN or CN) that may abort groups over TCP "
         "with TLS. Default: none",
         [](DaemonConfig& c, const std::string& v) {
           c.admin_names.clear();
           return v.empty() ? Status::Ok() : ParseNames(v, "--admin-names", &c.admin_names);
         }},
        {"--store-timeout-ms", "COLLECTIVED_STORE_TIMEOUT_MS",
         "Default timeout of store waits that name none. Default 300000",
         [](DaemonConfig& c, const std::string& v) {
           return ParseMillis(v, "--store-timeout-ms", &c.store_timeout);
         }},
        {"--flight-recorder-size", "COLLECTIVED_FLIGHT_RECORDER_SIZE",
         "Finished ops the flight recorder keeps per group. Default 256",
         [](DaemonConfig& c, const std::string& v) {
           size_t n = 0;
           auto [end, error] = std::from_chars(v.data(), v.data() + v.size(), n);
           if (error != std::errc() || end != v.data() + v.size() || n > 1000000) {
             return Status::InvalidArgument("--flight-recorder-size: expected 0..1000000, got '" +
                                            v + "'");
           }
           c.flight_recorder_size = n;
           return Status::Ok();
         }},
        {"--stuck-threshold-ms", "COLLECTIVED_STUCK_THRESHOLD_MS",
         "An op in flight longer than this is logged once and counted as stuck. Default 60000",
         [](DaemonConfig& c, const std::string& v) {
           COLLECTIVED_RETURN_IF_ERROR(ParseMillis(v, "--stuck-threshold-ms", &c.stuck_threshold));
           if (c.stuck_threshold.count() == 0)
             return Status::InvalidArgument("--stuck-threshold-ms must be positive");
           return Status::Ok();
         }},
        {"--executor-threads", "COLLECTIVED_EXECUTOR_THREADS",
         "Threads of the pool that runs every group's ops (0: one per core, at least 2). Default 0",
         [](DaemonConfig& c, const std::string& v) {
           return ParseCount(v, "--executor-threads", 0, 1024, &c.executor_threads);
         }},
        {"--executor-blocking-threads", "COLLECTIVED_EXECUTOR_BLOCKING_THREADS",
         "Threads the pool lends at most while its threads wait in transport calls (a Gloo "
         "collective waits for the peer sidecars). Default 64",
         [](DaemonConfig& c, const std::string& v) {
           return ParseCount(v, "--executor-blocking-threads", 0, 100000,
                             &c.executor_blocking_threads);
         }},
        {"--max-ops-in-flight", "COLLECTIVED_MAX_OPS_IN_FLIGHT",
         "Ops of a GPU group enqueued on its stream and not yet complete, at most; later ops wait "
         "for one to complete. Default 16",
         [](DaemonConfig& c, const std::string& v) {
           return ParseCount(v, "--max-ops-in-flight", 1, 4096, &c.max_ops_in_flight);
         }},
        {"--summary-agreement-from-sidecars", "COLLECTIVED_SUMMARY_AGREEMENT_FROM_SIDECARS",
         "Groups of at least this many sidecars agree on each op by combining one fixed-size "
         "summary per sidecar up and down a tree, instead of every sidecar gathering every "
         "rank's announcement; their flight records then show the arrival of the local ranks "
         "and of the group's first and last rank only. Default 64",
         [](DaemonConfig& c, const std::string& v) {
           return ParseCount(v, "--summary-agreement-from-sidecars", 2, 1000000,
                             &c.summary_agreement_from_sidecars);
         }},
        {"--split-digest-above-ranks", "COLLECTIVED_SPLIT_DIGEST_ABOVE_RANKS",
         "Groups of more ranks than this check an alltoall's split sizes across ranks through "
         "digests of every pair (16 bytes per sidecar) instead of every sidecar gathering every "
         "rank's split sizes (2 x R^2 counts); a disagreement is then reported without naming "
         "the pair. Default 2048",
         [](DaemonConfig& c, const std::string& v) {
           return ParseCount(v, "--split-digest-above-ranks", 0, 1000000,
                             &c.split_digest_above_ranks);
         }},
        {"--nccl-host-id", "COLLECTIVED_NCCL_HOST_ID",
         "Tests and benchmarks only: the host identity NCCL sees (NCCL_HOSTID), so that two "
         "sidecars of one machine can share a GPU over NCCL's socket transport on loopback "
         "(NCCL_NET "
         "and NCCL_SOCKET_IFNAME default to Socket and lo). Default: NCCL's own",
         [](DaemonConfig& c, const std::string& v) {
           if (v.size() > 255 || v.find('\0') != std::string::npos)
             return Status::InvalidArgument("--nccl-host-id: at most 255 bytes");
           c.nccl_host_id = v;
           return Status::Ok();
         }},
        {"--metrics-max-groups", "COLLECTIVED_METRICS_MAX_GROUPS",
         "Groups labelled individually in metrics; the rest are aggregated as \"_other\". Default "
         "64",
         [](DaemonConfig& c, const std::string& v) {
           return ParseCount(v, "--metrics-max-groups", 0, 100000, &c.metrics_max_groups);
         }},
        {"--op-telemetry", "COLLECTIVED_OP_TELEMETRY",
         "on or off: per-op metrics and the flight recorder (off only to measure their cost). "
         "Default on",
         [](DaemonConfig& c, const std::string& v) {
           if (v != "on" && v != "off")
             return Status::InvalidArgument("--op-telemetry: expected on or off, got '" + v + "'");
           c.op_telemetry = v == "on";
           return Status::Ok();
         }},
        {"--max-threads", "COLLECTIVED_MAX_THREADS",
         "The most threads the gRPC server may use (each attached session, blocking join and store "
         "wait holds one); beyond it new calls get RESOURCE_EXHAUSTED. Default 8192",
         [](DaemonConfig& c, const std::string& v) {
           size_t n = 0;
           COLLECTIVED_RETURN_IF_ERROR(ParseCount(v, "--max-threads", 16, 1000000, &n));
           c.max_threads = static_cast<int>(n);
           return Status::Ok();
         }},
        {"--store-max-bytes", "COLLECTIVED_STORE_MAX_BYTES",
         "The most bytes (keys and values) the rendezvous store holds; a write beyond gets "
         "RESOURCE_EXHAUSTED. Default 1073741824 (1 GiB)",
         [](DaemonConfig& c, const std::string& v) {
           return ParseCount(v, "--store-max-bytes", 1 << 20, size_t{1} << 40, &c.store_max_bytes);
         }},
        {"--drain-timeout-ms", "COLLECTIVED_DRAIN_TIMEOUT_MS",
         "At SIGTERM, how long collectives already in flight may finish while no new groups or ops "
         "are accepted; then the rest fail with \"shutting down\". Default 10000",
         [](DaemonConfig& c, const std::string& v) {
           return ParseMillis(v, "--drain-timeout-ms", &c.drain_timeout);
         }},
        {"--shutdown-grace-ms", "COLLECTIVED_SHUTDOWN_GRACE_MS",
         "How long remaining calls may finish at shutdown (ops, sessions and store waits are "
         "failed "
         "first). Default 500",
         [](DaemonConfig& c, const std::string& v) {
           return ParseMillis(v, "--shutdown-grace-ms", &c.shutdown_grace);
         }},
        {"--sidecar-names", "COLLECTIVED_SIDECAR_NAMES",
         "Comma-separated certificate names (CN or SAN) that identify peer sidecars over mutual "
         "TLS: only they may read or write the store's group keys. Default collectived",
         [](DaemonConfig& c, const std::string& v) {
           return ParseNames(v, "--sidecar-names", &c.sidecar_names);
         }},
        // Transport security of the TCP listener.
        {"--tls-cert", "COLLECTIVED_TLS_CERT",
         "PEM certificate of this sidecar: served on the TCP listener (mutual TLS) and presented "
         "to peer sidecars. With --tls-key and --tls-ca",
         [](DaemonConfig& c, const std::string& v) {
           c.tls_cert_file = v;
           return Status::Ok();
         }},
        {"--tls-key", "COLLECTIVED_TLS_KEY", "PEM private key of --tls-cert",
         [](DaemonConfig& c, const std::string& v) {
           c.tls_key_file = v;
           return Status::Ok();
         }},
        {"--tls-ca", "COLLECTIVED_TLS_CA",
         "PEM CA certificate(s) that sign peer sidecars and remote clients: TCP clients must "
         "present a certificate it verifies",
         [](DaemonConfig& c, const std::string& v) {
           c.tls_ca_file = v;
           return Status::Ok();
         }},
        {"--tls-peer-name", "COLLECTIVED_TLS_PEER_NAME",
         "Name expected in peer sidecars' certificates (e.g. one DNS name shared by all sidecars, "
         "when peers are reached by pod IP). Default: the host of the peer's address",
         [](DaemonConfig& c, const std::string& v) {
           c.tls_peer_name = v;
           return Status::Ok();
         }},
        {"--tls-refresh-s", "COLLECTIVED_TLS_REFRESH_S",
         "How often the TLS files are re-read, in seconds (rotated certificates are picked up "
         "without a restart). Default 10",
         [](DaemonConfig& c, const std::string& v) {
           size_t n = 0;
           COLLECTIVED_RETURN_IF_ERROR(ParseCount(v, "--tls-refresh-s", 1, 86400, &n));
           c.tls_refresh_seconds = static_cast<unsigned>(n);
           return Status::Ok();
         }},
        {"--insecure-listen", "COLLECTIVED_INSECURE_LISTEN",
         "Serve plaintext gRPC on a non-loopback --listen address without TLS: anyone who reaches "
         "the port can drive the sidecar. Refused without it",
         [](DaemonConfig& c, const std::string& v) {
           return ParseSwitch(v, "--insecure-listen", &c.insecure_listen);
         },
         /*is_switch=*/true},
        {"--failed-groups-kept", "COLLECTIVED_FAILED_GROUPS_KEPT",
         "Failed groups (timeout, desync, lost peer, abort) whose final state and flight records "
         "stay queryable after the group is gone (describe, flight-recorder). Default 32",
         [](DaemonConfig& c, const std::string& v) {
           return ParseCount(v, "--failed-groups-kept", 0, 100000, &c.failed_groups_kept);
         }},
        {"--post-mortem-dir", "COLLECTIVED_POST_MORTEM_DIR",
         "Directory where the final state of every failed group is written as JSON at the moment "
         "of failure (docs/post-mortem.md). Default: none",
         [](DaemonConfig& c, const std::string& v) {
           c.post_mortem_dir = v;
           return Status::Ok();
         }},
        {"--trust-plaintext-peers", "COLLECTIVED_TRUST_PLAINTEXT_PEERS",
         "Without TLS, take every TCP caller for a peer sidecar: it may read and write the store's "
         "group keys (and so learn a group's topology or end it). For tests and single-node demos "
         "only; sidecars of real clusters authenticate each other with mutual TLS",
         [](DaemonConfig& c, const std::string& v) {
           return ParseSwitch(v, "--trust-plaintext-peers", &c.trust_plaintext_peers);
         },
         /*is_switch=*/true},
    };
    AppendResourceFlags(&fixed);
    return fixed;
  }();
  return flags;
}

}  // namespace

std::map<std::string, std::string> ProcessEnvironment() {
  std::map<std::string, std::string> env;
  for (char** entry = environ; entry && *entry; ++entry) {
    const char* equals = std::strchr(*entry, '=');
    if (equals)
      env.emplace(std::string(*entry, static_cast<size_t>(equals - *entry)),
                  std::string(equals + 1));
  }
  return env;
}

StatusOr<ParsedCommandLine> ParseDaemonCommandLine(const std::vector<std::string>& args,
                                                   const std::map<std::string, std::string>& env) {
  ParsedCommandLine parsed;
  for (const FlagSpec& spec : Flags()) {
    auto it = env.find(std::string(spec.env));
    if (it != env.end()) {
      Status status = spec.apply(parsed.config, it->second);
      if (!status.ok()) return status.WithContext("environment variable " + std::string(spec.env));
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      parsed.show_help = true;
      continue;
    }
    if (arg == "--help=markdown") {
      parsed.show_help_markdown = true;
      continue;
    }
    if (arg == "--version") {
      parsed.show_version = true;
      continue;
    }
    std::string name = arg;
    std::optional<std::string> value;
    if (auto equals = arg.find('='); equals != std::string::npos) {
      name = arg.substr(0, equals);
      value = arg.substr(equals + 1);
    }
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& candidate : Flags()) {
      if (candidate.flag == name) spec = &candidate;
    }
    if (spec == nullptr) {
      return Status::InvalidArgument("unknown flag '" + arg + "' (see --help)");
    }
    if (!value && spec->is_switch) value = "true";
    if (!value) {
      if (i + 1 >= args.size()) {
        return Status::InvalidArgument("flag " + name + " needs a value (see --help)");
      }
      value = args[++i];
    }
    COLLECTIVED_RETURN_IF_ERROR(spec->apply(parsed.config, *value));
  }
  if (parsed.config.advertise_host.empty()) {
    char host[256] = {};
    if (gethostname(host, sizeof(host) - 1) == 0) parsed.config.advertise_host = host;
  }
  if (parsed.config.socket_path.empty() && parsed.config.listen_address.empty()) {
    return Status::InvalidArgument("both --socket and --listen are disabled: nothing to serve");
  }
  return parsed;
}

bool IsLoopbackListenAddress(const std::string& listen_address) {
  std::string host = listen_address.substr(0, listen_address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;  // "", 0.0.0.0, [::], other host names: reachable from the network
}

Status CheckListenerSecurity(const DaemonConfig& config) {
  const bool cert = !config.tls_cert_file.empty();
  const bool key = !config.tls_key_file.empty();
  const bool ca = !config.tls_ca_file.empty();
  if (cert || key || ca) {
    std::string missing;
    for (auto [given, flag] :
         {std::pair{cert, "--tls-cert"}, std::pair{key, "--tls-key"}, std::pair{ca, "--tls-ca"}}) {
      if (!given) missing += std::string(missing.empty() ? "" : " and ") + flag;
    }
    if (!missing.empty()) {
      return Status::InvalidArgument(
          "mutual TLS needs --tls-cert, --tls-key and --tls-ca together: " + missing +
          " missing (or the COLLECTIVED_TLS_* variables)");
    }
    COLLECTIVED_RETURN_IF_ERROR(CheckCertificateFile(config.tls_cert_file, "--tls-cert"));
    COLLECTIVED_RETURN_IF_ERROR(
        CheckPrivateKeyFile(config.tls_key_file, config.tls_cert_file, "--tls-key"));
    COLLECTIVED_RETURN_IF_ERROR(CheckCertificateFile(config.tls_ca_file, "--tls-ca"));
    return Status::Ok();
  }
  if (config.listen_address.empty() || config.insecure_listen ||
      IsLoopbackListenAddress(config.listen_address)) {
    return Status::Ok();
  }
  return Status::InvalidArgument(
      "refusing to serve plaintext gRPC on the non-loopback address --listen " +
      config.listen_address +
      ": anyone who reaches it could drive this sidecar. Give --tls-cert, --tls-key and "
      "--tls-ca for mutual TLS, or listen on loopback (--listen 127.0.0.1:PORT), or accept the "
      "risk with --insecure-listen");
}

std::string TcpSecurityMode(const DaemonConfig& config) {
  if (config.listen_address.empty()) return "off";
  if (config.tls_enabled()) return "mutual-tls";
  if (IsLoopbackListenAddress(config.listen_address)) return "insecure (loopback)";
  return "insecure (--insecure-listen)";
}

std::string DaemonUsage() {
  std::string text =
      "Usage: collectived [FLAGS]\n\n"
      "The collectived sidecar: process groups, collectives and a rendezvous store for the\n"
      "trainers of this node, served over gRPC.\n\nFlags (each also read from an environment "
      "variable; the flag wins):\n";
  for (const FlagSpec& spec : Flags()) {
    text += "  " + std::string(spec.flag) + " (" + std::string(spec.env) + ")\n      " +
            std::string(spec.help) + "\n";
  }
  text +=
      "  --help       print this text (--help=markdown: the flags as a Markdown table)\n"
      "  --version    print the version\n";
  return text;
}

namespace {

// A help text's meaning and default: every help ends with "Default X", "Default: X" or
// "Default on this machine X (...)".
std::pair<std::string, std::string> SplitDefault(std::string_view help) {
  const size_t at = help.rfind("Default");
  if (at == std::string_view::npos) return {std::string(help), "none"};
  std::string meaning(help.substr(0, at));
  while (!meaning.empty() && (meaning.back() == ' ' || meaning.back() == '.')) meaning.pop_back();
  std::string fallback(help.substr(at + std::string_view("Default").size()));
  if (!fallback.empty() && fallback.front() == ':') fallback.erase(0, 1);
  while (!fallback.empty() && fallback.front() == ' ') fallback.erase(0, 1);
  return {meaning, fallback};
}

std::string Code(std::string_view text) {
  return text.empty() ? std::string() : "`" + std::string(text) + "`";
}

bool IsResourceFlag(std::string_view flag) {
  for (size_t i = 0; i < kResourceCount; ++i) {
    const Resource resource = static_cast<Resource>(i);
    if (flag == TotalFlag(resource) || flag == ClientShareFlag(resource)) return true;
  }
  return false;
}

}  // namespace

std::string DaemonFlagsMarkdown() {
  std::string text =
      "| flag | environment | default | meaning |\n"
      "|---|---|---|---|\n";
  bool resources_written = false;
  for (const FlagSpec& spec : Flags()) {
    if (IsResourceFlag(spec.flag)) {
      // One row for the ceilings: their defaults depend on the machine.
      if (resources_written) continue;
      resources_written = true;
      text +=
          "| `--max-R`, `--client-max-R` | `COLLECTIVED_MAX_R`, `COLLECTIVED_CLIENT_MAX_R` | "
          "from the machine, see [Ceilings](#ceilings) | the sidecar-wide total and each "
          "client process's share of resource R |\n";
      continue;
    }
    auto [meaning, fallback] = SplitDefault(spec.help);
    if (fallback == "none" && spec.is_switch) fallback = "off";
    // A literal value is code; a description ("the host name") is prose.
    if (fallback.find(' ') == std::string::npos && fallback != "none" && fallback != "off")
      fallback = Code(fallback);
    std::string escaped;
    for (char c : meaning) escaped += c == '|' ? std::string("\\|") : std::string(1, c);
    text += "| " + Code(spec.flag) + " | " + Code(spec.env) + " | " + fallback + " | " + escaped +
            " |\n";
  }
  return text;
}

}  // namespace collectived
