// Client::JoinTorchGroup: a non-torch rank in a group made by torch's "collectived" backend.
#include "clients/cpp/client.h"
#include "engine/store/prefix_store.h"
#include "rpc/torch_names.h"

namespace collectived {

StatusOr<GroupInfo> Client::JoinTorchGroup(const TorchJoin& join) {
  if (join.store == nullptr) return Status::InvalidArgument("JoinTorchGroup: no store given");
  PrefixStore torch_group(join.group_prefix, join.store);
  StatusOr<std::string> record = torch_group.Get(kTorchBootstrapKey);
  if (!record.ok()) return record.status().WithContext("torch group '" + join.group_prefix + "'");
  StatusOr<TorchBootstrap> bootstrap = ParseTorchBootstrapRecord(*record);
  if (!bootstrap.ok()) return bootstrap.status();
  GroupOptions options;
  options.name = bootstrap->group;
  options.rank = join.rank;
  options.world_size = join.world_size;
  options.store_address = bootstrap->store_address;
  options.timeout = join.timeout;
  options.job_token = join.job_token;
  StatusOr<GroupInfo> info = CreateGroup(options);
  if (!info.ok()) return info.status();
  if (!join.barrier_key.empty()) {
    StatusOr<int64_t> added = join.store->Add(join.barrier_key, 1);
    if (!added.ok()) return added.status().WithContext("torch's barrier " + join.barrier_key);
  }
  return info;
}

}  // namespace collectived
