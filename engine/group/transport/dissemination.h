// The dissemination (Bruck) allgather's schedule among a group's sidecars, shared by every
// control channel: in round k node i passes the parts it holds (its own and the next 2^k − 1
// nodes', mod S) to node i − 2^k and gets as many from node i + 2^k, so each node holds every
// part after ⌈log₂ S⌉ rounds, having talked to at most 2·⌈log₂ S⌉ peers. An agreement then costs
// S·⌈log₂ S⌉ messages per op instead of a full mesh's S·(S − 1), and a sidecar needs connections
// to those peers only.
//
// Summaries of a fixed size are combined instead (ControlChannel::StartAllReduce) up and down a
// binomial tree over the same peers: 2·⌈log₂ S⌉ hops, 2·(S − 1) messages of that size per op.
#pragma once

#include <algorithm>
#include <vector>

namespace collectived {

// Round `round` of the allgather among `count` nodes, seen from `node`.
struct DisseminationRound {
  int to = 0;     // gets this node's parts
  int from = 0;   // sends its parts here
  int parts = 0;  // how many parts each way, starting at the sender's own
};

inline DisseminationRound RoundOf(int node, int count, int round) {
  const int distance = 1 << round;
  return DisseminationRound{(node - distance % count + count) % count, (node + distance) % count,
                            std::min(distance, count - distance)};
}

// ⌈log₂ count⌉: 0 for one node.
inline int DisseminationRounds(int count) {
  int rounds = 0;
  while ((1 << rounds) < count) ++rounds;
  return rounds;
}

// The nodes `node` of `count` exchanges with in some round: (node ± 2^k) mod count for every
// 2^k < count, ascending, without `node` itself. The relation is symmetric.
inline std::vector<int> DisseminationPeers(int node, int count) {
  std::vector<int> peers;
  for (int round = 0; round < DisseminationRounds(count); ++round) {
    const DisseminationRound each = RoundOf(node, count, round);
    for (int peer : {each.to, each.from}) {
      if (peer != node) peers.push_back(peer);
    }
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  return peers;
}

// A binomial tree rooted at node 0 whose edges are dissemination peers (they differ by a power of
// two): what a reduction of fixed-size summaries climbs and then comes down. Node i's children
// are i + 2^j for every 2^j below i's lowest set bit (every 2^j for node 0) with i + 2^j < count,
// ascending; child i + 2^j heads the nodes [i + 2^j, i + 2^(j+1)), so combining a node's own part
// with its children's in that order follows node order.
inline int TreeParent(int node) {
  return node == 0 ? -1 : node - (node & -node);
}

inline std::vector<int> TreeChildren(int node, int count) {
  std::vector<int> children;
  for (int step = 1; node + step < count && (node == 0 || step < (node & -node)); step *= 2) {
    children.push_back(node + step);
  }
  return children;
}

}  // namespace collectived
