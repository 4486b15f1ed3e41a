// collectivectl smoke: the tensors and ranks of the smoke test and its cases (smoke_cases.cc),
// which smoke.cc runs.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "clients/cpp/client.h"

namespace collectived::collectivectl {

// The tensors of one rank, carved out of its registered buffer (or, with --inline, out of host
// memory whose bytes travel in the requests).
class SmokeArena {
 public:
  SmokeArena(const RegisteredBuffer* shm, size_t bytes)
      : shm_(shm), host_(shm ? 0 : bytes), size_(bytes) {}

  void Reset() { used_ = 0; }
  // A tensor of `count` float32 filled with `fill(i)`. The arena is sized for the largest case
  // (SmokeArenaBytes): running out is a bug.
  ClientTensor Take(size_t count, const std::function<float(size_t)>& fill) {
    size_t offset = used_;
    used_ += (count * sizeof(float) + 63) / 64 * 64;
    if (used_ > size_) std::abort();
    ClientTensor t = shm_ ? ClientTensor::Shm(*shm_, offset, DType::kFloat32, count)
                          : ClientTensor::Inline(host_.data() + offset, DType::kFloat32, count);
    float* data = Data(t);
    for (size_t i = 0; i < count; ++i) data[i] = fill(i);
    return t;
  }
  static float* Data(const ClientTensor& t) {
    return reinterpret_cast<float*>(t.shm ? t.shm->data() + t.offset
                                          : static_cast<std::byte*>(t.host));
  }

 private:
  const RegisteredBuffer* shm_;
  std::vector<std::byte> host_;
  size_t size_;
  size_t used_ = 0;
};

// Enough for the largest case (alltoall/allgather_coalesced: about 4n + 4 tensors of count).
size_t SmokeArenaBytes(int n, size_t count);

struct SmokeRank {
  int rank;
  int n;
  Client* client;
  std::string group;
  SmokeArena* arena;
  std::chrono::milliseconds wait;  // bound on every Wait

  Status Await(const std::shared_ptr<ClientWork>& work) const { return work->Wait(wait); }
  ClientTensor Take(size_t count, const std::function<float(size_t)>& fill) {
    return arena->Take(count, fill);
  }
  ClientTensor Empty(size_t count) {
    return arena->Take(count, [](size_t) { return -1.0f; });
  }

  // Compares `t` with expected(i); the first mismatch of the case is kept in `wrong`.
  void Expect(const std::string& what, const ClientTensor& t,
              const std::function<float(size_t)>& expected) {
    const float* data = SmokeArena::Data(t);
    for (size_t i = 0; i < t.count && wrong.empty(); ++i) {
      if (data[i] != expected(i)) {
        wrong = what + "[" + std::to_string(i) + "] = " + std::to_string(data[i]) + ", expected " +
                std::to_string(expected(i));
      }
    }
  }
  std::string wrong;  // empty while every checked element was right
};

using SmokeCase = std::pair<const char*, std::function<Status(SmokeRank&)>>;

// Every collective, on tensors of `c` float32 (and a second size for the coalesced ops).
std::vector<SmokeCase> SmokeCases(size_t c);

}  // namespace collectived::collectivectl
