// Sidecar processes for the benchmarks: start build/bin/collectived on a private Unix socket and
// a free loopback port, wait until it answers, and stop it. The sidecar gets SIGTERM if the
// benchmark dies (PR_SET_PDEATHSIG), so an interrupted run leaves nothing running.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "engine/vocabulary/status.h"

namespace collectived {

struct SidecarProcess {
  pid_t pid = -1;
  std::string unix_address;
  std::string tcp_address;  // advertised host:port, from Admin.GetInfo
  std::string log_path;
};

// The directory of the running binary (build/bin, where collectived is too).
std::string SelfDirectory();

// The whole of a (log) file; "" when it cannot be read.
std::string ReadFile(const std::string& path);

// Starts `binary` as sidecar number `index` with its socket and log in `dir` (--listen
// 127.0.0.1:0, --advertise 127.0.0.1, no metrics endpoint, log level warning, then
// `extra_args`), and waits (30 s at most) until it answers Admin.GetInfo. Unavailable with its
// log when it exits or does not answer.
StatusOr<SidecarProcess> SpawnSidecar(const std::string& binary, const std::string& dir, int index,
                                      const std::vector<std::string>& extra_args);

// SIGTERM, then waits (SIGKILL after 20 s). Returns the exit status (-1 if killed).
int StopSidecar(SidecarProcess& side);

}  // namespace collectived
