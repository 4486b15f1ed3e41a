#include "engine/group/transport/gloo/gloo_algorithm_peers.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "engine/group/transport/dissemination.h"

namespace collectived {
namespace {

// Sorted, without duplicates and without `rank`.
std::vector<int> Normalized(std::vector<int> peers, int rank) {
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  peers.erase(std::remove(peers.begin(), peers.end(), rank), peers.end());
  return peers;
}

// Gloo's log2ceil (gloo/math.h): the least n with 2^n >= value.
size_t Log2Ceil(size_t value) {
  size_t dim = 0;
  for (size_t power = 1; power < value; power <<= 1) ++dim;
  return dim;
}

}  // namespace

std::vector<int> GlooRingPeers(int rank, int size) {
  if (size < 2) return {};
  return Normalized({(rank + size - 1) % size, (rank + 1) % size}, rank);
}

std::vector<int> GlooBroadcastPeers(int rank, int size, int root) {
  // gloo/broadcast.cc, step by step: virtual ranks put the root at 0; in step i the virtual
  // ranks below 2^(i+1) take part, and virtual rank v exchanges with v ^ 2^i when that exists.
  std::vector<int> peers;
  const size_t vsize = static_cast<size_t>(size);
  const size_t vrank = (static_cast<size_t>(rank) + vsize - static_cast<size_t>(root)) % vsize;
  const size_t dim = Log2Ceil(vsize);
  size_t mask = (size_t{1} << dim) - 1;
  for (size_t i = 0; i < dim; ++i) {
    mask ^= size_t{1} << i;
    if ((vrank & mask) != 0) continue;
    const size_t vpeer = vrank ^ (size_t{1} << i);
    if (vpeer >= vsize) continue;
    peers.push_back(static_cast<int>((vpeer + static_cast<size_t>(root)) % vsize));
  }
  return Normalized(std::move(peers), rank);
}

std::vector<int> GlooReducePeers(int rank, int size, int root) {
  if (rank == root) return GlooAllPeers(rank, size);
  std::vector<int> peers = GlooRingPeers(rank, size);
  peers.push_back(root);
  return Normalized(std::move(peers), rank);
}

std::vector<int> GlooBarrierPeers(int rank, int size) {
  return DisseminationPeers(rank, size);
}

std::vector<int> GlooAllPeers(int rank, int size) {
  std::vector<int> peers;
  for (int peer = 0; peer < size; ++peer) {
    if (peer != rank) peers.push_back(peer);
  }
  return peers;
}

}  // namespace collectived
