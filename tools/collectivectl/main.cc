// collectivectl: the command line of collectived. Talks to a sidecar found through --address,
// $COLLECTIVED_ADDRESS or the default socket.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "rpc/address.h"
#include "rpc/channel.h"
#include "tools/collectivectl/command.h"
#include "tools/collectivectl/commands.h"

namespace collectived::collectivectl {
namespace {

constexpr char kUsage[] =
    "Usage: collectivectl [--address ADDR] [--timeout-ms N] [TLS OPTIONS] COMMAND [ARGS]\n"
    "\n"
    "Finds the sidecar through --address, else $COLLECTIVED_ADDRESS, else\n"
    "unix:///run/collectived/collectived.sock. ADDR is unix:///path or host:port.\n"
    "\n"
    "TLS options (TCP addresses only; a sidecar with mutual TLS needs all of them but\n"
    "--tls-server-name):\n"
    "  --tls-ca FILE             CA that signed the sidecar's certificate ($COLLECTIVED_TLS_CA)\n"
    "  --tls-cert FILE           client certificate ($COLLECTIVED_TLS_CERT)\n"
    "  --tls-key FILE            its private key ($COLLECTIVED_TLS_KEY)\n"
    "  --tls-server-name NAME    name expected in the sidecar's certificate (default: the\n"
    "                            address's host; $COLLECTIVED_TLS_PEER_NAME)\n"
    "\n"
    "Commands:\n"
    "  health [SERVICE]          gRPC health check; exit 0 when SERVING\n"
    "  info                      version, listeners, TCP security and backends of the sidecar\n"
    "  groups                    groups of the sidecar: members, local ranks, sequence numbers;\n"
    "                            then the failed groups it still keeps (state \"failed (gone)\")\n"
    "  describe GROUP            placement of every rank and the group's in-flight ops\n"
    "  describe GROUP --cluster  asks every sidecar of the group (at the addresses they\n"
    "                            announced, with this command's credentials) and prints one\n"
    "                            picture: per rank its sidecar, the last op completed there and\n"
    "                            the op it is stuck before or waiting in, or that its sidecar is\n"
    "                            gone. Live and failed groups alike\n"
    "  abort [--admin-token-file FILE] [--job-token-env VAR] GROUP [REASON]\n"
    "                            fail the group's ops on every rank (aborted by an operator).\n"
    "                            Needs an admin credential: the admin token read from FILE\n"
    "                            (default $COLLECTIVED_ADMIN_TOKEN_FILE), or the group's job\n"
    "                            token read from the environment variable VAR (never from the\n"
    "                            command line, where other users could read it)\n"
    "  flight-recorder [GROUP] [--limit N] [--json]\n"
    "                            the last ops of each group: state, per-rank arrival, duration\n"
    "  store set KEY VALUE       set a key in the sidecar's rendezvous store\n"
    "  store get KEY             print a key's value (waits up to --timeout-ms)\n"
    "  store add KEY DELTA       add to an integer key; prints the new value\n"
    "  store append KEY VALUE    append to a key\n"
    "  store check KEY...        prints present/missing for each key; exit 0 if all exist\n"
    "  store wait KEY...         wait until every key exists (up to --timeout-ms)\n"
    "  store delete KEY          delete a key\n"
    "  store num-keys            number of keys in the store\n"
    "  smoke --ranks ADDR,ADDR,... [--store HOST:PORT] [--count N] [--inline]\n"
    "                            run every collective on a new group with one rank (a thread\n"
    "                            with its own session) per ADDR, check each result and print\n"
    "                            a table; the same ADDR twice = 2 ranks on that sidecar.\n"
    "                            --store: the rendezvous store (default: the first ADDR if it\n"
    "                            is host:port, else that sidecar's advertised TCP address);\n"
    "                            --count: float32 elements per tensor (default 1000);\n"
    "                            --inline: tensors travel in the requests instead of shared\n"
    "                            memory. Ops time out after --timeout-ms if given, else 30 s.\n"
    "                            Exit 0 when every collective is OK.\n";

int Run(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!options.command.empty()) {
      options.command.push_back(arg);
    } else if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if ((arg == "--address" || arg == "--timeout-ms" || arg == "--tls-ca" ||
                arg == "--tls-cert" || arg == "--tls-key" || arg == "--tls-server-name") &&
               i + 1 < argc) {
      std::string value = argv[++i];
      if (arg == "--address") {
        options.address = value;
      } else if (arg == "--tls-ca") {
        options.tls.ca_file = value;
      } else if (arg == "--tls-cert") {
        options.tls.cert_file = value;
      } else if (arg == "--tls-key") {
        options.tls.key_file = value;
      } else if (arg == "--tls-server-name") {
        options.tls.server_name = value;
      } else {
        char* end = nullptr;
        long long ms = std::strtoll(value.c_str(), &end, 10);
        if (end == value.c_str() || *end != '\0' || ms < 0) {
          return Fail("--timeout-ms needs a non-negative integer, got '" + value + "'");
        }
        options.timeout = std::chrono::milliseconds(ms);
        options.timeout_set = true;
      }
    } else if (arg.rfind("--", 0) == 0) {
      return Fail("unknown or incomplete option '" + arg + "' (see --help)");
    } else {
      options.command.push_back(arg);
    }
  }
  if (options.command.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  if (options.command[0] == "smoke") return Smoke(options);
  options.address = ResolveSidecarAddress(options.address);
  auto channel = OpenClientChannel(options.address, options.tls);
  if (!channel.ok()) return Fail(channel.status());
  const std::string& command = options.command[0];
  if (command == "health") return Health(options, *channel);
  if (command == "info") return Info(options, *channel);
  if (command == "store") return StoreCommand(options, *channel);
  if (command == "groups") return Groups(options, *channel);
  if (command == "describe") return Describe(options, *channel);
  if (command == "abort") return Abort(options, *channel);
  if (command == "flight-recorder") return FlightRecorderCommand(options, *channel);
  return Fail("unknown command '" + command + "' (see --help)");
}

}  // namespace
}  // namespace collectived::collectivectl

int main(int argc, char** argv) {
  return collectived::collectivectl::Run(argc, argv);
}
