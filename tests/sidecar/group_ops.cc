#include "tests/sidecar/group_ops.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

namespace collectived::sidecar_test {
namespace {

constexpr size_t kGuardBytes = 64;
constexpr std::byte kGuard{0xA5};
constexpr std::byte kSentinel{0xCD};
constexpr size_t kSlotBytes = kRankBufferBytes / 4;

std::string Where(const TestGroup& group, const std::string& op, DType dtype, TensorKind kind) {
  return op + "(" + std::string(DTypeName(dtype)) + ", " + KindName(kind) + ") on group '" +
         group.name() + "'";
}

std::string WhereReduce(const TestGroup& group, const std::string& op, DType dtype,
                        const ReduceOp& reduce_op, TensorKind kind) {
  return op + "(" + std::string(DTypeName(dtype)) + ", " + OpName(reduce_op) + ", " +
         KindName(kind) + ") on group '" + group.name() + "'";
}

std::string RankText(int group_rank) {
  return " on group rank " + std::to_string(group_rank);
}

}  // namespace

std::string KindName(TensorKind kind) {
  switch (kind) {
    case TensorKind::kShm:
      return "shm";
    case TensorKind::kInline:
      return "inline";
    case TensorKind::kMixed:
      return "mixed";
    case TensorKind::kCuda:
      return "cuda";
  }
  return "?";
}

bool UseShm(TensorKind kind, int rank, size_t index) {
  switch (kind) {
    case TensorKind::kShm:
      return true;
    case TensorKind::kInline:
      return false;
    case TensorKind::kMixed:
      return (static_cast<size_t>(rank) + index) % 2 == 0;
    case TensorKind::kCuda:
      return false;  // the arena of a CUDA group puts every tensor on the device
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Arena

ClientTensor Arena::MakeOnDevice(DType dtype, size_t count, const std::vector<std::byte>& init) {
  const size_t bytes = count * DTypeSize(dtype);
  std::vector<std::byte> image(kGuardBytes + bytes + kGuardBytes, kGuard);
  if (init.empty()) {
    std::memset(image.data() + kGuardBytes, static_cast<int>(kSentinel), bytes);
  } else {
    std::memcpy(image.data() + kGuardBytes, init.data(), bytes);
  }
  StatusOr<std::shared_ptr<DeviceBlock>> block =
      DeviceBlock::Allocate(device_, image.size(), image.data());
  if (!block.ok()) {
    ADD_FAILURE() << "cannot allocate a CUDA tensor: " << block.status().ToString();
    return ClientTensor::Cuda(nullptr, device_, dtype, count);
  }
  blocks_.push_back(*block);
  std::byte* data = (*block)->data() + kGuardBytes;
  regions_.push_back({data, bytes});
  return ClientTensor::Cuda(data, device_, dtype, count);
}

ClientTensor Arena::Make(DType dtype, size_t count, bool in_shm,
                         const std::vector<std::byte>& init) {
  if (device_ >= 0) return MakeOnDevice(dtype, count, init);
  const size_t bytes = count * DTypeSize(dtype);
  std::byte* data = nullptr;
  ClientTensor tensor;
  if (in_shm && buffer_ != nullptr) {
    size_t offset = (next_ + kGuardBytes + 63) / 64 * 64;
    if (offset + bytes + kGuardBytes > end_) {
      ADD_FAILURE() << "test bug: arena full";
      offset = (end_ - bytes - kGuardBytes) / 64 * 64;
    }
    next_ = offset + bytes + kGuardBytes;
    data = buffer_->data() + offset;
    tensor = ClientTensor::Shm(*buffer_, offset, dtype, count);
  } else {
    std::vector<std::byte>& host = host_.emplace_back(kGuardBytes + bytes + kGuardBytes);
    data = host.data() + kGuardBytes;
    tensor = ClientTensor::Inline(data, dtype, count);
  }
  std::memset(data - kGuardBytes, static_cast<int>(kGuard), kGuardBytes);
  std::memset(data + bytes, static_cast<int>(kGuard), kGuardBytes);
  if (init.empty()) {
    std::memset(data, static_cast<int>(kSentinel), bytes);
  } else {
    std::memcpy(data, init.data(), bytes);
  }
  regions_.push_back({data, bytes});
  return tensor;
}

std::vector<std::byte> Arena::Bytes(const ClientTensor& tensor) {
  if (tensor.cuda != nullptr) {
    std::vector<std::byte> bytes(tensor.bytes());
    Status copied = CopyFromDevice(tensor.cuda_device, tensor.cuda, bytes.data(), bytes.size());
    if (!copied.ok()) ADD_FAILURE() << "cannot read a CUDA tensor back: " << copied.ToString();
    return bytes;
  }
  const std::byte* data = tensor.shm != nullptr ? tensor.shm->data() + tensor.offset
                                                : static_cast<const std::byte*>(tensor.host);
  return std::vector<std::byte>(data, data + tensor.bytes());
}

std::string Arena::CheckGuards() const {
  for (size_t i = 0; i < regions_.size(); ++i) {
    Region r = regions_[i];
    std::vector<std::byte> copy;  // a device region's bytes and guards, read back
    if (device_ >= 0) {
      copy.resize(kGuardBytes + r.bytes + kGuardBytes);
      Status copied = CopyFromDevice(device_, r.data - kGuardBytes, copy.data(), copy.size());
      if (!copied.ok()) return "tensor " + std::to_string(i) + ": " + copied.ToString();
      r.data = copy.data() + kGuardBytes;
    }
    for (size_t k = 0; k < kGuardBytes; ++k) {
      if (r.data[-static_cast<std::ptrdiff_t>(k) - 1] != kGuard) {
        return "tensor " + std::to_string(i) + ": byte " + std::to_string(k + 1) +
               " before it was overwritten";
      }
      if (r.data[r.bytes + k] != kGuard) {
        return "tensor " + std::to_string(i) + ": byte " + std::to_string(k) +
               " after it was overwritten";
      }
    }
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// TestGroup

std::vector<Arena> TestGroup::Arenas() const {
  std::vector<Arena> arenas;
  for (int g = 0; g < size(); ++g) {
    if (!cuda_devices_.empty()) {
      arenas.emplace_back(cuda_devices_[g]);
      continue;
    }
    const RegisteredBuffer& buffer = cluster_->buffer(members_[g]);
    arenas.emplace_back(&buffer, slot_ * kSlotBytes, (slot_ + 1) * kSlotBytes);
  }
  return arenas;
}

std::vector<std::shared_ptr<ClientWork>> TestGroup::Issue(
    const std::function<std::shared_ptr<ClientWork>(int)>& submit) const {
  std::vector<std::shared_ptr<ClientWork>> works;
  for (int g = 0; g < size(); ++g) works.push_back(submit(g));
  return works;
}

bool ExpectAllOk(const std::vector<std::shared_ptr<ClientWork>>& works, const std::string& what,
                 bool same_sequence) {
  std::vector<Status> statuses = WaitAll(works);
  bool ok = true;
  for (size_t g = 0; g < statuses.size(); ++g) {
    if (!statuses[g].ok()) {
      ADD_FAILURE() << what << RankText(static_cast<int>(g)) << ": " << statuses[g].ToString();
      ok = false;
    }
  }
  if (ok && same_sequence) {
    for (size_t g = 0; g < works.size(); ++g) {
      EXPECT_GT(works[g]->sequence_number(), 0u) << what << RankText(static_cast<int>(g));
      EXPECT_EQ(works[g]->sequence_number(), works[0]->sequence_number())
          << what << ": sequence numbers differ between group ranks 0 and " << g;
    }
  }
  return ok;
}

void ExpectValues(const ClientTensor& tensor, const std::vector<Value>& expected,
                  const std::string& what) {
  std::string diff = CompareValues(tensor.dtype, Arena::Values(tensor), expected);
  if (!diff.empty()) ADD_FAILURE() << what << ": " << diff;
}

void ExpectGuards(const std::vector<Arena>& arenas, const std::string& what) {
  for (size_t g = 0; g < arenas.size(); ++g) {
    std::string broken = arenas[g].CheckGuards();
    if (!broken.empty()) ADD_FAILURE() << what << RankText(static_cast<int>(g)) << ": " << broken;
  }
}

// ---------------------------------------------------------------------------------------------
// The checkers

void CheckAllReduce(const TestGroup& group, DType dtype, const ReduceOp& op, TensorKind kind,
                    uint64_t seed) {
  const int n = group.size();
  const size_t count = 7;
  const std::string what = WhereReduce(group, "allreduce", dtype, op, kind);
  std::vector<Arena> arenas = group.Arenas();
  std::vector<std::vector<Value>> inputs;
  std::vector<ClientTensor> tensors;
  for (int g = 0; g < n; ++g) {
    inputs.push_back(GenerateTensor(dtype, seed, g, count));
    tensors.push_back(arenas[g].Make(dtype, inputs[g], UseShm(kind, g, 0)));
  }
  auto works =
      group.Issue([&](int g) { return group.client(g).AllReduce(group.name(), tensors[g], op); });
  if (!ExpectAllOk(works, what)) return;
  const std::vector<Value> expected = ReduceReference(dtype, op, inputs);
  for (int g = 0; g < n; ++g) ExpectValues(tensors[g], expected, what + RankText(g));
  ExpectGuards(arenas, what);
}

void CheckAllReduceCoalesced(const TestGroup& group, DType dtype, const ReduceOp& op,
                             TensorKind kind, uint64_t seed) {
  const int n = group.size();
  const std::vector<size_t> counts = {3, 1, 6};
  const std::string what = WhereReduce(group, "allreduce_coalesced", dtype, op, kind);
  std::vector<Arena> arenas = group.Arenas();
  // inputs[t][g]
  std::vector<std::vector<std::vector<Value>>> inputs(counts.size());
  std::vector<std::vector<ClientTensor>> tensors(n);
  for (int g = 0; g < n; ++g) {
    for (size_t t = 0; t < counts.size(); ++t) {
      inputs[t].push_back(GenerateTensor(dtype, seed + t, g, counts[t]));
      tensors[g].push_back(arenas[g].Make(dtype, inputs[t][g], UseShm(kind, g, t)));
    }
  }
  auto works = group.Issue(
      [&](int g) { return group.client(g).AllReduceCoalesced(group.name(), tensors[g], op); });
  if (!ExpectAllOk(works, what)) return;
  for (size_t t = 0; t < counts.size(); ++t) {
    const std::vector<Value> expected = ReduceReference(dtype, op, inputs[t]);
    for (int g = 0; g < n; ++g) {
      ExpectValues(tensors[g][t], expected, what + ", tensor " + std::to_string(t) + RankText(g));
    }
  }
  ExpectGuards(arenas, what);
}

void CheckBroadcast(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed) {
  const int n = group.size();
  const size_t count = 6;
  for (int root = 0; root < n; ++root) {
    const std::string what =
        Where(group, "broadcast", dtype, kind) + " from root " + std::to_string(root);
    std::vector<Arena> arenas = group.Arenas();
    std::vector<ClientTensor> tensors;
    for (int g = 0; g < n; ++g) {
      tensors.push_back(
          arenas[g].Make(dtype, GenerateTensor(dtype, seed + root, g, count), UseShm(kind, g, 0)));
    }
    auto works = group.Issue(
        [&](int g) { return group.client(g).Broadcast(group.name(), tensors[g], root); });
    if (!ExpectAllOk(works, what)) return;
    const std::vector<Value> expected = GenerateTensor(dtype, seed + root, root, count);
    for (int g = 0; g < n; ++g) ExpectValues(tensors[g], expected, what + RankText(g));
    ExpectGuards(arenas, what);
  }
}

void CheckReduce(const TestGroup& group, DType dtype, const ReduceOp& op, int root, TensorKind kind,
                 uint64_t seed) {
  const int n = group.size();
  const size_t count = 5;
  const std::string what =
      WhereReduce(group, "reduce", dtype, op, kind) + " to root " + std::to_string(root);
  std::vector<Arena> arenas = group.Arenas();
  std::vector<std::vector<Value>> inputs;
  std::vector<ClientTensor> tensors;
  for (int g = 0; g < n; ++g) {
    inputs.push_back(GenerateTensor(dtype, seed, g, count));
    tensors.push_back(arenas[g].Make(dtype, inputs[g], UseShm(kind, g, 0)));
  }
  auto works = group.Issue(
      [&](int g) { return group.client(g).Reduce(group.name(), tensors[g], root, op); });
  if (!ExpectAllOk(works, what)) return;
  ExpectValues(tensors[root], ReduceReference(dtype, op, inputs), what + RankText(root));
  // Other ranks' tensors are inputs only: left unchanged (collectives.proto, Reduce).
  for (int g = 0; g < n; ++g) {
    if (g != root) ExpectValues(tensors[g], inputs[g], what + " (non-root input)" + RankText(g));
  }
  ExpectGuards(arenas, what);
}

void CheckAllGather(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed) {
  const int n = group.size();
  const size_t count = 4;
  const std::string what = Where(group, "allgather", dtype, kind);
  std::vector<Arena> arenas = group.Arenas();
  std::vector<ClientTensor> inputs;
  std::vector<std::vector<ClientTensor>> outputs(n);
  for (int g = 0; g < n; ++g) {
    inputs.push_back(
        arenas[g].Make(dtype, GenerateTensor(dtype, seed, g, count), UseShm(kind, g, 0)));
    for (int r = 0; r < n; ++r) {
      outputs[g].push_back(arenas[g].Make(dtype, count, UseShm(kind, g, r + 1), {}));
    }
  }
  auto works = group.Issue(
      [&](int g) { return group.client(g).AllGather(group.name(), inputs[g], outputs[g]); });
  if (!ExpectAllOk(works, what)) return;
  for (int g = 0; g < n; ++g) {
    for (int r = 0; r < n; ++r) {
      ExpectValues(outputs[g][r], GenerateTensor(dtype, seed, r, count),
                   what + ", output " + std::to_string(r) + RankText(g));
    }
  }
  ExpectGuards(arenas, what);
}

void CheckAllGatherIntoTensor(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed) {
  const int n = group.size();
  const size_t count = 3;
  const std::string what = Where(group, "allgather_into_tensor", dtype, kind);
  std::vector<Arena> arenas = group.Arenas();
  std::vector<ClientTensor> inputs, outputs;
  std::vector<Value> expected;
  for (int g = 0; g < n; ++g) {
    std::vector<Value> mine = GenerateTensor(dtype, seed, g, count);
    expected.insert(expected.end(), mine.begin(), mine.end());
    inputs.push_back(arenas[g].Make(dtype, mine, UseShm(kind, g, 0)));
    outputs.push_back(arenas[g].Make(dtype, count * n, UseShm(kind, g, 1), {}));
  }
  auto works = group.Issue([&](int g) {
    return group.client(g).AllGatherIntoTensor(group.name(), inputs[g], outputs[g]);
  });
  if (!ExpectAllOk(works, what)) return;
  for (int g = 0; g < n; ++g) ExpectValues(outputs[g], expected, what + RankText(g));
  ExpectGuards(arenas, what);
}

void CheckAllGatherCoalesced(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed) {
  const int n = group.size();
  const std::vector<size_t> counts = {2, 5};
  const std::string what = Where(group, "allgather_coalesced", dtype, kind);
  std::vector<Arena> arenas = group.Arenas();
  std::vector<std::vector<ClientTensor>> inputs(n), outputs(n);
  for (int g = 0; g < n; ++g) {
    for (size_t t = 0; t < counts.size(); ++t) {
      inputs[g].push_back(
          arenas[g].Make(dtype, GenerateTensor(dtype, seed + t, g, counts[t]), UseShm(kind, g, t)));
    }
    for (size_t t = 0; t < counts.size(); ++t) {
      for (int r = 0; r < n; ++r) {
        outputs[g].push_back(arenas[g].Make(dtype, counts[t], UseShm(kind, g, t + r + 1), {}));
      }
    }
  }
  auto works = group.Issue([&](int g) {
    return group.client(g).AllGatherCoalesced(group.name(), inputs[g], outputs[g]);
  });
  if (!ExpectAllOk(works, what)) return;
  for (int g = 0; g < n; ++g) {
    for (size_t t = 0; t < counts.size(); ++t) {
      for (int r = 0; r < n; ++r) {
        ExpectValues(
            outputs[g][t * n + r], GenerateTensor(dtype, seed + t, r, counts[t]),
            what + ", input " + std::to_string(t) + " of rank " + std::to_string(r) + RankText(g));
      }
    }
  }
  ExpectGuards(arenas, what);
}

void CheckReduceScatter(const TestGroup& group, DType dtype, const ReduceOp& op, TensorKind kind,
                        uint64_t seed) {
  const int n = group.size();
  const size_t count = 3;
  const std::string what = WhereReduce(group, "reduce_scatter", dtype, op, kind);
  std::vector<Arena> arenas = group.Arenas();
  // contributions[k][g]: rank g's input k, destined for rank k.
  std::vector<std::vector<std::vector<Value>>> contributions(n);
  std::vector<std::vector<ClientTensor>> inputs(n);
  std::vector<ClientTensor> outputs;
  for (int g = 0; g < n; ++g) {
    for (int k = 0; k < n; ++k) {
      contributions[k].push_back(GenerateTensor(dtype, seed + k, g, count));
      inputs[g].push_back(arenas[g].Make(dtype, contributions[k][g], UseShm(kind, g, k)));
    }
    outputs.push_back(arenas[g].Make(dtype, count, UseShm(kind, g, n), {}));
  }
  auto works = group.Issue([&](int g) {
    return group.client(g).ReduceScatter(group.name(), inputs[g], outputs[g], op);
  });
  if (!ExpectAllOk(works, what)) return;
  for (int g = 0; g < n; ++g) {
    ExpectValues(outputs[g], ReduceReference(dtype, op, contributions[g]), what + RankText(g));
  }
  ExpectGuards(arenas, what);
}

void CheckReduceScatterTensor(const TestGroup& group, DType dtype, const ReduceOp& op,
                              TensorKind kind, uint64_t seed) {
  const int n = group.size();
  const size_t count = 4;
  const std::string what = WhereReduce(group, "reduce_scatter_tensor", dtype, op, kind);
  std::vector<Arena> arenas = group.Arenas();
  std::vector<std::vector<Value>> full;
  std::vector<ClientTensor> inputs, outputs;
  for (int g = 0; g < n; ++g) {
    full.push_back(GenerateTensor(dtype, seed, g, count * n));
    inputs.push_back(arenas[g].Make(dtype, full[g], UseShm(kind, g, 0)));
    outputs.push_back(arenas[g].Make(dtype, count, UseShm(kind, g, 1), {}));
  }
  auto works = group.Issue([&](int g) {
    return group.client(g).ReduceScatterTensor(group.name(), inputs[g], outputs[g], op);
  });
  if (!ExpectAllOk(works, what)) return;
  for (int g = 0; g < n; ++g) {
    std::vector<std::vector<Value>> blocks;
    for (int r = 0; r < n; ++r) {
      blocks.emplace_back(full[r].begin() + g * count, full[r].begin() + (g + 1) * count);
    }
    ExpectValues(outputs[g], ReduceReference(dtype, op, blocks), what + RankText(g));
  }
  ExpectGuards(arenas, what);
}

void CheckAllToAll(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed) {
  const int n = group.size();
  // Elements rank a sends to rank b: uneven, never 0.
  auto count = [](int a, int b) { return static_cast<size_t>(1 + (a + 2 * b) % 3); };
  auto block = [&](int a, int b) { return GenerateTensor(dtype, seed + b, a, count(a, b)); };
  const std::string what = Where(group, "alltoall", dtype, kind);
  std::vector<Arena> arenas = group.Arenas();
  std::vector<std::vector<ClientTensor>> inputs(n), outputs(n);
  for (int g = 0; g < n; ++g) {
    for (int b = 0; b < n; ++b) {
      inputs[g].push_back(arenas[g].Make(dtype, block(g, b), UseShm(kind, g, b)));
    }
    for (int a = 0; a < n; ++a) {
      outputs[g].push_back(arenas[g].Make(dtype, count(a, g), UseShm(kind, g, a + 1), {}));
    }
  }
  auto works = group.Issue(
      [&](int g) { return group.client(g).AllToAll(group.name(), inputs[g], outputs[g]); });
  if (!ExpectAllOk(works, what)) return;
  for (int g = 0; g < n; ++g) {
    for (int a = 0; a < n; ++a) {
      ExpectValues(outputs[g][a], block(a, g),
                   what + ", block from rank " + std::to_string(a) + RankText(g));
    }
  }
  ExpectGuards(arenas, what);
}

void CheckAllToAllSingle(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed) {
  const int n = group.size();
  for (bool equal : {false, true}) {
    // Elements rank a sends to rank b; uneven splits include empty blocks.
    auto split = [&](int a, int b) { return equal ? size_t{2} : static_cast<size_t>((a + b) % 3); };
    const std::string what = Where(group, "alltoall_single", dtype, kind) +
                             (equal ? " with equal splits" : " with uneven splits");
    std::vector<Arena> arenas = group.Arenas();
    std::vector<std::vector<Value>> sent(n);
    std::vector<ClientTensor> inputs, outputs;
    std::vector<std::vector<uint64_t>> input_splits(n), output_splits(n);
    for (int g = 0; g < n; ++g) {
      size_t in_total = 0, out_total = 0;
      for (int b = 0; b < n; ++b) {
        input_splits[g].push_back(split(g, b));
        output_splits[g].push_back(split(b, g));
        in_total += split(g, b);
        out_total += split(b, g);
      }
      sent[g] = GenerateTensor(dtype, seed, g, in_total);
      inputs.push_back(arenas[g].Make(dtype, sent[g], UseShm(kind, g, 0)));
      outputs.push_back(arenas[g].Make(dtype, out_total, UseShm(kind, g, 1), {}));
      if (equal) {
        input_splits[g].clear();
        output_splits[g].clear();
      }
    }
    auto works = group.Issue([&](int g) {
      return group.client(g).AllToAllSingle(group.name(), inputs[g], outputs[g], input_splits[g],
                                            output_splits[g]);
    });
    if (!ExpectAllOk(works, what)) return;
    for (int g = 0; g < n; ++g) {
      std::vector<Value> expected;
      for (int a = 0; a < n; ++a) {
        size_t offset = 0;
        for (int b = 0; b < g; ++b) offset += split(a, b);
        expected.insert(expected.end(), sent[a].begin() + offset,
                        sent[a].begin() + offset + split(a, g));
      }
      ExpectValues(outputs[g], expected, what + RankText(g));
    }
    ExpectGuards(arenas, what);
  }
}

void CheckGather(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed) {
  const int n = group.size();
  const size_t count = 4;
  for (int root = 0; root < n; ++root) {
    const std::string what =
        Where(group, "gather", dtype, kind) + " to root " + std::to_string(root);
    std::vector<Arena> arenas = group.Arenas();
    std::vector<ClientTensor> inputs;
    std::vector<std::vector<ClientTensor>> outputs(n);
    for (int g = 0; g < n; ++g) {
      inputs.push_back(
          arenas[g].Make(dtype, GenerateTensor(dtype, seed + root, g, count), UseShm(kind, g, 0)));
      if (g == root) {
        for (int r = 0; r < n; ++r) {
          outputs[g].push_back(arenas[g].Make(dtype, count, UseShm(kind, g, r + 1), {}));
        }
      }
    }
    auto works = group.Issue(
        [&](int g) { return group.client(g).Gather(group.name(), inputs[g], outputs[g], root); });
    if (!ExpectAllOk(works, what)) return;
    for (int r = 0; r < n; ++r) {
      ExpectValues(outputs[root][r], GenerateTensor(dtype, seed + root, r, count),
                   what + ", output " + std::to_string(r));
    }
    for (int g = 0; g < n; ++g) {
      ExpectValues(inputs[g], GenerateTensor(dtype, seed + root, g, count),
                   what + " (input unchanged)" + RankText(g));
    }
    ExpectGuards(arenas, what);
  }
}

void CheckScatter(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed) {
  const int n = group.size();
  const size_t count = 3;
  for (int root = 0; root < n; ++root) {
    const std::string what =
        Where(group, "scatter", dtype, kind) + " from root " + std::to_string(root);
    // The root's input for rank g.
    auto piece = [&](int g) { return GenerateTensor(dtype, seed + root, 100 + g, count); };
    std::vector<Arena> arenas = group.Arenas();
    std::vector<std::vector<ClientTensor>> inputs(n);
    std::vector<ClientTensor> outputs;
    for (int g = 0; g < n; ++g) {
      if (g == root) {
        for (int r = 0; r < n; ++r) {
          inputs[g].push_back(arenas[g].Make(dtype, piece(r), UseShm(kind, g, r)));
        }
      }
      outputs.push_back(arenas[g].Make(dtype, count, UseShm(kind, g, n), {}));
    }
    auto works = group.Issue(
        [&](int g) { return group.client(g).Scatter(group.name(), inputs[g], outputs[g], root); });
    if (!ExpectAllOk(works, what)) return;
    for (int g = 0; g < n; ++g) ExpectValues(outputs[g], piece(g), what + RankText(g));
    ExpectGuards(arenas, what);
  }
}

void CheckBarrier(const TestGroup& group) {
  const int n = group.size();
  const std::string what = "barrier on group '" + group.name() + "'";
  std::vector<std::shared_ptr<ClientWork>> works;
  for (int g = 0; g + 1 < n; ++g) works.push_back(group.client(g).Barrier(group.name()));
  std::this_thread::sleep_for(milliseconds(100));
  for (size_t g = 0; g < works.size(); ++g) {
    EXPECT_FALSE(works[g]->IsCompleted())
        << what << ": group rank " << g << " left before group rank " << n - 1
        << " entered: " << works[g]->status().ToString();
  }
  works.push_back(group.client(n - 1).Barrier(group.name()));
  ExpectAllOk(works, what);
}

void CheckSendRecv(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed) {
  const int n = group.size();
  const std::string what = Where(group, "send/recv", dtype, kind);
  struct Message {
    int src, dst;
    int64_t tag;
  };
  std::vector<Message> messages;
  for (int g = 0; g < n; ++g) {
    // Posted in this order on the receiver: tag 8 before tag 7.
    messages.push_back({g, (g + 1) % n, 8});
    messages.push_back({g, (g + 1) % n, 7});
    if (n > 2) messages.push_back({g, (g + 2) % n, 9});
  }
  auto payload = [&](const Message& m) {
    return GenerateTensor(dtype, seed * 16 + static_cast<uint64_t>(m.tag), m.src,
                          4 + static_cast<size_t>(m.tag % 3));
  };
  std::vector<Arena> arenas = group.Arenas();
  std::vector<ClientTensor> received;
  std::vector<std::shared_ptr<ClientWork>> recvs, sends;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    received.push_back(arenas[m.dst].Make(dtype, payload(m).size(), UseShm(kind, m.dst, i), {}));
    recvs.push_back(group.client(m.dst).Recv(group.name(), received.back(), m.src, m.tag));
  }
  // Sends in the opposite tag order from the receives.
  std::vector<size_t> send_order;
  for (size_t i = 0; i < messages.size(); ++i) send_order.push_back(messages.size() - 1 - i);
  for (size_t i : send_order) {
    const Message& m = messages[i];
    ClientTensor tensor = arenas[m.src].Make(dtype, payload(m), UseShm(kind, m.src, i + 1));
    sends.push_back(group.client(m.src).Send(group.name(), tensor, m.dst, m.tag));
  }
  bool ok = ExpectAllOk(sends, what + " (sends)", /*same_sequence=*/false);
  ok = ExpectAllOk(recvs, what + " (recvs)", /*same_sequence=*/false) && ok;
  if (!ok) return;
  for (size_t i = 0; i < messages.size(); ++i) {
    const Message& m = messages[i];
    const std::string message = what + ": rank " + std::to_string(m.src) + " -> rank " +
                                std::to_string(m.dst) + " tag " + std::to_string(m.tag);
    ExpectValues(received[i], payload(m), message);
    EXPECT_EQ(recvs[i]->source_rank(), m.src) << message;
  }
  ExpectGuards(arenas, what);
}

void CheckAnySourceRecv(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed) {
  const int n = group.size();
  const std::string what = Where(group, "recv from any rank", dtype, kind);
  constexpr int64_t kTag = 21;
  constexpr size_t kCount = 5;
  auto payload = [&](int src, int k) { return GenerateTensor(dtype, seed * 4 + k, src, kCount); };
  std::vector<Arena> arenas = group.Arenas();
  const int last = n - 1;
  // Posted first, so it takes the last rank's first message.
  ClientTensor named = arenas[0].Make(dtype, kCount, UseShm(kind, 0, 0), {});
  auto named_recv = group.client(0).Recv(group.name(), named, last, kTag);
  std::vector<ClientTensor> received;
  std::vector<std::shared_ptr<ClientWork>> recvs;
  for (int i = 0; i < 2 * (n - 1) - 1; ++i) {
    received.push_back(arenas[0].Make(dtype, kCount, UseShm(kind, 0, i + 1), {}));
    recvs.push_back(group.client(0).Recv(group.name(), received.back(), Client::kAnySource, kTag));
  }
  std::vector<std::shared_ptr<ClientWork>> sends;
  for (int k = 0; k < 2; ++k) {
    for (int src = 1; src < n; ++src) {
      ClientTensor tensor = arenas[src].Make(dtype, payload(src, k), UseShm(kind, src, k));
      sends.push_back(group.client(src).Send(group.name(), tensor, 0, kTag));
    }
  }
  bool ok = ExpectAllOk(sends, what + " (sends)", /*same_sequence=*/false);
  ok = ExpectAllOk({named_recv}, what + " (the named recv)", /*same_sequence=*/false) && ok;
  ok = ExpectAllOk(recvs, what + " (recvs)", /*same_sequence=*/false) && ok;
  if (!ok) return;
  EXPECT_EQ(named_recv->source_rank(), last) << what;
  ExpectValues(named, payload(last, 0), what + ": the named recv");
  // Per sender, the k-th recv (in posting order) that took its message got its k-th message.
  std::vector<int> taken(n, 0);
  taken[last] = 1;
  for (size_t i = 0; i < recvs.size(); ++i) {
    const int src = recvs[i]->source_rank();
    ASSERT_TRUE(src >= 1 && src < n) << what << ": recv " << i << " names sender " << src;
    ASSERT_LT(taken[src], 2) << what << ": rank " << src << " received more than twice";
    ExpectValues(received[i], payload(src, taken[src]),
                 what + ": recv " + std::to_string(i) + " from rank " + std::to_string(src));
    ++taken[src];
  }
  for (int src = 1; src < n; ++src) EXPECT_EQ(taken[src], 2) << what << ": rank " << src;
  ExpectGuards(arenas, what);
}

void CheckEveryCollective(const TestGroup& group, DType dtype, TensorKind kind, uint64_t seed) {
  const ReduceOp sum = ReduceOp::Sum();
  CheckAllReduce(group, dtype, sum, kind, seed + 1);
  CheckAllReduceCoalesced(group, dtype, sum, kind, seed + 2);
  CheckBroadcast(group, dtype, kind, seed + 3);
  CheckReduce(group, dtype, sum, group.size() - 1, kind, seed + 4);
  CheckAllGather(group, dtype, kind, seed + 5);
  CheckAllGatherIntoTensor(group, dtype, kind, seed + 6);
  CheckAllGatherCoalesced(group, dtype, kind, seed + 7);
  CheckReduceScatter(group, dtype, sum, kind, seed + 8);
  CheckReduceScatterTensor(group, dtype, sum, kind, seed + 9);
  CheckAllToAll(group, dtype, kind, seed + 10);
  CheckAllToAllSingle(group, dtype, kind, seed + 11);
  CheckGather(group, dtype, kind, seed + 12);
  CheckScatter(group, dtype, kind, seed + 13);
  CheckBarrier(group);
  CheckSendRecv(group, dtype, kind, seed + 14);
  CheckAnySourceRecv(group, dtype, kind, seed + 15);
}

// ---------------------------------------------------------------------------------------------
// One collective, every way it is checked

void PrintTo(const MatrixCase& c, std::ostream* os) {
  *os << c.topology.name << " " << OpKindName(c.type) << " " << DTypeName(c.dtype);
}

std::vector<MatrixCase> MatrixCases(const Topology& topology, const std::vector<DType>& dtypes) {
  std::vector<MatrixCase> cases;
  for (CollectiveType type : kCheckedCollectives) {
    if (type == CollectiveType::kBarrier) {
      cases.push_back({topology, type, DType::kUnspecified});
      continue;
    }
    // Point to point needs a peer: at world size 1 every send is to oneself, which c10d refuses
    // (and the validation tests check).
    if (type == CollectiveType::kSend && topology.world_size() < 2) continue;
    for (DType dtype : dtypes) cases.push_back({topology, type, dtype});
  }
  return cases;
}

std::string MatrixCaseName(const ::testing::TestParamInfo<MatrixCase>& info) {
  std::string name = info.param.type == CollectiveType::kSend
                         ? "send_recv"
                         : std::string(OpKindName(info.param.type));
  if (info.param.dtype != DType::kUnspecified) {
    name += "_" + std::string(DTypeName(info.param.dtype));
  }
  return name;
}

bool IsReducingType(CollectiveType type) {
  return type == CollectiveType::kAllReduce || type == CollectiveType::kAllReduceCoalesced ||
         type == CollectiveType::kReduce || type == CollectiveType::kReduceScatter ||
         type == CollectiveType::kReduceScatterTensor;
}

void CheckCollective(const TestGroup& group, CollectiveType type, DType dtype, TensorKind kind,
                     uint64_t* seed) {
  const int n = group.size();
  auto next_seed = [&] { return *seed += 1000; };
  if (type == CollectiveType::kBarrier) {
    for (int i = 0; i < 3; ++i) CheckBarrier(group);
    return;
  }
  if (IsReducingType(type)) {
    const std::vector<ReduceOp> ops = ApplicableOps(dtype);
    for (size_t i = 0; i < ops.size(); ++i) {
      const ReduceOp& op = ops[i];
      SCOPED_TRACE("op: " + OpName(op));
      switch (type) {
        case CollectiveType::kAllReduce:
          CheckAllReduce(group, dtype, op, kind, next_seed());
          break;
        case CollectiveType::kAllReduceCoalesced:
          CheckAllReduceCoalesced(group, dtype, op, kind, next_seed());
          break;
        case CollectiveType::kReduce:
          CheckReduce(group, dtype, op, static_cast<int>(i) % n, kind, next_seed());
          break;
        case CollectiveType::kReduceScatter:
          CheckReduceScatter(group, dtype, op, kind, next_seed());
          break;
        default:
          CheckReduceScatterTensor(group, dtype, op, kind, next_seed());
      }
    }
    return;
  }
  switch (type) {
    case CollectiveType::kBroadcast:
      CheckBroadcast(group, dtype, kind, next_seed());
      break;
    case CollectiveType::kAllGather:
      CheckAllGather(group, dtype, kind, next_seed());
      break;
    case CollectiveType::kAllGatherIntoTensor:
      CheckAllGatherIntoTensor(group, dtype, kind, next_seed());
      break;
    case CollectiveType::kAllGatherCoalesced:
      CheckAllGatherCoalesced(group, dtype, kind, next_seed());
      break;
    case CollectiveType::kAllToAll:
      CheckAllToAll(group, dtype, kind, next_seed());
      break;
    case CollectiveType::kAllToAllSingle:
      CheckAllToAllSingle(group, dtype, kind, next_seed());
      break;
    case CollectiveType::kGather:
      CheckGather(group, dtype, kind, next_seed());
      break;
    case CollectiveType::kScatter:
      CheckScatter(group, dtype, kind, next_seed());
      break;
    case CollectiveType::kSend:
      CheckSendRecv(group, dtype, kind, next_seed());
      CheckAnySourceRecv(group, dtype, kind, next_seed());
      break;
    default:
      ADD_FAILURE() << "unhandled collective " << OpKindName(type);
  }
}

}  // namespace collectived::sidecar_test
