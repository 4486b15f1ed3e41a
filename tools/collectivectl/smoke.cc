// collectivectl smoke: runs every collective on a new group against running sidecars, a thread
// with its own session per rank, and prints a table of the results.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "clients/cpp/client.h"
#include "collectived/v1/admin.grpc.pb.h"
#include "rpc/address.h"
#include "rpc/channel.h"
#include "rpc/grpc_status.h"
#include "tools/collectivectl/commands.h"
#include "tools/collectivectl/smoke_cases.h"

namespace collectived::collectivectl {
namespace {

struct SmokeOptions {
  std::vector<std::string> ranks;  // one sidecar address per rank
  std::string store;
  size_t count = 1000;
  bool inline_tensors = false;
  std::chrono::milliseconds timeout{30000};
};

// The rendezvous store: --store, else the first address if it is host:port, else that sidecar's
// advertised TCP address (Admin.GetInfo).
StatusOr<std::string> SmokeStore(const SmokeOptions& smoke, const Options& options) {
  if (!smoke.store.empty()) return smoke.store;
  const std::string& first = smoke.ranks[0];
  if (first.rfind("unix:", 0) != 0) return first;
  auto channel = OpenClientChannel(first, options.tls);
  if (!channel.ok()) return channel.status();
  auto stub = v1::Admin::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + options.timeout);
  v1::SidecarInfo info;
  grpc::Status status = stub->GetInfo(&context, v1::GetInfoRequest(), &info);
  if (!status.ok())
    return FromGrpcStatus(status, &context).WithContext("asking " + first + " for its TCP address");
  std::string address =
      info.advertise_address().empty() ? info.listen_address() : info.advertise_address();
  if (address.empty())
    return Status::InvalidArgument(first + " has no TCP listener: pass --store HOST:PORT");
  return address;
}

std::string OneLine(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

int Smoke(const Options& options) {
  SmokeOptions smoke;
  if (options.timeout_set) smoke.timeout = options.timeout;
  const auto& args = options.command;
  for (size_t i = 1; i < args.size(); ++i) {
    const std::string& arg = args[i];
    bool has_value = i + 1 < args.size();
    if (arg == "--ranks" && has_value) {
      std::string list = args[++i];
      size_t start = 0;
      for (;;) {
        size_t comma = list.find(',', start);
        smoke.ranks.push_back(list.substr(start, comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (arg == "--store" && has_value) {
      smoke.store = args[++i];
    } else if (arg == "--count" && has_value) {
      char* end = nullptr;
      long long count = std::strtoll(args[++i].c_str(), &end, 10);
      if (*end != '\0' || count < 1 || count > (1 << 24))
        return Fail("--count needs an integer in [1, 16777216]");
      smoke.count = static_cast<size_t>(count);
    } else if (arg == "--inline") {
      smoke.inline_tensors = true;
    } else {
      return Fail("smoke: unknown or incomplete option '" + arg + "' (see --help)");
    }
  }
  if (smoke.ranks.size() < 2)
    return Fail("smoke needs --ranks with at least two addresses (one per rank)");
  for (const std::string& address : smoke.ranks) {
    if (StatusOr<std::string> target = ToGrpcTarget(address); !target.ok())
      return Fail(target.status());
  }
  StatusOr<std::string> store = SmokeStore(smoke, options);
  if (!store.ok()) return Fail(store.status());

  const int n = static_cast<int>(smoke.ranks.size());
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  std::random_device random;
  char suffix[16];
  std::snprintf(suffix, sizeof(suffix), "%08x", random());
  const std::string group =
      std::string("smoke-") + host + "-" + std::to_string(getpid()) + "-" + suffix;
  const std::vector<SmokeCase> cases = SmokeCases(smoke.count);
  const auto wait = smoke.timeout + std::chrono::seconds(10);

  struct Outcome {
    Status status;
    bool wrong = false;
    double ms = 0;
  };
  // outcomes[case][rank]; setup[rank] for connecting and joining.
  std::vector<std::vector<Outcome>> outcomes(cases.size(), std::vector<Outcome>(n));
  std::vector<Status> setup(n);
  std::vector<GroupInfo> infos(n);
  std::vector<Status> destroyed(n);
  std::atomic<bool> setup_failed{false};
  std::barrier sync(n);

  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      ClientOptions client_options;
      client_options.address = smoke.ranks[rank];
      client_options.tls = options.tls;
      client_options.client_name = "collectivectl smoke rank " + std::to_string(rank);
      client_options.connect_timeout = std::max(options.timeout, std::chrono::milliseconds(5000));
      std::unique_ptr<Client> client;
      const RegisteredBuffer* buffer = nullptr;
      const size_t arena_bytes = SmokeArenaBytes(n, smoke.count);
      auto connected = Client::Connect(client_options);
      if (!connected.ok()) {
        setup[rank] = connected.status();
      } else {
        client = std::move(*connected);
        if (!smoke.inline_tensors) {
          auto allocated = client->AllocateBuffer(arena_bytes);
          if (allocated.ok())
            buffer = *allocated;
          else
            setup[rank] = allocated.status().WithContext("allocating a shared-memory buffer");
        }
      }
      if (!setup[rank].ok()) setup_failed = true;
      sync.arrive_and_wait();  // every rank has a session before anyone waits in the rendezvous
      if (setup_failed) return;
      GroupOptions group_options;
      group_options.name = group;
      group_options.rank = rank;
      group_options.world_size = n;
      group_options.store_address = *store;
      group_options.timeout = smoke.timeout;
      auto info = client->CreateGroup(group_options);
      if (info.ok())
        infos[rank] = *info;
      else
        setup[rank] = info.status().WithContext("creating group '" + group + "'");
      if (!setup[rank].ok()) setup_failed = true;
      sync.arrive_and_wait();
      if (setup_failed) return;

      SmokeArena arena(buffer, arena_bytes);
      SmokeRank self{rank, n, client.get(), group, &arena, wait, {}};
      for (size_t k = 0; k < cases.size(); ++k) {
        arena.Reset();
        Outcome& outcome = outcomes[k][rank];
        auto start = std::chrono::steady_clock::now();
        self.wrong.clear();
        outcome.status = cases[k].second(self);
        if (outcome.status.ok() && !self.wrong.empty()) {
          outcome.status = Status::Internal("wrong result: " + self.wrong);
          outcome.wrong = true;
        }
        outcome.ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        sync.arrive_and_wait();  // one collective at a time, on every rank
      }
      destroyed[rank] = client->DestroyGroup(group);
    });
  }
  for (std::thread& thread : threads) thread.join();

  if (setup_failed) {
    for (int rank = 0; rank < n; ++rank) {
      if (!setup[rank].ok()) {
        std::fprintf(stderr, "collectivectl: smoke: rank %d (%s): %s\n", rank,
                     smoke.ranks[rank].c_str(), OneLine(setup[rank].ToString()).c_str());
      }
    }
    return 1;
  }
  std::printf(
      "smoke: group '%s', %d ranks on %d sidecar%s, store %s, %zu float32 elements per tensor, %s "
      "tensors\n",
      group.c_str(), n, infos[0].num_sidecars, infos[0].num_sidecars == 1 ? "" : "s",
      store->c_str(), smoke.count, smoke.inline_tensors ? "inline" : "shared-memory");
  std::printf("%-24s %-7s %10s  %s\n", "COLLECTIVE", "RESULT", "TIME (ms)", "DETAIL");
  size_t passed = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    double ms = 0;
    int first_bad = -1;
    for (int rank = 0; rank < n; ++rank) {
      ms = std::max(ms, outcomes[k][rank].ms);
      if (first_bad < 0 && !outcomes[k][rank].status.ok()) first_bad = rank;
    }
    if (first_bad < 0) {
      ++passed;
      std::printf("%-24s %-7s %10.2f\n", cases[k].first, "OK", ms);
      continue;
    }
    const Outcome& bad = outcomes[k][first_bad];
    std::string detail = "rank " + std::to_string(first_bad) + ": " +
                         OneLine(bad.wrong ? bad.status.message() : bad.status.ToString());
    int others = 0;
    for (int rank = first_bad + 1; rank < n; ++rank) others += !outcomes[k][rank].status.ok();
    if (others > 0)
      detail += " (and " + std::to_string(others) + " more rank" + (others > 1 ? "s" : "") + ")";
    std::printf("%-24s %-7s %10.2f  %s\n", cases[k].first, bad.wrong ? "WRONG" : "FAILED", ms,
                detail.c_str());
  }
  bool destroy_ok = true;
  for (int rank = 0; rank < n; ++rank) {
    if (!destroyed[rank].ok()) {
      destroy_ok = false;
      std::printf("destroying the group failed on rank %d: %s\n", rank,
                  OneLine(destroyed[rank].ToString()).c_str());
    }
  }
  std::printf("smoke: %zu of %zu collectives OK%s\n", passed, cases.size(),
              destroy_ok ? ", group destroyed" : "");
  std::fflush(stdout);
  return passed == cases.size() && destroy_ok ? 0 : 1;
}

}  // namespace collectived::collectivectl
