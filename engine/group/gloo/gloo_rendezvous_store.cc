#include "engine/group/gloo/gloo_rendezvous_store.h"

#include <gloo/common/error.h>
#include <gloo/transport/address.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace collectived {

namespace {

// The most bytes of values one read batch is expected to return: far below the gRPC message
// limit of a remote store, so that a batch never fails for its size.
constexpr size_t kReadBatchBytes = 4u << 20;
// The longest host name connectFullMesh announces (POSIX HOST_NAME_MAX is 255 on Linux).
constexpr size_t kMaxHostNameBytes = 256;

// Gloo's way of failing: exceptions. Does nothing for OK.
void ThrowIfError(const Status& status, const char* op) {
  if (status.ok()) return;
  std::string message = std::string("collectived store ") + op + " failed: " + status.ToString();
  if (status.IsInvalidArgument()) throw gloo::InvalidOperationException(message);
  throw gloo::IoException(message);
}

// Appends `keys` to `batches` in batches of at most `per_batch` keys.
void AppendBatches(std::vector<std::string> keys, size_t per_batch,
                   std::vector<std::vector<std::string>>& batches) {
  per_batch = std::max<size_t>(per_batch, 1);
  for (size_t at = 0; at < keys.size(); at += per_batch) {
    const size_t end = std::min(keys.size(), at + per_batch);
    batches.emplace_back(std::make_move_iterator(keys.begin() + static_cast<long>(at)),
                         std::make_move_iterator(keys.begin() + static_cast<long>(end)));
  }
}

}  // namespace

GlooRendezvousStore::GlooRendezvousStore(std::shared_ptr<collectived::Store> store,
                                         StoreTimeout timeout,
                                         std::vector<std::vector<std::string>> read_batches)
    : store_(std::move(store)), timeout_(timeout), batches_(std::move(read_batches)) {
  if (store_ == nullptr) {
    std::fprintf(stderr, "GlooRendezvousStore created with a null store\n");
    std::abort();
  }
  for (size_t b = 0; b < batches_.size(); ++b) {
    for (const std::string& key : batches_[b]) batch_of_.emplace(key, b);
  }
  fetched_.assign(batches_.size(), false);
}

GlooRendezvousStore::~GlooRendezvousStore() = default;

std::vector<std::vector<std::string>> GlooRendezvousStore::ConnectFullMeshReads(int rank,
                                                                                int size) {
  std::vector<std::vector<std::string>> batches;
  if (size < 2 || rank < 0 || rank >= size) return batches;
  // connectFullMesh counts the lower ranks on its host (key "rank_<i>": a host name), then
  // connects every pair (key "<i>": all addresses of rank i, one per peer).
  std::vector<std::string> host_names;
  for (int i = 0; i < rank; ++i) host_names.push_back("rank_" + std::to_string(i));
  AppendBatches(std::move(host_names), kReadBatchBytes / kMaxHostNameBytes, batches);
  std::vector<std::string> addresses;
  for (int i = 0; i < size; ++i) {
    if (i != rank) addresses.push_back(std::to_string(i));
  }
  const size_t address_record_bytes =
      static_cast<size_t>(size - 1) * gloo::transport::Address::kMaxByteSize;
  AppendBatches(std::move(addresses), kReadBatchBytes / address_record_bytes, batches);
  return batches;
}

Status GlooRendezvousStore::FetchLocked(size_t batch, StoreTimeout timeout) {
  if (fetched_[batch]) return Status::Ok();
  const std::vector<std::string>& keys = batches_[batch];
  StatusOr<std::vector<std::string>> values = store_->MultiGet(keys, timeout);
  if (!values.ok()) return values.status();
  for (size_t i = 0; i < keys.size(); ++i) values_[keys[i]] = std::move((*values)[i]);
  fetched_[batch] = true;
  return Status::Ok();
}

void GlooRendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  ThrowIfError(store_->Set(key, std::string(data.begin(), data.end())), "set");
}

std::vector<char> GlooRendezvousStore::get(const std::string& key) {
  if (auto batch = batch_of_.find(key); batch != batch_of_.end()) {
    std::lock_guard<std::mutex> lock(mutex_);
    ThrowIfError(FetchLocked(batch->second, timeout_), "get");
    const std::string& value = values_.at(key);
    return std::vector<char>(value.begin(), value.end());
  }
  StatusOr<std::string> value = store_->Get(key, timeout_);
  ThrowIfError(value.status(), "get");
  return std::vector<char>(value.value().begin(), value.value().end());
}

void GlooRendezvousStore::WaitFor(const std::vector<std::string>& keys, StoreTimeout timeout) {
  std::vector<std::string> rest;
  std::vector<size_t> batches;
  for (const std::string& key : keys) {
    auto batch = batch_of_.find(key);
    if (batch == batch_of_.end()) {
      rest.push_back(key);
    } else if (std::find(batches.begin(), batches.end(), batch->second) == batches.end()) {
      batches.push_back(batch->second);
    }
  }
  if (batches.empty()) {
    ThrowIfError(store_->Wait(keys, timeout), "wait");
    return;
  }
  // One deadline for everything this call waits for.
  const std::chrono::milliseconds budget = timeout.value_or(store_->default_timeout());
  const auto deadline = std::chrono::steady_clock::now() + budget;
  auto left = [&]() -> StoreTimeout {
    if (budget == kNoTimeout || budget.count() < 0) return budget;  // negative: the store refuses
    auto remaining =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return std::max(remaining, std::chrono::milliseconds(1));
  };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t batch : batches) ThrowIfError(FetchLocked(batch, left()), "wait");
  }
  if (!rest.empty()) ThrowIfError(store_->Wait(rest, left()), "wait");
}

void GlooRendezvousStore::wait(const std::vector<std::string>& keys) {
  WaitFor(keys, timeout_);
}

void GlooRendezvousStore::wait(const std::vector<std::string>& keys,
                               const std::chrono::milliseconds& timeout) {
  // Gloo callers may pass "practically forever"; our stores reject timeouts over 7 days.
  const std::chrono::milliseconds clamped = timeout > kMaxStoreTimeout ? kMaxStoreTimeout : timeout;
  WaitFor(keys, clamped);
}

}  // namespace collectived
