// WaitUnlessCancelled: Store::Wait that gives up as soon as a CancelToken is cancelled (a joiner
// that went away, a sidecar that stops), so that a wait nobody needs any more does not hold its
// thread until its timeout.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "engine/concurrency/cancel_token.h"
#include "engine/concurrency/clock.h"
#include "engine/store/store.h"
#include "engine/vocabulary/status.h"

namespace collectived {

// Waits for `keys` like `store.Wait(keys, timeout)`; with `cancel` cancelled first, returns its
// reason and sets `*cancelled` (when given). A null `cancel` is a plain wait. A wait that
// ends Unavailable is armed again for the rest of its timeout when a synchronous call then
// reaches the store (a MovableStore moved: its asynchronous waits do not move themselves), as
// many times as a call follows moves; `clock` tells what is left.
Status WaitUnlessCancelled(Store& store, const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout, CancelToken* cancel,
                           const Clock& clock, bool* cancelled = nullptr);

}  // namespace collectived
