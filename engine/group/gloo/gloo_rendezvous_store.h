// GlooRendezvousStore: lets Gloo rendezvous (gloo::rendezvous::Context::connectFullMesh) run on
// a collectived Store, so the sidecars of a group meet in our store, under our prefixes and
// timeouts, instead of in a Gloo-specific store.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/status.h"
#include "engine/store/store.h"

namespace collectived {

// Adapts collectived::Store to the gloo::rendezvous::Store interface of the Gloo 0.5.0
// snapshot, which has only set, get and wait (with and without a timeout). That interface has
// no multi_get/multi_set and no has_v2_support, so Gloo reads peers' records key by key: one
// wait and one get per peer. To spare those round trips (they go to a remote store, and add up
// to O(nodes^2) requests per group), the adapter can be told which keys Gloo will read, in read
// batches: the first get() or wait() that names a key of a batch fetches the whole batch with
// one Store::MultiGet, and later reads of its keys are answered from that copy.
// ConnectFullMeshReads() gives the batches of connectFullMesh. A batch may only name keys that
// are written once and never change, and that their writers write without waiting for the
// reader (else the reader waits for the whole batch in vain until its timeout).
//
// Gloo reports failures by exceptions, so every method throws on a non-OK Status:
// gloo::InvalidOperationException for InvalidArgument, gloo::IoException for everything else
// (Timeout included). The exception message carries the Status ("timeout: Timeout after ...");
// a batch that times out names every key of the batch that was still missing.
//
// Thread-safety: safe for concurrent use from many threads (the wrapped Store is thread-safe;
// reads of batch keys are serialized by a mutex, the rest holds only immutable state).
class GlooRendezvousStore : public gloo::rendezvous::Store {
 public:
  // Creates an adapter over `store`, which must not be null (a null store aborts the process).
  // get() and wait(keys) use `timeout`; std::nullopt means the wrapped store's default timeout
  // at the time of each call. `read_batches` are the read batches (see above); a key in more
  // than one batch belongs to the first.
  explicit GlooRendezvousStore(std::shared_ptr<collectived::Store> store,
                               StoreTimeout timeout = std::nullopt,
                               std::vector<std::vector<std::string>> read_batches = {});
  ~GlooRendezvousStore() override;

  // The keys connectFullMesh of the Gloo 0.5.0 snapshot reads as node `rank` of `size`, in read
  // batches: the host names of the lower ranks ("rank_<i>", to count local ranks) and every
  // peer's addresses ("<i>"), each split so that one batch stays far below a gRPC message.
  static std::vector<std::vector<std::string>> ConnectFullMeshReads(int rank, int size);

  // Stores `data` under `key`. Throws on an invalid key or a value over kMaxValueBytes.
  void set(const std::string& key, const std::vector<char>& data) override;

  // Returns the value of `key`, blocking until it exists (for a batch key: until every key of
  // its batch exists). Throws gloo::IoException with our "Timeout after ..." message if it does
  // not appear within the adapter's timeout.
  std::vector<char> get(const std::string& key) override;

  // Blocks until all `keys` exist, for at most the adapter's timeout. Throws on timeout.
  void wait(const std::vector<std::string>& keys) override;

  // Blocks until all `keys` exist, for at most `timeout` (gloo::kNoTimeout, 0 ms: no deadline;
  // a timeout over kMaxStoreTimeout is shortened to kMaxStoreTimeout). Throws on timeout or a
  // negative timeout.
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // Returns the wrapped store.
  const std::shared_ptr<collectived::Store>& store() const { return store_; }

 private:
  // Waits for the keys of `keys` that are not batch keys; fetches the batches of the others.
  void WaitFor(const std::vector<std::string>& keys, StoreTimeout timeout);
  // Fetches batch `batch` unless it was fetched already. Requires mutex_ held.
  Status FetchLocked(size_t batch, StoreTimeout timeout);

  const std::shared_ptr<collectived::Store> store_;
  const StoreTimeout timeout_;
  const std::vector<std::vector<std::string>> batches_;
  std::unordered_map<std::string, size_t> batch_of_;  // key -> index in batches_; immutable

  std::mutex mutex_;
  std::vector<bool> fetched_;                            // by batch; guarded by mutex_
  std::unordered_map<std::string, std::string> values_;  // of fetched batches; guarded by mutex_
};

}  // namespace collectived
