#include "bench/bench_sidecar.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "collectived/v1/admin.grpc.pb.h"
#include "rpc/channel.h"

namespace collectived {
namespace {
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
}  // namespace

std::string SelfDirectory() {
  std::error_code error;
  auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::string(".") : self.parent_path().string();
}

std::string ReadFile(const std::string& path) {
  std::string text;
  if (FILE* f = std::fopen(path.c_str(), "r")) {
    char chunk[4096];
    size_t n;
    while ((n = std::fread(chunk, 1, sizeof(chunk), f)) > 0) text.append(chunk, n);
    std::fclose(f);
  }
  return text;
}

StatusOr<SidecarProcess> SpawnSidecar(const std::string& binary, const std::string& dir, int index,
                                      const std::vector<std::string>& extra_args) {
  SidecarProcess side;
  std::string socket_path = dir + "/s" + std::to_string(index) + ".sock";
  side.unix_address = "unix://" + socket_path;
  side.log_path = dir + "/sidecar" + std::to_string(index) + ".log";
  std::vector<std::string> args{binary,        "--socket",    socket_path,
                                "--listen",    "127.0.0.1:0", "--advertise",
                                "127.0.0.1",   "--metrics",   "",
                                "--log-level", "warning",     "--trust-plaintext-peers"};
  args.insert(args.end(), extra_args.begin(), extra_args.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return Status::Unavailable(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127);
    int log = open(side.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (log >= 0) {
      dup2(log, 1);
      dup2(log, 2);
      close(log);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  side.pid = pid;

  auto channel = OpenSidecarChannel(side.unix_address);
  if (!channel.ok()) return channel.status();
  auto stub = v1::Admin::NewStub(*channel);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    int wstatus = 0;
    if (waitpid(pid, &wstatus, WNOHANG) == pid) {
      return Status::Unavailable(binary + " exited at start-up (status " + std::to_string(wstatus) +
                                 "): " + ReadFile(side.log_path));
    }
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(std::chrono::system_clock::now() + milliseconds(500));
    v1::SidecarInfo info;
    if (stub->GetInfo(&context, v1::GetInfoRequest(), &info).ok()) {
      side.tcp_address = info.advertise_address();
      return side;
    }
    if (Clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      return Status::Unavailable(binary +
                                 " did not answer within 30 s: " + ReadFile(side.log_path));
    }
  }
}

int StopSidecar(SidecarProcess& side) {
  if (side.pid <= 0) return 0;
  kill(side.pid, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  int wstatus = 0;
  while (waitpid(side.pid, &wstatus, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(side.pid, SIGKILL);
      waitpid(side.pid, &wstatus, 0);
      side.pid = -1;
      return -1;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  side.pid = -1;
  return WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
}

}  // namespace collectived
