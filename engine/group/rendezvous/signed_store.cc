#include "engine/group/rendezvous/signed_store.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "engine/group/rendezvous/job_token.h"

namespace collectived {
namespace {

constexpr size_t kMacBytes = 32;  // SHA-256

}  // namespace

SignedStore::SignedStore(std::shared_ptr<Store> inner, std::string mac_key)
    : inner_(std::move(inner)), mac_(mac_key) {
  if (inner_ == nullptr) {
    std::fprintf(stderr, "SignedStore created with a null inner store\n");
    std::abort();
  }
  (void)SetDefaultTimeout(inner_->default_timeout());
}

SignedStore::~SignedStore() = default;

std::string SignedStore::Mac(const std::string& key, std::string_view value) const {
  // The key's length first: (key, value) pairs map to distinct messages.
  std::string message = std::to_string(key.size()) + ":" + key;
  message.append(value);
  return mac_.Digest(message);
}

std::string SignedStore::Sign(const std::string& key, std::string value) const {
  std::string mac = Mac(key, value);
  value += mac;
  return value;
}

StatusOr<std::string> SignedStore::Verify(const std::string& key, std::string signed_value) const {
  if (signed_value.size() >= kMacBytes) {
    const size_t length = signed_value.size() - kMacBytes;
    std::string_view value(signed_value.data(), length);
    std::string_view mac(signed_value.data() + length, kMacBytes);
    if (ConstantTimeEquals(Mac(key, value), mac)) {
      signed_value.resize(length);
      return signed_value;
    }
  }
  return Status::PermissionDenied("store key " + QuoteKey(key) +
                                  " holds a record the group's job token does not authenticate "
                                  "(written by something outside the group): refused");
}

Status SignedStore::DoSet(const std::string& key, std::string value) {
  return inner_->Set(key, Sign(key, std::move(value)));
}

StatusOr<std::string> SignedStore::DoGet(const std::string& key,
                                         std::chrono::milliseconds timeout) {
  StatusOr<std::string> value = inner_->Get(key, timeout);
  if (!value.ok()) return value.status();
  return Verify(key, std::move(*value));
}

StatusOr<std::int64_t> SignedStore::DoAdd(const std::string& key, std::int64_t delta) {
  return inner_->Add(key, delta);
}

StatusOr<std::string> SignedStore::DoCompareSet(const std::string& key, const std::string& expected,
                                                std::string desired) {
  return inner_->CompareSet(key, expected, std::move(desired));
}

Status SignedStore::DoWait(const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout) {
  return inner_->Wait(keys, timeout);
}

StatusOr<bool> SignedStore::DoCheck(const std::vector<std::string>& keys) {
  return inner_->Check(keys);
}

StatusOr<bool> SignedStore::DoDeleteKey(const std::string& key) {
  return inner_->DeleteKey(key);
}

StatusOr<std::int64_t> SignedStore::DoDeletePrefix(const std::string& prefix) {
  return inner_->DeletePrefix(prefix);
}

StatusOr<std::int64_t> SignedStore::DoNumKeys() {
  return inner_->NumKeys();
}

StatusOr<std::vector<std::string>> SignedStore::DoMultiGet(const std::vector<std::string>& keys,
                                                           std::chrono::milliseconds timeout) {
  StatusOr<std::vector<std::string>> values = inner_->MultiGet(keys, timeout);
  if (!values.ok()) return values.status();
  for (size_t i = 0; i < keys.size(); ++i) {
    StatusOr<std::string> value = Verify(keys[i], std::move((*values)[i]));
    if (!value.ok()) return value.status();
    (*values)[i] = std::move(*value);
  }
  return values;
}

Status SignedStore::DoMultiSet(const std::vector<std::string>& keys,
                               std::vector<std::string> values) {
  for (size_t i = 0; i < keys.size(); ++i) values[i] = Sign(keys[i], std::move(values[i]));
  return inner_->MultiSet(keys, std::move(values));
}

Status SignedStore::DoAppend(const std::string& key, std::string_view value) {
  return inner_->Append(key, value);
}

WaitId SignedStore::DoWaitAsync(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                                WaitCallback done) {
  return inner_->WaitAsync(std::move(keys), timeout, std::move(done));
}

bool SignedStore::DoCancelWait(WaitId id) {
  return inner_->CancelWait(id);
}

}  // namespace collectived
