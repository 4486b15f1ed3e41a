#include "engine/group/core/topology.h"

#include <algorithm>
#include <map>

namespace collectived {

std::string FormatRanks(const std::vector<int>& ranks) {
  std::string text = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(ranks[i]);
  }
  return text + "]";
}

std::string FormatRanksBounded(const std::vector<int>& ranks, size_t limit) {
  if (ranks.size() <= limit) return FormatRanks(ranks);
  std::string text = "[";
  for (size_t i = 0; i < limit; ++i) text += std::to_string(ranks[i]) + ", ";
  return text + "... and " + std::to_string(ranks.size() - limit) + " more]";
}

int GroupTopology::LocalIndex(int group_rank) const {
  const auto& local = local_ranks();
  auto it = std::find(local.begin(), local.end(), group_rank);
  return it == local.end() ? -1 : static_cast<int>(it - local.begin());
}

std::string GroupTopology::DescribeNode(int node) const {
  return "sidecar " + node_ids[node] + " (ranks " + FormatRanks(ranks_of_node[node]) + ")";
}

std::string GroupTopology::DescribeNodes(const std::vector<int>& nodes) const {
  std::string text;
  for (int node : nodes) text += (text.empty() ? "" : ", ") + DescribeNode(node);
  return text;
}

StatusOr<GroupTopology> GroupTopology::FromSidecarIds(
    const std::vector<std::string>& sidecar_of_rank, const std::string& my_id) {
  std::map<std::string, int> node_index;
  std::vector<std::string> node_ids;
  std::vector<int> node_of_rank;
  node_of_rank.reserve(sidecar_of_rank.size());
  for (const std::string& id : sidecar_of_rank) {
    auto [it, inserted] = node_index.emplace(id, static_cast<int>(node_ids.size()));
    if (inserted) node_ids.push_back(id);
    node_of_rank.push_back(it->second);
  }
  return FromNodeOfRank(std::move(node_of_rank), std::move(node_ids), my_id);
}

StatusOr<GroupTopology> GroupTopology::FromNodeOfRank(std::vector<int> node_of_rank,
                                                      std::vector<std::string> node_ids,
                                                      const std::string& my_id) {
  GroupTopology topology;
  topology.group_size = static_cast<int>(node_of_rank.size());
  topology.ranks_of_node.resize(node_ids.size());
  for (int rank = 0; rank < topology.group_size; ++rank) {
    const int node = node_of_rank[rank];
    if (node < 0 || node >= static_cast<int>(node_ids.size())) {
      return Status::InvalidArgument("group rank " + std::to_string(rank) + " is placed on node " +
                                     std::to_string(node) + " of " +
                                     std::to_string(node_ids.size()));
    }
    topology.ranks_of_node[node].push_back(rank);
  }
  for (size_t node = 0; node < node_ids.size(); ++node) {
    if (topology.ranks_of_node[node].empty()) {
      return Status::Internal("sidecar " + node_ids[node] + " is listed but hosts no rank");
    }
  }
  auto mine = std::find(node_ids.begin(), node_ids.end(), my_id);
  if (mine == node_ids.end()) {
    return Status::Internal("sidecar " + my_id + " hosts no rank of the group");
  }
  topology.my_node = static_cast<int>(mine - node_ids.begin());
  topology.node_of_rank = std::move(node_of_rank);
  topology.node_ids = std::move(node_ids);
  topology.node_major_position.assign(topology.group_size, 0);
  int position = 0;
  for (const auto& ranks : topology.ranks_of_node) {
    for (int rank : ranks) topology.node_major_position[rank] = position++;
  }
  return topology;
}

}  // namespace collectived
