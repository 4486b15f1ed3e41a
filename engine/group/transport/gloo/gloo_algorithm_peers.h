// Which peers each Gloo algorithm that GlooBackend calls exchanges data with, so that exactly
// those pairs are connected before the call (GlooPairs connects pairs on first use; a pair an
// algorithm uses but that is not connected is a null pointer inside Gloo).
//
// Read from the sources of the Gloo snapshot Debian ships (libgloo 0.0~git20220518.5b14351,
// facebookincubator/gloo at 5b14351); a newer Gloo must be checked against them again:
//   allreduce   gloo/allreduce.cc, ring() (the default algorithm, UNSPECIFIED = RING): sends to
//               rank - 1, receives from rank + 1
//   allgatherv  gloo/allgatherv.cc: a ring, sends to rank + 1, receives from rank - 1
//   reduce      gloo/reduce.cc: a ring reduce-scatter (rank - 1, rank + 1), then every rank
//               whose chunk is not empty sends it to the root
//   broadcast   gloo/broadcast.cc: a binomial tree over ranks relative to the root
//   barrier     gloo/barrier.cc: a dissemination barrier, rank - d and rank + d for d = 1, 2,
//               4, ... < size
//   alltoallv   gloo/alltoallv.cc: every other rank
// Every set is symmetric (q is among p's peers exactly when p is among q's), as GlooPairs needs:
// a pair connects only when both of its sides ask for it. Where Gloo's use depends on the data
// (reduce's gather skips empty chunks), the set is the data-independent superset.
//
// Ranks are node ranks of the group's Gloo context, 0 <= rank < size, size >= 1. The results
// never contain `rank` itself, are sorted and hold no duplicates.
#pragma once

#include <vector>

namespace collectived {

// allreduce (ring) and allgatherv: the ring neighbours.
std::vector<int> GlooRingPeers(int rank, int size);

// broadcast from `root`: the neighbours of `rank` in Gloo's binomial tree.
std::vector<int> GlooBroadcastPeers(int rank, int size, int root);

// reduce to `root`: the ring neighbours, and the root; the root: every rank.
std::vector<int> GlooReducePeers(int rank, int size, int root);

// barrier (dissemination): rank +- 2^k mod size for 2^k < size.
std::vector<int> GlooBarrierPeers(int rank, int size);

// alltoallv: every rank but `rank`.
std::vector<int> GlooAllPeers(int rank, int size);

}  // namespace collectived
