// SessionQuotas: how many completed asynchronous ops one session's table remembers. What a
// session may hold of the sidecar (pending ops and bytes, buffers, groups...) is the
// ResourceLedger's.
#pragma once

#include <cstddef>

namespace collectived {

struct SessionQuotas {
  // Completed asynchronous ops remembered for a late Wait, and the bytes they hold (their inline
  // outputs, which count as pending_bytes until forgotten); the oldest are forgotten first when
  // either bound is passed.
  size_t completed_ops_kept = 1024;
  size_t max_completed_bytes = size_t{256} << 20;
};

}  // namespace collectived
