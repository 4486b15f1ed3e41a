#include "engine/group/gloo/gloo_rendezvous_store.h"

#include <gloo/common/error.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

namespace collectived {

namespace {

// Gloo's way of failing: exceptions. Does nothing for OK.
void ThrowIfError(const Status& status, const char* op) {
  if (status.ok()) return;
  std::string message = std::string("collectived store ") + op + " failed: " + status.ToString();
  if (status.IsInvalidArgument()) throw gloo::InvalidOperationException(message);
  throw gloo::IoException(message);
}

}  // namespace

GlooRendezvousStore::GlooRendezvousStore(std::shared_ptr<collectived::Store> store,
                                         StoreTimeout timeout)
    : store_(std::move(store)), timeout_(timeout) {
  if (store_ == nullptr) {
    std::fprintf(stderr, "GlooRendezvousStore created with a null store\n");
    std::abort();
  }
}

GlooRendezvousStore::~GlooRendezvousStore() = default;

void GlooRendezvousStore::set(const std::string& key, const std::vector<char>& data) {
  ThrowIfError(store_->Set(key, std::string(data.begin(), data.end())), "set");
}

std::vector<char> GlooRendezvousStore::get(const std::string& key) {
  StatusOr<std::string> value = store_->Get(key, timeout_);
  ThrowIfError(value.status(), "get");
  return std::vector<char>(value.value().begin(), value.value().end());
}

void GlooRendezvousStore::wait(const std::vector<std::string>& keys) {
  ThrowIfError(store_->Wait(keys, timeout_), "wait");
}

void GlooRendezvousStore::wait(const std::vector<std::string>& keys,
                               const std::chrono::milliseconds& timeout) {
  // Gloo callers may pass "practically forever"; our stores reject timeouts over 7 days.
  const std::chrono::milliseconds clamped = timeout > kMaxStoreTimeout ? kMaxStoreTimeout : timeout;
  ThrowIfError(store_->Wait(keys, clamped), "wait");
}

}  // namespace collectived
