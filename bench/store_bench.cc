// Store benchmark: latency and throughput of set/get/add over a sidecar's Unix socket with 1 and
// 16 concurrent clients, and the time for 64 simulated ranks to rendezvous (each sets its key,
// then waits for all). Prints tables; asserts nothing.
//
// Usage: store_bench [--address ADDR] [--ops N]
//   Without --address it starts an in-process daemon on a private Unix socket (the clients still
//   go through the socket and gRPC, as trainers do).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "rpc/remote_store.h"
#include "services/collectived/daemon.h"

namespace collectived {
namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  double p50_us, p99_us, ops_per_s;
};

Result Measure(const std::string& address, int clients, int ops_per_client, const char* op) {
  std::vector<std::vector<double>> latencies(clients);
  std::vector<std::thread> threads;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  auto start = Clock::now();
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      auto store = *RemoteStore::Connect(address);
      std::string key = "bench/" + std::string(op) + "/" + std::to_string(c);
      (void)store->Set(key, "0");  // connect and create the key before timing
      ready.fetch_add(1);
      while (!go.load()) std::this_thread::yield();
      latencies[c].reserve(ops_per_client);
      for (int i = 0; i < ops_per_client; ++i) {
        auto t0 = Clock::now();
        if (op[0] == 's') {
          (void)store->Set(key, "value-" + std::to_string(i));
        } else if (op[0] == 'g') {
          (void)store->Get(key);
        } else {
          (void)store->Add(key, 1);
        }
        latencies[c].push_back(
            std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      }
    });
  }
  while (ready.load() < clients) std::this_thread::yield();
  start = Clock::now();
  go.store(true);
  for (auto& thread : threads) thread.join();
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<double> all;
  for (auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  return {all[all.size() / 2], all[all.size() * 99 / 100], all.size() / seconds};
}

double Rendezvous(const std::string& address, int ranks, int round) {
  std::vector<std::thread> threads;
  std::vector<std::shared_ptr<RemoteStore>> stores;
  for (int r = 0; r < ranks; ++r) stores.push_back(*RemoteStore::Connect(address));
  for (auto& store : stores) (void)store->Check({"warm"});  // connect before timing
  std::vector<std::string> keys;
  std::string prefix = "rdzv" + std::to_string(round) + "/";
  for (int r = 0; r < ranks; ++r) keys.push_back(prefix + std::to_string(r));
  auto start = Clock::now();
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      (void)stores[r]->Set(keys[r], "addr-of-" + std::to_string(r));
      Status status = stores[r]->Wait(keys, std::chrono::seconds(60));
      if (!status.ok()) std::fprintf(stderr, "rank %d: %s\n", r, status.ToString().c_str());
    });
  }
  for (auto& thread : threads) thread.join();
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

int Main(int argc, char** argv) {
  std::string address;
  int ops = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--address") address = argv[i + 1];
    if (flag == "--ops") ops = std::atoi(argv[i + 1]);
  }
  std::unique_ptr<Daemon> daemon;
  if (address.empty()) {
    DaemonConfig config;
    config.socket_path = "/tmp/collectived-store-bench-" + std::to_string(getpid()) + ".sock";
    config.listen_address = "127.0.0.1:0";
    config.metrics_address = "";
    config.log_level = LogLevel::kWarning;
    daemon = std::make_unique<Daemon>(config);
    if (Status status = daemon->Start(); !status.ok()) {
      std::fprintf(stderr, "%s\n", status.ToString().c_str());
      return 1;
    }
    address = "unix://" + config.socket_path;
  }
  std::printf("store benchmark against %s (%d ops per client)\n\n", address.c_str(), ops);
  std::printf("%-6s %8s %12s %12s %14s\n", "op", "clients", "p50 (us)", "p99 (us)", "ops/s");
  for (const char* op : {"set", "get", "add"}) {
    for (int clients : {1, 16}) {
      int per_client = clients == 1 ? ops : std::max(ops / 4, 100);
      Result r = Measure(address, clients, per_client, op);
      std::printf("%-6s %8d %12.1f %12.1f %14.0f\n", op, clients, r.p50_us, r.p99_us, r.ops_per_s);
    }
  }
  std::printf("\nrendezvous of 64 simulated ranks (each sets its key, then waits for all 64):\n");
  std::vector<double> times;
  for (int round = 0; round < 5; ++round) times.push_back(Rendezvous(address, 64, round));
  std::sort(times.begin(), times.end());
  std::printf("  min %.1f ms, median %.1f ms, max %.1f ms over 5 rounds\n", times.front(),
              times[times.size() / 2], times.back());
  if (daemon) daemon->Shutdown("benchmark over");
  return 0;
}

}  // namespace
}  // namespace collectived

int main(int argc, char** argv) {
  return collectived::Main(argc, argv);
}
