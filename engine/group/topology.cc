#include "engine/group/topology.h"

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

StatusOr<GroupTopology> GroupTopology::FromSidecarIds(
    const std::vector<std::string>& sidecar_of_rank, const std::string& my_id) {
  GroupTopology topology;
  topology.group_size = static_cast<int>(sidecar_of_rank.size());
  std::map<std::string, int> node_index;
  for (int rank = 0; rank < topology.group_size; ++rank) {
    const std::string& id = sidecar_of_rank[rank];
    auto [it, inserted] = node_index.emplace(id, topology.node_count());
    if (inserted) {
      topology.ranks_of_node.emplace_back();
      topology.node_ids.push_back(id);
    }
    topology.ranks_of_node[it->second].push_back(rank);
    topology.node_of_rank.push_back(it->second);
  }
  auto mine = node_index.find(my_id);
  if (mine == node_index.end()) {
    return Status::Internal("sidecar " + my_id + " hosts no rank of the group");
  }
  topology.my_node = mine->second;
  topology.node_major_position.assign(topology.group_size, 0);
  int position = 0;
  for (const auto& ranks : topology.ranks_of_node) {
    for (int rank : ranks) topology.node_major_position[rank] = position++;
  }
  return topology;
}

}  // namespace collectived
