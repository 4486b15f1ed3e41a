// The store address a group is created with: one sidecar's store, or a list of them,
// comma-separated ("node-0:7490,node-1:7490"). The first is where the ranks meet; a shrinking
// group whose store is lost moves to the first of the others that answers before it tries its
// own sidecars' (docs/fault-tolerance.md, losing the store's sidecar). Every rank gives the same
// list, so a replacement started after the first store was lost finds the group where the
// survivors moved it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "engine/vocabulary/status.h"

namespace collectived {

inline constexpr size_t kMaxStoreAddresses = 16;
inline constexpr size_t kMaxStoreAddressBytes = 256;

// The addresses of `list`, in order: one ("" for the sidecar's own store) or several, none
// empty, none twice, at most kMaxStoreAddresses of at most kMaxStoreAddressBytes each; else
// InvalidArgument saying which entry is wrong.
StatusOr<std::vector<std::string>> ParseStoreAddresses(std::string_view list);

}  // namespace collectived
