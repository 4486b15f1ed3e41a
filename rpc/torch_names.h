// How the torch backend names and announces its groups, for every side that reads or writes
// them: the daemon (the job_name label), the C++ client (Client::JoinTorchGroup) and the tools.
// The Python (collectived/torch_names.py) and Go (collectived/torch.go) clients hold the same
// grammar; tests/data/torch_names.tsv is the vectors all three are tested against.
//
// - A group's name is `<job>-pg<index>-<8 hex>` (the job with characters other than letters,
//   digits, '.', '_' and '-' made '-', at most 64 of them, no leading or trailing '-'; the
//   process group's index in its process; a random part, so that a restarted job's groups never
//   meet its earlier incarnation's), or `pg-<16 hex>` without a job.
// - Rank 0 of a torch group publishes `NAME|STORE_ADDRESS` at kTorchBootstrapKey under the group's
//   prefix of the store torch handed the backend: the group's name in the sidecars and the
//   address of the store the sidecars meet in.
#pragma once

#include <string>
#include <string_view>

#include "engine/vocabulary/status.h"

namespace collectived {

inline constexpr char kTorchBootstrapKey[] = "collectived/bootstrap";

// `job` as a group name keeps it (see above); empty when nothing of it is left.
std::string TorchJobPart(std::string_view job);

// The name of process group `index` of `job`, with `random_hex` (8 hex digits with a job, 16
// without) as its random part.
std::string TorchGroupName(std::string_view job, int index, std::string_view random_hex);

// The job of a group named `<job>-pg<digits>-<hex>` ("trainer" for "trainer-pg0-1a2b3c4d"),
// else "".
std::string JobOfTorchGroupName(std::string_view group);

struct TorchBootstrap {
  std::string group;          // the group's name in the sidecars
  std::string store_address;  // where the sidecars meet
};

// "NAME|STORE_ADDRESS".
std::string TorchBootstrapRecord(const TorchBootstrap& bootstrap);

// The record's parts; InvalidArgument quoting it when it has no '|', an empty name or an empty
// address.
StatusOr<TorchBootstrap> ParseTorchBootstrapRecord(std::string_view record);

}  // namespace collectived
