// CancelToken: a one-shot signal that a long wait (a join waiting for the other ranks) is no
// longer wanted, with the reason. Whoever learns it (a session that ends, a shutdown, a front end
// whose caller went away) cancels the token; the waiter registers a callback instead of asking
// again and again.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

#include "engine/vocabulary/status.h"

namespace collectived {

class CancelToken {
 public:
  using Callback = std::function<void(const Status& reason)>;

  // Cancels with `reason` (an error; the first one wins) and runs the registered callbacks on
  // this thread, outside the token's lock.
  void Cancel(const Status& reason);
  // OK until cancelled; the reason after.
  Status reason() const;

  // Runs `fn(reason)` once the token is cancelled: at once, here, if it already is (then returns
  // 0). Otherwise returns an id for Remove. `fn` must not block.
  uint64_t OnCancel(Callback fn);
  // Forgets a callback that has not run. One that a concurrent Cancel already took may still
  // run: a callback holds what it needs.
  void Remove(uint64_t id);

 private:
  mutable std::mutex mutex_;
  Status reason_;                         // guarded by mutex_
  std::map<uint64_t, Callback> pending_;  // guarded by mutex_
  uint64_t next_id_ = 1;                  // guarded by mutex_
};

}  // namespace collectived
