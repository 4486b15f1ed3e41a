#include "tests/sidecar/sidecar_cluster.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "collectived/v1/admin.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "rpc/grpc_status.h"

extern char** environ;

namespace collectived::sidecar_test {
namespace {

using Clock = std::chrono::steady_clock;

std::string ErrnoText(const std::string& what, int error) {
  return what + ": " + std::strerror(error);
}

}  // namespace

std::string BinDir() {
  char path[PATH_MAX] = {};
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return ".";
  std::string exe(path, static_cast<size_t>(n));
  return exe.substr(0, exe.rfind('/'));
}

// The build's test-certs/, found beside bin/ so that a copied build (scripts/gpu-bundle.sh) finds
// its own; the configured path otherwise.
std::string TestCertificatesDir() {
  const std::string beside = BinDir() + "/../test-certs";
  if (access((beside + "/ca.crt").c_str(), R_OK) == 0) return beside;
  return COLLECTIVED_TEST_CERTS_DIR;
}

std::string MakeTempDir(const std::string& stem) {
  std::string pattern = "/tmp/" + stem + "-XXXXXX";
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) return "/tmp";
  return buffer.data();
}

// ---------------------------------------------------------------------------------------------
// ChildProcess

StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(const std::vector<std::string>& argv,
                                                            const std::string& log_path,
                                                            bool capture_stdout) {
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (log_fd < 0) return Status::Unavailable(ErrnoText("cannot open " + log_path, errno));
  int pipe_fds[2] = {-1, -1};
  if (capture_stdout && pipe2(pipe_fds, O_CLOEXEC) != 0) {
    close(log_fd);
    return Status::Unavailable(ErrnoText("pipe2", errno));
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, capture_stdout ? pipe_fds[1] : log_fd, 1);
  posix_spawn_file_actions_adddup2(&actions, log_fd, 2);
  // The test process blocks no signals the child needs; reset the mask and dispositions.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty, defaults;
  sigemptyset(&empty);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  int error = posix_spawn(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(log_fd);
  if (capture_stdout) close(pipe_fds[1]);
  if (error != 0) {
    if (capture_stdout) close(pipe_fds[0]);
    return Status::Unavailable(ErrnoText("cannot start " + argv[0], error));
  }
  return std::unique_ptr<ChildProcess>(
      new ChildProcess(pid, capture_stdout ? pipe_fds[0] : -1, log_path));
}

ChildProcess::~ChildProcess() {
  if (!reaped_) (void)SignalAndWait(SIGKILL, milliseconds(10000));
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

StatusOr<std::string> ChildProcess::ReadLine(milliseconds timeout) {
  if (stdout_fd_ < 0) return Status::InvalidArgument("stdout is not captured");
  const auto deadline = Clock::now() + timeout;
  while (true) {
    auto newline = buffered_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffered_.substr(0, newline);
      buffered_.erase(0, newline + 1);
      return line;
    }
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Status::Timeout("no line from pid " + std::to_string(pid_));
    pollfd fd{stdout_fd_, POLLIN, 0};
    int ready = poll(&fd, 1, static_cast<int>(left));
    if (ready < 0 && errno != EINTR) return Status::Unavailable(ErrnoText("poll", errno));
    if (ready <= 0) continue;
    char chunk[4096];
    ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n == 0) return Status::Unavailable("end of output of pid " + std::to_string(pid_));
    if (n < 0 && errno != EINTR) return Status::Unavailable(ErrnoText("read", errno));
    if (n > 0) buffered_.append(chunk, static_cast<size_t>(n));
  }
}

StatusOr<int> ChildProcess::PollWaitpid(int options, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    int status = 0;
    pid_t done = waitpid(pid_, &status, WNOHANG | options);
    if (done == pid_ && WIFSTOPPED(status)) return status;
    if (done == pid_ || (done < 0 && errno == ECHILD)) {
      reaped_ = true;
      wait_status_ = status;
      return status;
    }
    if (Clock::now() >= deadline) {
      return Status::Timeout("pid " + std::to_string(pid_) + " still runs");
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
}

StatusOr<int> ChildProcess::Wait(milliseconds timeout) {
  if (reaped_) return wait_status_;
  return PollWaitpid(0, timeout);
}

StatusOr<int> ChildProcess::SignalAndWait(int signal, milliseconds timeout) {
  if (!reaped_) kill(pid_, signal);
  return Wait(timeout);
}

Status ChildProcess::Pause() {
  if (reaped_) return Status::Unavailable("pid " + std::to_string(pid_) + " has exited");
  if (kill(pid_, SIGSTOP) != 0) return Status::Unavailable(ErrnoText("kill", errno));
  StatusOr<int> status = PollWaitpid(WUNTRACED, milliseconds(5000));
  if (!status.ok()) return status.status();
  if (!WIFSTOPPED(*status)) {
    return Status::Unavailable("pid " + std::to_string(pid_) + " exited instead of stopping");
  }
  return Status::Ok();
}

void ChildProcess::Resume() {
  if (!reaped_) kill(pid_, SIGCONT);
}

bool ChildProcess::running() {
  if (reaped_) return false;
  return !Wait(milliseconds(0)).ok();
}

std::string ChildProcess::Log() const {
  std::ifstream in(log_path_);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// ---------------------------------------------------------------------------------------------
// SidecarProcess

StatusOr<std::unique_ptr<SidecarProcess>> SidecarProcess::Start(
    const std::string& dir, const std::string& name, const std::vector<std::string>& extra_args) {
  std::unique_ptr<SidecarProcess> sidecar(new SidecarProcess());
  sidecar->name_ = name;
  const std::string socket = dir + "/" + name + ".sock";
  sidecar->unix_address_ = "unix://" + socket;
  std::vector<std::string> args = {BinDir() + "/collectived",
                                   "--socket",
                                   socket,
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--advertise",
                                   "127.0.0.1",
                                   "--metrics",
                                   "",
                                   "--log-level",
                                   "info"};
  // Every sidecar of the tests has an admin token, so that tests can abort groups.
  sidecar->admin_token_file_ = dir + "/" + name + ".admin-token";
  {
    std::ofstream token(sidecar->admin_token_file_);
    token << kTestAdminToken << "\n";
    if (!token) return Status::Unavailable("cannot write " + sidecar->admin_token_file_);
  }
  args.insert(args.end(), {"--admin-token-file", sidecar->admin_token_file_});
  // Mutual TLS on the TCP listener: the store traffic between sidecars is the secure path.
  const std::string certs = TestCertificatesDir();
  if (access((certs + "/sidecar.crt").c_str(), R_OK) != 0) {
    return Status::Unavailable("no test certificates in " + certs +
                               " (built by the collectived_test_certs target)");
  }
  for (const std::string& arg :
       std::vector<std::string>{"--tls-cert", certs + "/sidecar.crt", "--tls-key",
                                certs + "/sidecar.key", "--tls-ca", certs + "/ca.crt"}) {
    args.push_back(arg);
  }
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  StatusOr<std::unique_ptr<ChildProcess>> process =
      ChildProcess::Spawn(args, dir + "/" + name + ".log", /*capture_stdout=*/false);
  if (!process.ok()) return process.status();
  sidecar->process_ = std::move(*process);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  // A channel opened before the socket exists backs off for seconds: wait for the file first.
  struct stat socket_info {};
  while (stat(socket.c_str(), &socket_info) != 0) {
    if (!sidecar->process_->running()) {
      return Status::Unavailable("collectived " + name + " exited: " + sidecar->Log());
    }
    if (Clock::now() > deadline) {
      return Status::Unavailable("collectived " + name +
                                 " never created its socket: " + sidecar->Log());
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  // The socket file exists from bind(), a moment before listen(): a first attempt may be
  // refused, and a channel that saw a refusal can stay failed for many seconds. Each attempt
  // uses a fresh channel with subchannels of its own.
  while (true) {
    grpc::ChannelArguments arguments;
    arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    sidecar->channel_ =
        grpc::CreateCustomChannel("unix:" + socket, grpc::InsecureChannelCredentials(), arguments);
    if (sidecar->Healthy(milliseconds(500))) break;
    if (!sidecar->process_->running()) {
      return Status::Unavailable("collectived " + name + " exited: " + sidecar->Log());
    }
    if (Clock::now() > deadline) {
      return Status::Unavailable("collectived " + name +
                                 " never became healthy: " + sidecar->Log());
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  // The TCP port from Admin.GetInfo. Right after the health check first answers SERVING the
  // advertised address may still be empty (the daemon sets it after the server started): ask
  // again until it is there.
  auto admin = v1::Admin::NewStub(sidecar->channel_);
  while (true) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::SidecarInfo info;
    grpc::Status rpc = admin->GetInfo(&context, v1::GetInfoRequest(), &info);
    if (!rpc.ok()) return FromGrpcStatus(rpc, &context).WithContext("GetInfo of " + name);
    sidecar->tcp_address_ = info.advertise_address();
    if (sidecar->tcp_address_.rfind("127.0.0.1:", 0) == 0 &&
        !sidecar->tcp_address_.ends_with(":0")) {
      break;
    }
    if (Clock::now() > deadline) {
      return Status::Internal("sidecar " + name + " advertises '" + sidecar->tcp_address_ + "'");
    }
    std::this_thread::sleep_for(milliseconds(5));
  }
  return sidecar;
}

void SidecarProcess::BeginStop() {
  // An open idle connection (even one without calls) holds the daemon's shutdown for its whole
  // grace period: close ours first.
  channel_.reset();
  if (process_ && process_->running()) {
    kill(process_->pid(), SIGTERM);
    stopped_here_ = true;
  }
}

SidecarProcess::~SidecarProcess() {
  BeginStop();
  if (!process_ || !stopped_here_) return;
  StatusOr<int> exited = process_->Wait(milliseconds(10000));
  if (!exited.ok()) {
    ADD_FAILURE() << "collectived " << name_ << " ignored SIGTERM for 10 s:\n" << Log();
  } else if (!WIFEXITED(*exited) || WEXITSTATUS(*exited) != 0) {
    const std::string log = Log();
    ADD_FAILURE() << "collectived " << name_ << " exited with wait status " << *exited
                  << " after SIGTERM; log tail:\n"
                  << log.substr(log.size() > 6000 ? log.size() - 6000 : 0);
  }
}

bool SidecarProcess::Healthy(milliseconds timeout) const {
  if (!channel_) return false;
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = health->Check(&context, request, &response);
  return status.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

// ---------------------------------------------------------------------------------------------
// Topologies

void PrintTo(const Topology& topology, std::ostream* os) {
  *os << topology.name;
}

const Topology& OneSidecarFourRanks() {
  static const Topology topology{"OneSidecarFourRanks", 1, {0, 0, 0, 0}};
  return topology;
}

const Topology& FourSidecarsOneRankEach() {
  static const Topology topology{"FourSidecarsOneRankEach", 4, {0, 1, 2, 3}};
  return topology;
}

const Topology& TwoSidecarsTwoRanksInterleaved() {
  static const Topology topology{"TwoSidecarsTwoRanksInterleaved", 2, {0, 1, 0, 1}};
  return topology;
}

const Topology& EightSidecarsSummaryAgreement() {
  static const Topology topology{
      "EightSidecarsSummaryAgreement",
      8,
      {0, 1, 2, 3, 4, 5, 6, 7},
      false,
      {"--summary-agreement-from-sidecars", "2", "--split-digest-above-ranks", "0"}};
  return topology;
}

// ---------------------------------------------------------------------------------------------
// Cluster

StatusOr<std::unique_ptr<Cluster>> Cluster::Start(const Topology& topology) {
  static uint64_t clusters_started = 0;
  std::unique_ptr<Cluster> cluster(new Cluster(topology));
  cluster->serial_ = ++clusters_started;
  cluster->dir_ = MakeTempDir("cstest");
  for (int i = 0; i < topology.sidecars; ++i) {
    const std::string name(1, static_cast<char>('A' + i));
    std::vector<std::string> extra_args;
    if (topology.distinct_nccl_hosts) {
      extra_args = {"--nccl-host-id", "collectived-test-" + std::to_string(getpid()) + "-" + name};
    }
    extra_args.insert(extra_args.end(), topology.sidecar_args.begin(), topology.sidecar_args.end());
    StatusOr<std::unique_ptr<SidecarProcess>> sidecar =
        SidecarProcess::Start(cluster->dir_, name, extra_args);
    if (!sidecar.ok()) return sidecar.status();
    cluster->sidecars_.push_back(std::move(*sidecar));
  }
  for (int rank = 0; rank < topology.world_size(); ++rank) {
    ClientOptions options;
    options.address = cluster->sidecar_of(rank).unix_address();
    options.client_name = std::string(topology.name) + " rank " + std::to_string(rank);
    StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    if (!client.ok()) return client.status().WithContext("rank " + std::to_string(rank));
    StatusOr<const RegisteredBuffer*> buffer = (*client)->AllocateBuffer(kRankBufferBytes);
    if (!buffer.ok()) return buffer.status().WithContext("rank " + std::to_string(rank));
    cluster->buffers_.push_back(*buffer);
    cluster->clients_.push_back(std::move(*client));
  }
  return cluster;
}

Cluster::~Cluster() {
  clients_.clear();  // sessions end before their sidecars stop
  // SIGTERM every sidecar first, then wait for each: they stop in parallel.
  for (auto& sidecar : sidecars_) sidecar->BeginStop();
  sidecars_.clear();
  if (dir_.rfind("/tmp/cstest-", 0) == 0 && getenv("COLLECTIVED_TEST_KEEP_LOGS") == nullptr) {
    for (const char* suffix : {".log", ".sock"}) {
      for (int i = 0; i < topology_.sidecars; ++i) {
        unlink((dir_ + "/" + std::string(1, static_cast<char>('A' + i)) + suffix).c_str());
      }
    }
    rmdir(dir_.c_str());
  }
}

std::string Cluster::UniqueName(const std::string& stem) {
  return stem + "-" + std::to_string(++next_name_);
}

StatusOr<std::vector<GroupInfo>> Cluster::CreateGroup(
    const std::string& name, std::vector<int> members, milliseconds timeout,
    const std::function<int(int)>& cuda_device_of_rank) {
  if (members.empty()) members = AllRanks(world_size());
  // The options name the members in the caller's order (the sidecar sorts them); the
  // results come back in sorted order.
  const std::vector<int> as_given = members;
  std::sort(members.begin(), members.end());
  std::vector<StatusOr<GroupInfo>> results(members.size(), Status::Internal("not run"));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < members.size(); ++i) {
    threads.emplace_back([&, i] {
      GroupOptions options;
      options.name = name;
      options.rank = members[i];
      options.world_size = world_size();
      options.members =
          members.size() == static_cast<size_t>(world_size()) ? std::vector<int>{} : as_given;
      options.store_address = store_address();
      options.timeout = timeout;
      if (cuda_device_of_rank) options.cuda_device = cuda_device_of_rank(members[i]);
      results[i] = client(members[i]).CreateGroup(options);
    });
  }
  for (auto& thread : threads) thread.join();
  std::vector<GroupInfo> infos;
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) {
      return results[i].status().WithContext("creating group '" + name + "' on rank " +
                                             std::to_string(members[i]));
    }
    infos.push_back(*results[i]);
  }
  return infos;
}

Status Cluster::DestroyGroup(const std::string& name, std::vector<int> members) {
  if (members.empty()) members = AllRanks(world_size());
  Status first;
  for (int rank : members) {
    Status status = client(rank).DestroyGroup(name);
    if (!status.ok() && first.ok()) first = status.WithContext("rank " + std::to_string(rank));
  }
  return first;
}

std::string Cluster::Logs() const {
  std::string text;
  for (const auto& sidecar : sidecars_) {
    std::string log = sidecar->Log();
    if (log.size() > 6000) log = "...\n" + log.substr(log.size() - 6000);
    text += "---- sidecar " + sidecar->name() + " ----\n" + log;
  }
  return text;
}

// ---------------------------------------------------------------------------------------------
// The shared cluster

namespace {

struct SharedState {
  std::string topology;
  std::unique_ptr<Cluster> cluster;
  Status error;
};

SharedState& Shared() {
  static SharedState* state = new SharedState();  // stopped by the environment below
  return *state;
}

class StopSharedCluster : public ::testing::Environment {
 public:
  void TearDown() override { Shared().cluster.reset(); }
};

[[maybe_unused]] ::testing::Environment* const kStopSharedCluster =
    ::testing::AddGlobalTestEnvironment(new StopSharedCluster);

}  // namespace

Cluster* SharedCluster(const Topology& topology, Status* error) {
  SharedState& state = Shared();
  if (state.topology != topology.name) {
    state.cluster.reset();
    state.topology = topology.name;
    StatusOr<std::unique_ptr<Cluster>> cluster = Cluster::Start(topology);
    state.error = cluster.ok() ? Status() : cluster.status();
    if (cluster.ok()) state.cluster = std::move(*cluster);
  }
  if (error) *error = state.error;
  return state.cluster.get();
}

std::vector<int> AllRanks(int n) {
  std::vector<int> ranks;
  for (int r = 0; r < n; ++r) ranks.push_back(r);
  return ranks;
}

std::vector<Status> WaitAll(const std::vector<std::shared_ptr<ClientWork>>& works,
                            milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<Status> statuses;
  for (const auto& work : works) {
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now());
    statuses.push_back(work->Wait(std::max(left, milliseconds(1))));
  }
  return statuses;
}

StatusOr<int> RunCollectivectl(const std::vector<std::string>& args, std::string* output) {
  std::vector<std::string> argv = {BinDir() + "/collectivectl"};
  argv.insert(argv.end(), args.begin(), args.end());
  const std::string dir = MakeTempDir("cstest-ctl");
  const std::string log = dir + "/collectivectl.log";
  StatusOr<std::unique_ptr<ChildProcess>> process =
      ChildProcess::Spawn(argv, log, /*capture_stdout=*/false);
  if (!process.ok()) return process.status();
  StatusOr<int> status = (*process)->Wait(milliseconds(30000));
  if (output) *output = (*process)->Log();
  unlink(log.c_str());
  rmdir(dir.c_str());
  if (!status.ok()) return status.status();
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
}

}  // namespace collectived::sidecar_test
