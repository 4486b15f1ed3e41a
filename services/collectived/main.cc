// collectived: the sidecar daemon. Parses its configuration, serves until SIGTERM or SIGINT,
// then shuts down cleanly (in-flight calls finish or fail, the socket file is removed).
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/logging.h"
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
  if (parsed->show_help) {
    std::fputs(DaemonUsage().c_str(), stdout);
    return 0;
  }
  if (parsed->show_version) {
    std::printf("collectived %s\n", kVersion);
    return 0;
  }

  // Block the stop signals in every thread (gRPC's included) and take them synchronously here.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

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
