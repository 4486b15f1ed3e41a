// collectivectl smoke: the cases of the smoke test, one per collective, each checking its
// result.
#include "tools/collectivectl/smoke_cases.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace collectived::collectivectl {
namespace {

// Values that stay exact in float32 when summed over a few ranks.
float SmokeValue(int rank, size_t i) {
  return static_cast<float>((rank + 1) * static_cast<int>(i % 13 + 1));
}
float SmokeSum(int n, size_t i) {
  return static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 13 + 1));
}
// What rank `from` sends to rank `to` (alltoall, scatter), element i.
float SmokeBlock(int from, int to, size_t i) {
  return static_cast<float>(10000 * from + 100 * to + i % 100);
}

}  // namespace

size_t SmokeArenaBytes(int n, size_t count) {
  return (4 * static_cast<size_t>(n) + 8) * ((count + 16) * sizeof(float) + 64);
}

std::vector<SmokeCase> SmokeCases(size_t c) {
  const size_t c2 = c / 2 + 1;  // a second, different size for the coalesced ops
  std::vector<SmokeCase> cases;
  cases.emplace_back("allreduce", [c](SmokeRank& r) {
    ClientTensor t = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->AllReduce(r.group, t, ReduceOp::Sum())));
    r.Expect("tensor", t, [&](size_t i) { return SmokeSum(r.n, i); });
    return Status::Ok();
  });
  cases.emplace_back("allreduce_coalesced", [c, c2](SmokeRank& r) {
    ClientTensor a = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    ClientTensor b = r.Take(c2, [&](size_t i) { return SmokeValue(r.rank, i) + 1; });
    COLLECTIVED_RETURN_IF_ERROR(
        r.Await(r.client->AllReduceCoalesced(r.group, {a, b}, ReduceOp::Sum())));
    r.Expect("tensors[0]", a, [&](size_t i) { return SmokeSum(r.n, i); });
    r.Expect("tensors[1]", b, [&](size_t i) { return SmokeSum(r.n, i) + r.n; });
    return Status::Ok();
  });
  cases.emplace_back("broadcast", [c](SmokeRank& r) {
    const int root = r.n - 1;
    ClientTensor t =
        r.Take(c, [&](size_t i) { return r.rank == root ? SmokeValue(root, i) : -1.0f; });
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->Broadcast(r.group, t, root)));
    r.Expect("tensor", t, [&](size_t i) { return SmokeValue(root, i); });
    return Status::Ok();
  });
  cases.emplace_back("reduce", [c](SmokeRank& r) {
    const int root = 1 % r.n;
    ClientTensor t = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->Reduce(r.group, t, root, ReduceOp::Sum())));
    if (r.rank == root)
      r.Expect("tensor on the root", t, [&](size_t i) { return SmokeSum(r.n, i); });
    return Status::Ok();
  });
  cases.emplace_back("allgather", [c](SmokeRank& r) {
    ClientTensor in = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    std::vector<ClientTensor> out;
    for (int s = 0; s < r.n; ++s) out.push_back(r.Empty(c));
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->AllGather(r.group, in, out)));
    for (int s = 0; s < r.n; ++s) {
      r.Expect("output[" + std::to_string(s) + "]", out[s],
               [&](size_t i) { return SmokeValue(s, i); });
    }
    return Status::Ok();
  });
  cases.emplace_back("allgather_into_tensor", [c](SmokeRank& r) {
    ClientTensor in = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    ClientTensor out = r.Empty(c * r.n);
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->AllGatherIntoTensor(r.group, in, out)));
    r.Expect("output", out, [&](size_t i) { return SmokeValue(static_cast<int>(i / c), i % c); });
    return Status::Ok();
  });
  cases.emplace_back("allgather_coalesced", [c, c2](SmokeRank& r) {
    const size_t sizes[2] = {c, c2};
    std::vector<ClientTensor> in, out;
    for (int k = 0; k < 2; ++k)
      in.push_back(r.Take(sizes[k], [&](size_t i) { return SmokeValue(r.rank, i) + 100 * k; }));
    for (int k = 0; k < 2; ++k) {
      for (int s = 0; s < r.n; ++s) out.push_back(r.Empty(sizes[k]));
    }
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->AllGatherCoalesced(r.group, in, out)));
    for (int k = 0; k < 2; ++k) {
      for (int s = 0; s < r.n; ++s) {
        r.Expect("output[" + std::to_string(k * r.n + s) + "]", out[k * r.n + s],
                 [&](size_t i) { return SmokeValue(s, i) + 100 * k; });
      }
    }
    return Status::Ok();
  });
  cases.emplace_back("reduce_scatter", [c](SmokeRank& r) {
    std::vector<ClientTensor> in;
    for (int s = 0; s < r.n; ++s)
      in.push_back(r.Take(c, [&](size_t i) { return SmokeValue(r.rank, s * c + i); }));
    ClientTensor out = r.Empty(c);
    COLLECTIVED_RETURN_IF_ERROR(
        r.Await(r.client->ReduceScatter(r.group, in, out, ReduceOp::Sum())));
    r.Expect("output", out, [&](size_t i) { return SmokeSum(r.n, r.rank * c + i); });
    return Status::Ok();
  });
  cases.emplace_back("reduce_scatter_tensor", [c](SmokeRank& r) {
    ClientTensor in = r.Take(c * r.n, [&](size_t i) { return SmokeValue(r.rank, i); });
    ClientTensor out = r.Empty(c);
    COLLECTIVED_RETURN_IF_ERROR(
        r.Await(r.client->ReduceScatterTensor(r.group, in, out, ReduceOp::Sum())));
    r.Expect("output", out, [&](size_t i) { return SmokeSum(r.n, r.rank * c + i); });
    return Status::Ok();
  });
  cases.emplace_back("alltoall", [c](SmokeRank& r) {
    std::vector<ClientTensor> in, out;
    for (int s = 0; s < r.n; ++s)
      in.push_back(r.Take(c, [&](size_t i) { return SmokeBlock(r.rank, s, i); }));
    for (int s = 0; s < r.n; ++s) out.push_back(r.Empty(c));
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->AllToAll(r.group, in, out)));
    for (int s = 0; s < r.n; ++s) {
      r.Expect("output[" + std::to_string(s) + "]", out[s],
               [&](size_t i) { return SmokeBlock(s, r.rank, i); });
    }
    return Status::Ok();
  });
  cases.emplace_back("alltoall_single", [c](SmokeRank& r) {
    // Uneven splits: rank a sends split(a, b) elements to rank b.
    const size_t unit = std::max<size_t>(1, c / (4 * r.n));
    auto split = [&](int a, int b) { return static_cast<uint64_t>((a + 2 * b) % 3 + 1) * unit; };
    std::vector<uint64_t> in_splits, out_splits;
    std::vector<float> in_values, expected;
    for (int b = 0; b < r.n; ++b) {
      in_splits.push_back(split(r.rank, b));
      out_splits.push_back(split(b, r.rank));
      for (size_t j = 0; j < in_splits.back(); ++j) in_values.push_back(SmokeBlock(r.rank, b, j));
      for (size_t j = 0; j < out_splits.back(); ++j) expected.push_back(SmokeBlock(b, r.rank, j));
    }
    ClientTensor in = r.Take(in_values.size(), [&](size_t i) { return in_values[i]; });
    ClientTensor out = r.Empty(expected.size());
    COLLECTIVED_RETURN_IF_ERROR(
        r.Await(r.client->AllToAllSingle(r.group, in, out, in_splits, out_splits)));
    r.Expect("output", out, [&](size_t i) { return expected[i]; });
    return Status::Ok();
  });
  cases.emplace_back("gather", [c](SmokeRank& r) {
    const int root = 0;
    ClientTensor in = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    std::vector<ClientTensor> out;
    if (r.rank == root) {
      for (int s = 0; s < r.n; ++s) out.push_back(r.Empty(c));
    }
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->Gather(r.group, in, out, root)));
    for (size_t s = 0; s < out.size(); ++s) {
      r.Expect("output[" + std::to_string(s) + "] on the root", out[s],
               [&](size_t i) { return SmokeValue(static_cast<int>(s), i); });
    }
    return Status::Ok();
  });
  cases.emplace_back("scatter", [c](SmokeRank& r) {
    const int root = r.n - 1;
    std::vector<ClientTensor> in;
    if (r.rank == root) {
      for (int s = 0; s < r.n; ++s)
        in.push_back(r.Take(c, [&](size_t i) { return SmokeBlock(root, s, i); }));
    }
    ClientTensor out = r.Empty(c);
    COLLECTIVED_RETURN_IF_ERROR(r.Await(r.client->Scatter(r.group, in, out, root)));
    r.Expect("output", out, [&](size_t i) { return SmokeBlock(root, r.rank, i); });
    return Status::Ok();
  });
  cases.emplace_back("barrier", [](SmokeRank& r) { return r.Await(r.client->Barrier(r.group)); });
  cases.emplace_back("send/recv", [c](SmokeRank& r) {
    // A ring: every rank sends to the next and receives from the previous, tag 7.
    const int next = (r.rank + 1) % r.n, previous = (r.rank + r.n - 1) % r.n;
    ClientTensor out = r.Take(c, [&](size_t i) { return SmokeValue(r.rank, i); });
    ClientTensor in = r.Empty(c);
    auto send = r.client->Send(r.group, out, next, /*tag=*/7);
    auto recv = r.client->Recv(r.group, in, previous, /*tag=*/7);
    Status sent = r.Await(send);
    Status received = r.Await(recv);
    COLLECTIVED_RETURN_IF_ERROR(sent);
    COLLECTIVED_RETURN_IF_ERROR(received);
    r.Expect("received tensor", in, [&](size_t i) { return SmokeValue(previous, i); });
    return Status::Ok();
  });
  return cases;
}

}  // namespace collectived::collectivectl
