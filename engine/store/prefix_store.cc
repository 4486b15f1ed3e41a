#include "engine/store/prefix_store.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace collectived {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> inner)
    : prefix_(std::move(prefix)), inner_(std::move(inner)) {
  if (inner_ == nullptr) {
    std::fprintf(stderr, "PrefixStore '%s' created with a null inner store\n", prefix_.c_str());
    std::abort();
  }
  // The inner store's default timeout is always valid, so this cannot fail.
  (void)SetDefaultTimeout(inner_->default_timeout());
}

PrefixStore::~PrefixStore() = default;

std::string PrefixStore::JoinKey(const std::string& key) const {
  return prefix_ + "/" + key;
}

std::vector<std::string> PrefixStore::JoinKeys(const std::vector<std::string>& keys) const {
  std::vector<std::string> joined;
  joined.reserve(keys.size());
  for (const std::string& key : keys) joined.push_back(JoinKey(key));
  return joined;
}

Status PrefixStore::DoSet(const std::string& key, std::string value) {
  return inner_->Set(JoinKey(key), std::move(value));
}

StatusOr<std::string> PrefixStore::DoGet(const std::string& key,
                                         std::chrono::milliseconds timeout) {
  return inner_->Get(JoinKey(key), timeout);
}

StatusOr<std::int64_t> PrefixStore::DoAdd(const std::string& key, std::int64_t delta) {
  return inner_->Add(JoinKey(key), delta);
}

StatusOr<std::string> PrefixStore::DoCompareSet(const std::string& key, const std::string& expected,
                                                std::string desired) {
  return inner_->CompareSet(JoinKey(key), expected, std::move(desired));
}

Status PrefixStore::DoWait(const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout) {
  return inner_->Wait(JoinKeys(keys), timeout);
}

StatusOr<bool> PrefixStore::DoCheck(const std::vector<std::string>& keys) {
  return inner_->Check(JoinKeys(keys));
}

StatusOr<bool> PrefixStore::DoDeleteKey(const std::string& key) {
  return inner_->DeleteKey(JoinKey(key));
}

StatusOr<std::int64_t> PrefixStore::DoDeletePrefix(const std::string& prefix) {
  return inner_->DeletePrefix(JoinKey(prefix));
}

StatusOr<std::int64_t> PrefixStore::DoNumKeys() {
  return inner_->NumKeys();
}

StatusOr<std::vector<std::string>> PrefixStore::DoMultiGet(const std::vector<std::string>& keys,
                                                           std::chrono::milliseconds timeout) {
  return inner_->MultiGet(JoinKeys(keys), timeout);
}

Status PrefixStore::DoMultiSet(const std::vector<std::string>& keys,
                               std::vector<std::string> values) {
  return inner_->MultiSet(JoinKeys(keys), std::move(values));
}

Status PrefixStore::DoAppend(const std::string& key, std::string_view value) {
  return inner_->Append(JoinKey(key), value);
}

WaitId PrefixStore::DoWaitAsync(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                                WaitCallback done) {
  return inner_->WaitAsync(JoinKeys(keys), timeout, std::move(done));
}

bool PrefixStore::DoCancelWait(WaitId id) {
  return inner_->CancelWait(id);
}

}  // namespace collectived
