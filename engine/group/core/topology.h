// GroupTopology: which sidecar (node) hosts which rank of a group, as discovered in the
// rendezvous store. Nodes are ordered by the lowest group rank they host, so every sidecar
// computes the same numbering.
#pragma once

#include <string>
#include <vector>

#include "engine/vocabulary/status.h"

namespace collectived {

struct GroupTopology {
  int group_size = 0;
  int my_node = 0;
  std::vector<int> node_of_rank;                // group rank -> node
  std::vector<std::vector<int>> ranks_of_node;  // node -> its group ranks, ascending
  std::vector<std::string> node_ids;            // node -> sidecar id
  // node -> the address of that sidecar's gRPC listener ("" unknown); filled by the registry.
  std::vector<std::string> node_addresses;
  // Position of each group rank when data is laid out node by node (node order, then rank
  // order within the node); the layout of every node-level buffer.
  std::vector<int> node_major_position;

  int node_count() const { return static_cast<int>(ranks_of_node.size()); }
  const std::vector<int>& local_ranks() const { return ranks_of_node[my_node]; }
  // Index of `group_rank` among this node's ranks, or -1 if it is not local.
  int LocalIndex(int group_rank) const;
  // Sorted group ranks hosted by other nodes than node `node`.
  std::string DescribeNode(int node) const;  // "sidecar X (ranks [1, 3])"
  // DescribeNode of each of `nodes`, separated by ", ".
  std::string DescribeNodes(const std::vector<int>& nodes) const;

  // Builds the topology from the sidecar id of every group rank; `my_id` must be among them.
  // Nodes are numbered in the order of their first rank.
  static StatusOr<GroupTopology> FromSidecarIds(const std::vector<std::string>& sidecar_of_rank,
                                                const std::string& my_id);
  // The same from each rank's node index into `node_ids` (a GroupMembership's form: no string
  // per rank, so thousands of sidecars each reading thousands of ranks stay cheap). Internal
  // when `my_id` is not a node or a node hosts no rank; InvalidArgument for an index out of
  // range.
  static StatusOr<GroupTopology> FromNodeOfRank(std::vector<int> node_of_rank,
                                                std::vector<std::string> node_ids,
                                                const std::string& my_id);
};

// "[1, 3]"
std::string FormatRanks(const std::vector<int>& ranks);
// The first `limit` ranks, then how many more: "[1, 3, 5, ... and 1021 more]" (bounded text for
// messages about thousands of ranks).
std::string FormatRanksBounded(const std::vector<int>& ranks, size_t limit = 16);

}  // namespace collectived
