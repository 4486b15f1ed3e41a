// sidecar_rank_worker: one rank in a process of its own, for the tests that kill a rank. It
// attaches to a sidecar, joins a group of all ranks and reports on stdout, one line each:
//   joined group_rank=G sequence=S     after CreateGroup
//   iter K                             (--mode loop) after its K-th allreduce succeeded
//   failed KIND: MESSAGE               when an op or the join failed (exit status 3)
// --mode idle joins and then waits to be killed; --mode loop runs allreduce (SUM over
// --count float32 elements in shared memory) until an op fails or it is killed.
//
// Usage: sidecar_rank_worker --address ADDR --store HOST:PORT --group NAME --rank R
//            --world-size N [--mode idle|loop] [--count C] [--timeout-ms T]
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "clients/cpp/client.h"

namespace {

void Say(const std::string& line) {
  std::fputs((line + "\n").c_str(), stdout);
  std::fflush(stdout);
}

int Fail(const collectived::Status& status) {
  Say("failed " + status.ToString());
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace collectived;
  std::string address, store, group, mode = "idle";
  int rank = -1, world_size = 0;
  size_t count = 1 << 20;
  long timeout_ms = 60000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--address") {
      address = value;
    } else if (flag == "--store") {
      store = value;
    } else if (flag == "--group") {
      group = value;
    } else if (flag == "--rank") {
      rank = std::atoi(value.c_str());
    } else if (flag == "--world-size") {
      world_size = std::atoi(value.c_str());
    } else if (flag == "--mode") {
      mode = value;
    } else if (flag == "--count") {
      count = std::strtoull(value.c_str(), nullptr, 10);
    } else if (flag == "--timeout-ms") {
      timeout_ms = std::atol(value.c_str());
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (address.empty() || group.empty() || rank < 0 || world_size <= 0 ||
      (mode != "idle" && mode != "loop")) {
    std::fprintf(stderr, "usage: see the comment at the top of rank_worker.cc\n");
    return 2;
  }

  auto client = Client::Connect(address, "rank worker " + std::to_string(rank));
  if (!client.ok()) return Fail(client.status());
  auto buffer = (*client)->AllocateBuffer(count * sizeof(float));
  if (!buffer.ok()) return Fail(buffer.status());
  GroupOptions options;
  options.name = group;
  options.rank = rank;
  options.world_size = world_size;
  options.store_address = store;
  options.timeout = std::chrono::milliseconds(timeout_ms);
  auto info = (*client)->CreateGroup(options);
  if (!info.ok()) return Fail(info.status());
  Say("joined group_rank=" + std::to_string(info->group_rank) +
      " sequence=" + std::to_string(info->sequence_number));

  if (mode == "idle") {
    while (true) pause();
  }
  auto* data = reinterpret_cast<float*>((*buffer)->data());
  for (long k = 1;; ++k) {
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(rank + 1);
    Status status =
        (*client)->AllReduce(group, ClientTensor::Shm(**buffer, 0, DType::kFloat32, count))->Wait();
    if (!status.ok()) return Fail(status);
    Say("iter " + std::to_string(k));
  }
}
