#include "engine/store/counting_store.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace collectived {

CountingStore::CountingStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {
  if (inner_ == nullptr) {
    std::fprintf(stderr, "CountingStore created with a null inner store\n");
    std::abort();
  }
  (void)SetDefaultTimeout(inner_->default_timeout());
}

CountingStore::~CountingStore() = default;

CountingStore::Counts CountingStore::counts() const {
  return Counts{calls_.load(), keys_.load(), bytes_in_.load(), bytes_out_.load()};
}

void CountingStore::Count(size_t keys, size_t bytes_in) {
  calls_.fetch_add(1, std::memory_order_relaxed);
  keys_.fetch_add(keys, std::memory_order_relaxed);
  bytes_in_.fetch_add(bytes_in, std::memory_order_relaxed);
}

Status CountingStore::CheckWritable() const {
  if (!severed_.load()) return Status::Ok();
  return Status::Unavailable("this store view was severed (a simulated dead sidecar)");
}

void CountingStore::Returned(size_t bytes) {
  bytes_out_.fetch_add(bytes, std::memory_order_relaxed);
}

size_t CountingStore::KeyBytes(const std::vector<std::string>& keys) {
  size_t bytes = 0;
  for (const std::string& key : keys) bytes += key.size();
  return bytes;
}

Status CountingStore::DoSet(const std::string& key, std::string value) {
  COLLECTIVED_RETURN_IF_ERROR(CheckWritable());
  Count(1, key.size() + value.size());
  return inner_->Set(key, std::move(value));
}

StatusOr<std::string> CountingStore::DoGet(const std::string& key,
                                           std::chrono::milliseconds timeout) {
  Count(1, key.size());
  StatusOr<std::string> value = inner_->Get(key, timeout);
  if (value.ok()) Returned(value->size());
  return value;
}

StatusOr<std::int64_t> CountingStore::DoAdd(const std::string& key, std::int64_t delta) {
  COLLECTIVED_RETURN_IF_ERROR(CheckWritable());
  Count(1, key.size() + sizeof(delta));
  return inner_->Add(key, delta);
}

StatusOr<std::string> CountingStore::DoCompareSet(const std::string& key,
                                                  const std::string& expected,
                                                  std::string desired) {
  COLLECTIVED_RETURN_IF_ERROR(CheckWritable());
  Count(1, key.size() + expected.size() + desired.size());
  StatusOr<std::string> current = inner_->CompareSet(key, expected, std::move(desired));
  if (current.ok()) Returned(current->size());
  return current;
}

Status CountingStore::DoWait(const std::vector<std::string>& keys,
                             std::chrono::milliseconds timeout) {
  Count(keys.size(), KeyBytes(keys));
  return inner_->Wait(keys, timeout);
}

StatusOr<bool> CountingStore::DoCheck(const std::vector<std::string>& keys) {
  Count(keys.size(), KeyBytes(keys));
  return inner_->Check(keys);
}

StatusOr<bool> CountingStore::DoDeleteKey(const std::string& key) {
  COLLECTIVED_RETURN_IF_ERROR(CheckWritable());
  Count(1, key.size());
  return inner_->DeleteKey(key);
}

StatusOr<std::int64_t> CountingStore::DoDeletePrefix(const std::string& prefix) {
  COLLECTIVED_RETURN_IF_ERROR(CheckWritable());
  Count(1, prefix.size());
  return inner_->DeletePrefix(prefix);
}

StatusOr<std::int64_t> CountingStore::DoNumKeys() {
  Count(0, 0);
  return inner_->NumKeys();
}

StatusOr<std::vector<std::string>> CountingStore::DoMultiGet(const std::vector<std::string>& keys,
                                                             std::chrono::milliseconds timeout) {
  Count(keys.size(), KeyBytes(keys));
  StatusOr<std::vector<std::string>> values = inner_->MultiGet(keys, timeout);
  if (values.ok()) Returned(KeyBytes(*values));
  return values;
}

Status CountingStore::DoMultiSet(const std::vector<std::string>& keys,
                                 std::vector<std::string> values) {
  COLLECTIVED_RETURN_IF_ERROR(CheckWritable());
  Count(keys.size(), KeyBytes(keys) + KeyBytes(values));
  return inner_->MultiSet(keys, std::move(values));
}

Status CountingStore::DoAppend(const std::string& key, std::string_view value) {
  COLLECTIVED_RETURN_IF_ERROR(CheckWritable());
  Count(1, key.size() + value.size());
  return inner_->Append(key, value);
}

WaitId CountingStore::DoWaitAsync(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                                  WaitCallback done) {
  Count(keys.size(), KeyBytes(keys));
  return inner_->WaitAsync(std::move(keys), timeout, std::move(done));
}

bool CountingStore::DoCancelWait(WaitId id) {
  return inner_->CancelWait(id);
}

}  // namespace collectived
