// How Gloo's failures become a Status. Gloo reports everything by exceptions; this is the one
// place that classifies them.
#pragma once

#include <string_view>

#include "engine/concurrency/executor.h"
#include "engine/vocabulary/status.h"

namespace collectived {

// Runs `fn` (Gloo calls) and turns what it throws into a Status that names `what`:
//  - gloo::IoException: Timeout when Gloo timed out (this Gloo raises a timeout as an
//    IoException whose only mark is its text, "Timed out ..."), PeerLost otherwise (a peer
//    closed its connection, or the context was closed by an abort);
//  - gloo::InvalidOperationException and gloo::EnforceNotMet: Internal (a bug on our side);
//  - any other exception: PeerLost.
template <typename Fn>
Status GlooCall(std::string_view what, Fn&& fn);

// The classification itself, for a caught exception.
Status StatusFromGloo(std::string_view what);  // call inside a catch block only

template <typename Fn>
Status GlooCall(std::string_view what, Fn&& fn) {
  // Gloo returns only once the peers made the same call: the executor lends a thread meanwhile.
  Executor::Blocking blocking;
  try {
    fn();
    return Status::Ok();
  } catch (...) {
    return StatusFromGloo(what);
  }
}

}  // namespace collectived
