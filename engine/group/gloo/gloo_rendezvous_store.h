// GlooRendezvousStore: lets Gloo rendezvous (gloo::rendezvous::Context::connectFullMesh) run on
// a collectived Store, so the sidecars of a group meet in our store, under our prefixes and
// timeouts, instead of in a Gloo-specific store.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/status.h"
#include "engine/store/store.h"

namespace collectived {

// Adapts collectived::Store to the gloo::rendezvous::Store interface of the Gloo 0.5.0
// snapshot, which has only set, get and wait (with and without a timeout). That interface has
// no multi_get/multi_set and no has_v2_support, so Gloo fetches peers' addresses key by key
// through get(); the one batched call it allows, wait(keys), is forwarded as a single
// Store::Wait over all keys.
//
// Gloo reports failures by exceptions, so every method throws on a non-OK Status:
// gloo::InvalidOperationException for InvalidArgument, gloo::IoException for everything else
// (Timeout included). The exception message carries the Status ("timeout: Timeout after ...").
//
// Thread-safety: safe for concurrent use from many threads (the wrapped Store is thread-safe
// and the adapter holds only immutable state).
class GlooRendezvousStore : public gloo::rendezvous::Store {
 public:
  // Creates an adapter over `store`, which must not be null (a null store aborts the process).
  // get() and wait(keys) use `timeout`; std::nullopt means the wrapped store's default timeout
  // at the time of each call.
  explicit GlooRendezvousStore(std::shared_ptr<collectived::Store> store,
                               StoreTimeout timeout = std::nullopt);
  ~GlooRendezvousStore() override;

  // Stores `data` under `key`. Throws on an invalid key or a value over kMaxValueBytes.
  void set(const std::string& key, const std::vector<char>& data) override;

  // Returns the value of `key`, blocking until it exists. Throws gloo::IoException with our
  // "Timeout after ..." message if it does not appear within the adapter's timeout.
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
  const std::shared_ptr<collectived::Store> store_;
  const StoreTimeout timeout_;
};

}  // namespace collectived
