// collectived: the sidecar daemon. Parses its configuration, serves until SIGTERM or SIGINT,
// then shuts down cleanly (in-flight calls finish or fail, the socket file is removed).
#include <grpc/grpc.h>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/vocabulary/logging.h"
#include "services/collectived/config.h"
#include "services/collectived/daemon.h"
#include "services/collectived/version.h"

int main(int argc, char** argv) {
  using namespace collectived;
  std::vector<std::string> args(argv + 1, argv + argc);
  StatusOr<ParsedCommandLine> parsed = ParseDaemonCommandLine(args, ProcessEnvironment());
  if (!parsed.ok()) {
    std::fprintf(stderr, "collectived: %s\n", parsed.status().message().c_str());
    return 2;
  }
  if (parsed->show_help_markdown) {
    std::fputs(DaemonFlagsMarkdown().c_str(), stdout);
    return 0;
  }
  if (parsed->show_help) {
    std::fputs(DaemonUsage().c_str(), stdout);
    return 0;
  }
  if (parsed->show_version) {
    std::printf("collectived %s\n", kVersion);
    return 0;
  }

  if (!parsed->config.nccl_host_id.empty()) {
    // Before any thread (gRPC's, NCCL's) may read the environment.
    // Sidecars told apart this way are on one machine: NCCL's socket transport on loopback,
    // named so that an InfiniBand card is not picked (unless the environment says otherwise).
    setenv("NCCL_HOSTID", parsed->config.nccl_host_id.c_str(), 1);
    setenv("NCCL_NET", "Socket", 0);
    setenv("NCCL_SOCKET_IFNAME", "lo", 0);
    LogWarning("NCCL_HOSTID set by --nccl-host-id (a test and benchmark setting)",
               {{"nccl_host_id", parsed->config.nccl_host_id}});
  }

  // Block the stop signals in every thread (gRPC's included) and take them synchronously here.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // gRPC stays initialised until the process exits. Otherwise the last gRPC object destroyed
  // on the way out runs grpc_shutdown, which joins gRPC 1.51's internal executor threads; one
  // of them may sit in a 10 s poll, and the sidecar then took 10 s to exit after SIGTERM.
  grpc_init();
  Daemon daemon(parsed->config);
  if (Status status = daemon.Start(); !status.ok()) {
    LogError("collectived failed to start", {{"error", status.message()}});
    return 1;
  }
  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  daemon.Shutdown(signal_number == SIGTERM ? "SIGTERM" : "SIGINT");
  return 0;
}
