#include "rpc/torch_names.h"

#include <algorithm>
#include <cctype>

namespace collectived {
namespace {

bool IsJobCharacter(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '.' || c == '_' || c == '-';
}

}  // namespace

std::string TorchJobPart(std::string_view job) {
  std::string part;
  for (char c : job.substr(0, 64)) part.push_back(IsJobCharacter(c) ? c : '-');
  const size_t first = part.find_first_not_of('-');
  if (first == std::string::npos) return "";
  return part.substr(first, part.find_last_not_of('-') + 1 - first);
}

std::string TorchGroupName(std::string_view job, int index, std::string_view random_hex) {
  const std::string part = TorchJobPart(job);
  if (part.empty()) return "pg-" + std::string(random_hex);
  return part + "-pg" + std::to_string(index) + "-" + std::string(random_hex);
}

std::string JobOfTorchGroupName(std::string_view group) {
  // The job is everything before the last "-pg" that is followed by digits, '-' and hex digits.
  const size_t dash = group.rfind('-');
  if (dash == std::string_view::npos || dash + 1 == group.size()) return "";
  if (!std::all_of(group.begin() + dash + 1, group.end(),
                   [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; })) {
    return "";
  }
  const size_t pg = group.rfind("-pg", dash);
  if (pg == std::string_view::npos || pg == 0 || pg + 3 == dash) return "";
  if (!std::all_of(group.begin() + pg + 3, group.begin() + dash,
                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
    return "";
  }
  return std::string(group.substr(0, pg));
}

std::string TorchBootstrapRecord(const TorchBootstrap& bootstrap) {
  return bootstrap.group + "|" + bootstrap.store_address;
}

StatusOr<TorchBootstrap> ParseTorchBootstrapRecord(std::string_view record) {
  const size_t bar = record.find('|');
  if (bar == std::string_view::npos || bar == 0 || bar + 1 == record.size()) {
    return Status::InvalidArgument("bad torch bootstrap record '" + std::string(record) + "' at " +
                                   kTorchBootstrapKey + " (want NAME|STORE_ADDRESS)");
  }
  return TorchBootstrap{std::string(record.substr(0, bar)), std::string(record.substr(bar + 1))};
}

}  // namespace collectived
