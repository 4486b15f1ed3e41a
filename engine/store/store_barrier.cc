#include "engine/store/store_barrier.h"

#include <cstdint>
#include <string>
#include <vector>

namespace collectived {

namespace {

constexpr std::size_t kMaxListedRanks = 32;  // most missing ranks listed in one message

std::string ArrivalKey(std::string_view name, int rank) {
  return std::string(name) + "/arrived/" + std::to_string(rank);
}

// Builds the timeout message, reading (without waiting) which ranks have marked arrival.
Status BarrierTimeout(Store& store, int rank, int world_size, std::string_view name,
                      std::chrono::milliseconds timeout, const Status& cause) {
  std::vector<int> missing;
  for (int r = 0; r < world_size; ++r) {
    StatusOr<bool> present = store.Check({ArrivalKey(name, r)});
    if (!present.ok() || !present.value()) missing.push_back(r);
  }
  std::string list = "[";
  for (std::size_t i = 0; i < missing.size() && i < kMaxListedRanks; ++i) {
    if (i > 0) list += ", ";
    list += std::to_string(missing[i]);
  }
  if (missing.size() > kMaxListedRanks) {
    list += ", ... (" + std::to_string(missing.size() - kMaxListedRanks) + " more)";
  }
  list += "]";
  const int arrived = world_size - static_cast<int>(missing.size());
  std::string message = "Timed out initializing process group in store based barrier on rank " +
                        std::to_string(rank) + " for key '" + std::string(name) +
                        "' (world_size=" + std::to_string(world_size) +
                        ", arrived=" + std::to_string(arrived) + ", missing ranks: " + list +
                        ", timeout=" + std::to_string(timeout.count()) + " ms)";
  if (missing.empty()) {
    // Everyone arrived just as we gave up: say so rather than list nobody.
    message += "; all ranks arrived as the deadline passed: " + cause.message();
  }
  return Status::Timeout(message);
}

}  // namespace

Status StoreBasedBarrier(Store& store, int rank, int world_size, std::string_view barrier_name,
                         std::chrono::milliseconds timeout) {
  if (world_size < 1) {
    return Status::InvalidArgument("store based barrier '" + std::string(barrier_name) +
                                   "': world_size must be >= 1, got " + std::to_string(world_size));
  }
  if (rank < 0 || rank >= world_size) {
    return Status::InvalidArgument("store based barrier '" + std::string(barrier_name) +
                                   "': rank " + std::to_string(rank) + " is out of range [0, " +
                                   std::to_string(world_size) + ")");
  }
  if (barrier_name.empty()) {
    return Status::InvalidArgument("store based barrier on rank " + std::to_string(rank) +
                                   ": the barrier name must not be empty");
  }
  const std::string context =
      "store based barrier '" + std::string(barrier_name) + "' on rank " + std::to_string(rank);
  const std::string name(barrier_name);
  const std::string done_key = name + "/done";

  // Validate the timeout before leaving any trace in the store.
  if (timeout < std::chrono::milliseconds::zero() || timeout > kMaxStoreTimeout) {
    return Status::InvalidArgument(context + ": invalid timeout of " +
                                   std::to_string(timeout.count()) +
                                   " ms: must be between 0 (no deadline) and " +
                                   std::to_string(kMaxStoreTimeout.count()) + " ms (7 days)");
  }

  COLLECTIVED_RETURN_IF_ERROR(store.Set(ArrivalKey(name, rank), "1").WithContext(context));
  StatusOr<std::int64_t> count = store.Add(name + "/count", 1);
  if (!count.ok()) return count.status().WithContext(context);
  if (count.value() > world_size) {
    return Status::InvalidArgument(context + ": " + std::to_string(count.value()) +
                                   " arrivals for world_size=" + std::to_string(world_size) +
                                   "; a barrier name must not be reused");
  }
  if (count.value() == world_size) {
    COLLECTIVED_RETURN_IF_ERROR(store.Set(done_key, "1").WithContext(context));
    return Status::Ok();
  }

  Status waited = store.Wait({done_key}, timeout);
  if (waited.IsTimeout()) {
    return BarrierTimeout(store, rank, world_size, name, timeout, waited);
  }
  return waited.WithContext(context);
}

}  // namespace collectived
