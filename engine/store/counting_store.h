// CountingStore: another Store seen through a counter of what is asked of it — calls, keys named
// and bytes moved each way — so that a benchmark or a test can say what a protocol costs the
// store (group formation's calls per rank, say) without a store of its own.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/store/store.h"

namespace collectived {

// Thread-safety: safe for concurrent use, as its inner store; the counters are atomic.
class CountingStore final : public Store {
 public:
  struct Counts {
    uint64_t calls = 0;      // every call, of any kind
    uint64_t keys = 0;       // keys named by those calls (a Wait on 8 keys names 8)
    uint64_t bytes_in = 0;   // keys and values sent to the store
    uint64_t bytes_out = 0;  // values returned by it
  };

  // Requires a non-null `inner`.
  explicit CountingStore(std::shared_ptr<Store> inner);
  ~CountingStore() override;

  Counts counts() const;
  // From now on every write through this view fails with Unavailable (reads still work): the
  // view of a sidecar that died, for benchmarks that simulate one (it answers no roll call).
  void SeverWrites() { severed_.store(true); }

 protected:
  Status DoSet(const std::string& key, std::string value) override;
  StatusOr<std::string> DoGet(const std::string& key, std::chrono::milliseconds timeout) override;
  StatusOr<std::int64_t> DoAdd(const std::string& key, std::int64_t delta) override;
  StatusOr<std::string> DoCompareSet(const std::string& key, const std::string& expected,
                                     std::string desired) override;
  Status DoWait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  StatusOr<bool> DoCheck(const std::vector<std::string>& keys) override;
  StatusOr<bool> DoDeleteKey(const std::string& key) override;
  StatusOr<std::int64_t> DoDeletePrefix(const std::string& prefix) override;
  StatusOr<std::int64_t> DoNumKeys() override;
  StatusOr<std::vector<std::string>> DoMultiGet(const std::vector<std::string>& keys,
                                                std::chrono::milliseconds timeout) override;
  Status DoMultiSet(const std::vector<std::string>& keys, std::vector<std::string> values) override;
  Status DoAppend(const std::string& key, std::string_view value) override;
  WaitId DoWaitAsync(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                     WaitCallback done) override;
  bool DoCancelWait(WaitId id) override;

 private:
  // One call naming `keys` keys and sending `bytes_in` bytes.
  void Count(size_t keys, size_t bytes_in);
  void Returned(size_t bytes);
  static size_t KeyBytes(const std::vector<std::string>& keys);

  // Unavailable once SeverWrites was called.
  Status CheckWritable() const;

  const std::shared_ptr<Store> inner_;
  std::atomic<bool> severed_{false};
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> keys_{0};
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_{0};
};

}  // namespace collectived
