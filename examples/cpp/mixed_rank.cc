// One C++ rank of a mixed-language job: it joins a group that PyTorch trainers create through
// the "collectived" torch.distributed backend, and runs the same collectives as they do with
// inline tensors, checking every result exactly.
//
//   collectived-cpp-mixed-rank --address unix:///tmp/b.sock --store 127.0.0.1:7490 --rank 3
//                              [--world-size 4] [--torch-prefix 0]
//   collectived-cpp-mixed-rank --address ADDRESS --bench N   # N world-1 8-byte allreduces
//
// Joining: Client::JoinTorchGroup reads the record rank 0's torch backend publishes in the store
// torch was given (PREFIX is torch's group name, "0" for the default group), joins the group
// through this rank's own sidecar, then adds this rank to torch 1.13's init barrier
// ("store_based_barrier_key:1").
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "clients/cpp/client.h"
#include "rpc/remote_store.h"

namespace {

using collectived::ClientTensor;
using collectived::DType;
using collectived::ReduceOp;

int Fail(const std::string& what) {
  std::fprintf(stderr, "cpp rank: %s\n", what.c_str());
  return 1;
}

template <typename T>
std::string Show(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

int Bench(collectived::Client& client, int iterations) {
  collectived::GroupOptions options;
  options.name = "bench-cpp";
  options.rank = 0;
  options.world_size = 1;
  auto group = client.CreateGroup(options);
  if (!group.ok()) return Fail(group.status().ToString());
  double value = 1;
  std::vector<double> micros;
  for (int i = 0; i < iterations + 100; ++i) {
    auto start = std::chrono::steady_clock::now();
    auto status = client
                      .AllReduce("bench-cpp", ClientTensor::Inline(&value, DType::kFloat64, 1),
                                 ReduceOp::Sum())
                      ->Wait();
    auto end = std::chrono::steady_clock::now();
    if (!status.ok()) return Fail(status.ToString());
    if (i >= 100) micros.push_back(std::chrono::duration<double, std::micro>(end - start).count());
  }
  std::sort(micros.begin(), micros.end());
  std::printf("cpp inline allreduce 8 B: median %.1f us, p90 %.1f us over %d ops\n",
              micros[micros.size() / 2], micros[micros.size() * 9 / 10], iterations);
  // Back to back: every op submitted, then all waited for (the client's and the sidecar's cost
  // per op when nothing waits in between); the median of 5 rounds.
  std::vector<double> values(static_cast<size_t>(iterations), 1.0);
  std::vector<double> rounds;
  for (int round = 0; round < 5; ++round) {
    std::vector<std::shared_ptr<collectived::ClientWork>> works;
    works.reserve(values.size());
    const auto start = std::chrono::steady_clock::now();
    for (double& v : values) {
      works.push_back(client.AllReduce("bench-cpp", ClientTensor::Inline(&v, DType::kFloat64, 1),
                                       ReduceOp::Sum()));
    }
    for (auto& work : works) {
      if (auto status = work->Wait(); !status.ok()) return Fail(status.ToString());
    }
    rounds.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() /
        iterations);
  }
  std::sort(rounds.begin(), rounds.end());
  std::printf("cpp inline allreduce 8 B back to back: %.1f us per op (median of 5 rounds of %d)\n",
              rounds[2], iterations);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string address, store_address, prefix = "0";
  int rank = -1, world_size = 4, bench = 0;
  if (argc % 2 == 0) return Fail(std::string("flag ") + argv[argc - 1] + " has no value");
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    std::string value = argv[i + 1];
    if (flag == "--address")
      address = value;
    else if (flag == "--store")
      store_address = value;
    else if (flag == "--rank")
      rank = std::atoi(value.c_str());
    else if (flag == "--world-size")
      world_size = std::atoi(value.c_str());
    else if (flag == "--torch-prefix")
      prefix = value;
    else if (flag == "--bench")
      bench = std::atoi(value.c_str());
    else
      return Fail("unknown flag " + flag);
  }
  auto client = collectived::Client::Connect(address);
  if (!client.ok()) return Fail(client.status().ToString());
  if (bench > 0) return Bench(**client, bench);
  if (rank < 0 || store_address.empty()) return Fail("--rank and --store are required");

  // Over TLS when $COLLECTIVED_TLS_CA/_CERT/_KEY are set (a sidecar with mutual TLS).
  auto security =
      collectived::ChannelSecurity::Make(collectived::TlsClientOptions::FromEnvironment());
  if (!security.ok()) return Fail(security.status().ToString());
  auto store = collectived::RemoteStore::Connect(store_address, *security);
  if (!store.ok()) return Fail(store.status().ToString());
  // The default group's bootstrap record, under its prefix of the torch store.
  collectived::TorchJoin join;
  join.store = *store;
  join.group_prefix = prefix;
  join.rank = rank;
  join.world_size = world_size;
  join.barrier_key = "store_based_barrier_key:1";
  join.timeout = std::chrono::seconds(120);
  auto info = (*client)->JoinTorchGroup(join);
  if (!info.ok()) return Fail(info.status().ToString());
  const std::string group = info->name;
  const float r = static_cast<float>(rank);

  // allreduce: rank r contributes (r + 1) * (i + 1); the sum over n ranks is n(n+1)/2 * (i + 1).
  std::vector<float> x(4);
  for (int i = 0; i < 4; ++i) x[i] = (r + 1) * (i + 1);
  if (auto s = (*client)
                   ->AllReduce(group, ClientTensor::Inline(x.data(), DType::kFloat32, 4),
                               ReduceOp::Sum())
                   ->Wait();
      !s.ok()) {
    return Fail(s.ToString());
  }
  for (int i = 0; i < 4; ++i) {
    const float ranks_sum = world_size * (world_size + 1) / 2.0f;
    if (x[i] != ranks_sum * (i + 1)) return Fail("allreduce gave " + Show(x));
  }
  // broadcast from every root in turn: everyone ends with root * 10 + i.
  for (int root = 0; root < world_size; ++root) {
    std::vector<int64_t> b = {rank * 10, rank * 10 + 1, rank * 10 + 2};
    if (auto s = (*client)
                     ->Broadcast(group, ClientTensor::Inline(b.data(), DType::kInt64, 3), root)
                     ->Wait();
        !s.ok()) {
      return Fail(s.ToString());
    }
    if (b != std::vector<int64_t>{root * 10, root * 10 + 1, root * 10 + 2}) {
      return Fail("broadcast from " + std::to_string(root) + " gave " + Show(b));
    }
  }
  // all_gather: rank k contributes {k, k * k}.
  std::vector<int32_t> in = {rank, rank * rank};
  std::vector<std::vector<int32_t>> outs(world_size, std::vector<int32_t>(2, -1));
  std::vector<ClientTensor> out_tensors;
  for (auto& o : outs) out_tensors.push_back(ClientTensor::Inline(o.data(), DType::kInt32, 2));
  if (auto s =
          (*client)
              ->AllGather(group, ClientTensor::Inline(in.data(), DType::kInt32, 2), out_tensors)
              ->Wait();
      !s.ok()) {
    return Fail(s.ToString());
  }
  for (int k = 0; k < world_size; ++k) {
    if (outs[k] != std::vector<int32_t>{k, k * k})
      return Fail("all_gather[" + std::to_string(k) + "] gave " + Show(outs[k]));
  }
  if (auto s = (*client)->Barrier(group)->Wait(); !s.ok()) return Fail(s.ToString());
  std::printf("cpp rank %d: allreduce, broadcast x%d, all_gather ok\n", rank, world_size);
  return 0;
}
