#include "engine/store/store_addresses.h"

#include <algorithm>

namespace collectived {
namespace {

Status TooLong(const std::string& what, size_t bytes) {
  return Status::InvalidArgument(what + std::to_string(bytes) + " bytes, more than the " +
                                 std::to_string(kMaxStoreAddressBytes) + " accepted");
}

}  // namespace

StatusOr<std::vector<std::string>> ParseStoreAddresses(std::string_view list) {
  std::vector<std::string> addresses;
  if (list.find(',') == std::string_view::npos) {
    if (list.size() > kMaxStoreAddressBytes) return TooLong("store address of ", list.size());
    addresses.emplace_back(list);
    return addresses;
  }
  const std::string quoted = "store address list '" +
                             std::string(list.substr(0, kMaxStoreAddressBytes)) +
                             (list.size() > kMaxStoreAddressBytes ? "...'" : "'");
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    const std::string_view entry = list.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    const std::string which = "entry " + std::to_string(addresses.size() + 1);
    if (addresses.size() == kMaxStoreAddresses) {
      return Status::InvalidArgument(quoted + " names more than " +
                                     std::to_string(kMaxStoreAddresses) + " stores");
    }
    if (entry.empty()) return Status::InvalidArgument(quoted + ": " + which + " is empty");
    if (entry.size() > kMaxStoreAddressBytes) {
      return TooLong(quoted + ": " + which + " has ", entry.size());
    }
    if (std::find(addresses.begin(), addresses.end(), entry) != addresses.end()) {
      return Status::InvalidArgument(quoted + ": " + which + " ('" + std::string(entry) +
                                     "') is listed twice");
    }
    addresses.emplace_back(entry);
    if (comma == std::string_view::npos) return addresses;
    start = comma + 1;
  }
}

}  // namespace collectived
