// Test harness for the multi-process sidecar tests: real `collectived` processes on loopback
// (spawned from build/bin, next to the test binary), ranks as Clients of those sidecars, and
// helper processes (collectivectl, the rank worker).
//
// Every sidecar gets a private Unix socket under a fresh /tmp directory, a TCP listener on
// 127.0.0.1 with a port chosen by the kernel (read back through the Admin API) served with
// mutual TLS (the certificates of TestCertificatesDir(), so sidecars reach each other's stores
// over mutual TLS), --advertise 127.0.0.1 and no metrics endpoint. Processes are started with
// posix_spawn (never fork: the test process has initialised gRPC). Set COLLECTIVED_TEST_KEEP_LOGS=1
// to keep the sidecars' logs (/tmp/cstest-*/<sidecar>.log) after a run; failing tests print them.
//
// Thread-safety: a Cluster may be used from several threads once started (its Clients are
// thread-safe); starting and stopping are single-threaded.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "clients/cpp/client.h"
#include "engine/vocabulary/status.h"

namespace grpc {
class Channel;
}

namespace collectived::sidecar_test {

using std::chrono::milliseconds;

// The directory of the running test binary (build/bin), where collectived, collectivectl and
// sidecar_rank_worker live too.
std::string BinDir();

// Where scripts/gen-certs.sh wrote the tests' certificates (build/test-certs): ca.crt,
// sidecar.crt/.key, client.crt/.key, ...
std::string TestCertificatesDir();

// A fresh private directory under /tmp (short: Unix socket paths are limited to 107 bytes).
std::string MakeTempDir(const std::string& stem);

// A child process started with posix_spawn; stdout goes to a pipe the test can read lines
// from, stderr to `log_path` (stdout too when `capture_stdout` is false).
class ChildProcess {
 public:
  static StatusOr<std::unique_ptr<ChildProcess>> Spawn(const std::vector<std::string>& argv,
                                                       const std::string& log_path,
                                                       bool capture_stdout);
  // Kills (SIGKILL) and reaps the child if it still runs.
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // Reads one line of the child's stdout (without the newline). Returns Timeout when none
  // arrives within `timeout`, Unavailable at end of file.
  StatusOr<std::string> ReadLine(milliseconds timeout);
  // Sends `signal`; then waits at most `timeout` for the exit. Returns the raw wait status, or
  // Timeout (the child still runs).
  StatusOr<int> SignalAndWait(int signal, milliseconds timeout);
  // Waits for the exit. Returns the raw wait status or Timeout.
  StatusOr<int> Wait(milliseconds timeout);
  // Whether it still runs (reaps it when it has exited).
  bool running();
  // Stops it with SIGSTOP and returns once every thread has stopped (kill() alone returns
  // while its threads may still run for a moment). Timeout when no stop is reported in 5 s.
  Status Pause();
  // SIGCONT after Pause().
  void Resume();
  // The contents of its log file.
  std::string Log() const;

 private:
  ChildProcess(pid_t pid, int stdout_fd, std::string log_path)
      : pid_(pid), stdout_fd_(stdout_fd), log_path_(std::move(log_path)) {}
  // Polls waitpid(WNOHANG | options) until it reports the child (an exit reaps it; a stop, with
  // WUNTRACED, does not) and returns the raw status, or Timeout after `timeout`.
  StatusOr<int> PollWaitpid(int options, milliseconds timeout);

  pid_t pid_;
  int stdout_fd_;  // -1 when not captured
  std::string buffered_;
  std::string log_path_;
  bool reaped_ = false;
  int wait_status_ = 0;
};

// The admin token of every sidecar the tests start (SidecarProcess::admin_token_file).
inline constexpr char kTestAdminToken[] = "test-admin-token-0123456789abcdef";

// One collectived process.
class SidecarProcess {
 public:
  // Starts build/bin/collectived with `name`.sock in `dir` and waits (at most 20 s) until its
  // gRPC health check answers SERVING; then learns its TCP port from Admin.GetInfo.
  // `extra_args` are appended to the command line (e.g. {"--drain-timeout-ms", "300"}).
  static StatusOr<std::unique_ptr<SidecarProcess>> Start(
      const std::string& dir, const std::string& name,
      const std::vector<std::string>& extra_args = {});
  // Stops it: BeginStop(), then waits; kills it (SIGKILL) when it still runs after 10 s. A
  // sidecar stopped here must exit with status 0 (a sanitizer's report makes it exit non-zero);
  // one the test killed itself is not checked.
  ~SidecarProcess();
  // Closes the test's own channel to it and sends SIGTERM; returns at once.
  void BeginStop();

  const std::string& name() const { return name_; }
  // "unix:///tmp/.../name.sock": what a local trainer uses.
  const std::string& unix_address() const { return unix_address_; }
  // "127.0.0.1:PORT": the TCP listener (peers, rendezvous store, remote clients).
  const std::string& tcp_address() const { return tcp_address_; }
  pid_t pid() const { return process_->pid(); }
  ChildProcess& process() { return *process_; }
  // The file holding its admin token (kTestAdminToken): --admin-token-file.
  const std::string& admin_token_file() const { return admin_token_file_; }
  // The test's channel to it (Admin, health); null after BeginStop().
  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  std::string Log() const { return process_->Log(); }
  // Whether the health check answers SERVING within `timeout`.
  bool Healthy(milliseconds timeout) const;

 private:
  SidecarProcess() = default;
  std::string name_;
  std::string unix_address_;
  std::string tcp_address_;
  std::string admin_token_file_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<ChildProcess> process_;
  bool stopped_here_ = false;  // BeginStop() sent the SIGTERM
};

// How ranks are placed on sidecars.
struct Topology {
  const char* name;                  // e.g. "TwoSidecarsTwoRanksInterleaved"
  int sidecars;                      // how many collectived processes
  std::vector<int> sidecar_of_rank;  // global rank -> sidecar index
  // Each sidecar is started with an NCCL host identity of its own (--nccl-host-id), so that
  // sidecars sharing one GPU can form one NCCL communicator (over NCCL's socket transport).
  bool distinct_nccl_hosts = false;
  // Appended to every sidecar's command line.
  std::vector<std::string> sidecar_args = {};
  int world_size() const { return static_cast<int>(sidecar_of_rank.size()); }
};

// Prints the topology's name (GoogleTest parameter names in ctest).
void PrintTo(const Topology& topology, std::ostream* os);

// (a) one sidecar with 4 ranks; (b) 4 sidecars with one rank each; (c) 2 sidecars with 2 ranks
// each, interleaved: ranks 0 and 2 on sidecar A (index 0), 1 and 3 on sidecar B (index 1).
const Topology& OneSidecarFourRanks();
const Topology& FourSidecarsOneRankEach();
const Topology& TwoSidecarsTwoRanksInterleaved();
// Eight sidecars, one rank each, agreeing through summaries (--summary-agreement-from-sidecars
// 2) and checking alltoall split sizes through digests (--split-digest-above-ranks 0): the tree
// of fixed-size summaries over real sockets, and point-to-point transfers between sidecars that
// are not dissemination peers (0 and 3, for one), connected on first use.
const Topology& EightSidecarsSummaryAgreement();

// Bytes of the shared-memory buffer every rank of a Cluster registers at start.
inline constexpr size_t kRankBufferBytes = 4 << 20;

// Sidecars plus one Client (its own session) per global rank.
class Cluster {
 public:
  static StatusOr<std::unique_ptr<Cluster>> Start(const Topology& topology);
  ~Cluster();

  const Topology& topology() const { return topology_; }
  // Distinct for every cluster this process starts: a stopped cluster's address may be reused.
  uint64_t serial() const { return serial_; }
  int world_size() const { return topology_.world_size(); }
  SidecarProcess& sidecar(int index) { return *sidecars_[index]; }
  SidecarProcess& sidecar_of(int rank) { return *sidecars_[topology_.sidecar_of_rank[rank]]; }
  Client& client(int rank) { return *clients_[rank]; }
  // kRankBufferBytes of shared memory registered by rank `rank`.
  const RegisteredBuffer& buffer(int rank) const { return *buffers_[rank]; }
  // The rendezvous store of every group: sidecar A's TCP address.
  std::string store_address() const { return sidecars_[0]->tcp_address(); }
  // A group name never used before in this cluster: "<stem>-<n>".
  std::string UniqueName(const std::string& stem);

  // Creates group `name` on every rank of `members` (empty = all; any order, passed as given
  // in GroupOptions.members) at once, each through its own client, with sidecar A's store, and
  // returns their infos in sorted member order. Returns the first error.
  // `cuda_device_of_rank` (global rank -> CUDA device) makes it a CUDA group.
  StatusOr<std::vector<GroupInfo>> CreateGroup(
      const std::string& name, std::vector<int> members = {},
      milliseconds timeout = milliseconds(30000),
      const std::function<int(int)>& cuda_device_of_rank = nullptr);
  // Destroys `name` on every rank of `members` (empty = all). Returns the first error.
  Status DestroyGroup(const std::string& name, std::vector<int> members = {});

  // The logs of every sidecar, for failure messages.
  std::string Logs() const;

 private:
  explicit Cluster(Topology topology) : topology_(std::move(topology)) {}
  Topology topology_;
  std::string dir_;
  std::vector<std::unique_ptr<SidecarProcess>> sidecars_;
  std::vector<std::unique_ptr<Client>> clients_;
  std::vector<const RegisteredBuffer*> buffers_;
  int next_name_ = 0;
  uint64_t serial_ = 0;
};

// One cluster per test process at a time, started on first use and kept across the tests of
// that topology (switching topology stops the previous one). Stopped by a global test
// environment at the end of the run. Returns null (and records why in *error) when the
// cluster cannot start.
Cluster* SharedCluster(const Topology& topology, Status* error);

// Sorted global ranks of all of [0, n).
std::vector<int> AllRanks(int n);

// Waits for every work (a client-side bound: the ops themselves keep running past it).
// Returns their statuses in order.
std::vector<Status> WaitAll(const std::vector<std::shared_ptr<ClientWork>>& works,
                            milliseconds timeout = milliseconds(30000));

// Runs build/bin/collectivectl with `args`; returns its exit code, and its output in *output.
StatusOr<int> RunCollectivectl(const std::vector<std::string>& args, std::string* output);

}  // namespace collectived::sidecar_test
