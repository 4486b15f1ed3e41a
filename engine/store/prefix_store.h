// PrefixStore: a namespace inside another Store, as c10d's PrefixStore. Every key is stored
// in the inner store as "<prefix>/<key>", so groups sharing one rendezvous store never clash.
// PrefixStores nest: PrefixStore("b", PrefixStore("a", s)) stores key k as "a/b/k" in s.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/store/store.h"

namespace collectived {

// Thread-safety: safe for concurrent use from many threads (it holds only immutable state and
// forwards every call to the inner store, which is itself thread-safe).
//
// Semantics that differ from "a store of its own", as in c10d:
//   - NumKeys returns the inner store's NumKeys, i.e. it counts every key of the underlying
//     store, not only the keys under this prefix.
//   - Limits apply to the prefixed key: a key of kMaxKeyBytes bytes is rejected by the inner
//     store with InvalidArgument, and error messages name the full prefixed key.
//   - The default timeout is this store's own (copied from the inner store at construction and
//     settable independently); every call passes an explicit timeout to the inner store.
//   - WaitAsync ids are the inner store's ids; CancelWait forwards to the inner store.
class PrefixStore final : public Store {
 public:
  // Creates a store whose keys live in `inner` under "<prefix>/". Requires: `inner` is not
  // null (a null inner store aborts the process: it is a programming error).
  PrefixStore(std::string prefix, std::shared_ptr<Store> inner);
  ~PrefixStore() override;

  // Returns the prefix given at construction (without the trailing "/").
  const std::string& prefix() const { return prefix_; }
  // Returns the wrapped store.
  const std::shared_ptr<Store>& inner() const { return inner_; }

 protected:
  Status DoSet(const std::string& key, std::string value) override;
  StatusOr<std::string> DoGet(const std::string& key, std::chrono::milliseconds timeout) override;
  StatusOr<std::int64_t> DoAdd(const std::string& key, std::int64_t delta) override;
  StatusOr<std::string> DoCompareSet(const std::string& key, const std::string& expected,
                                     std::string desired) override;
  Status DoWait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  StatusOr<bool> DoCheck(const std::vector<std::string>& keys) override;
  StatusOr<bool> DoDeleteKey(const std::string& key) override;
  StatusOr<std::int64_t> DoDeletePrefix(const std::string& prefix) override;
  StatusOr<std::int64_t> DoNumKeys() override;
  StatusOr<std::vector<std::string>> DoMultiGet(const std::vector<std::string>& keys,
                                                std::chrono::milliseconds timeout) override;
  Status DoMultiSet(const std::vector<std::string>& keys, std::vector<std::string> values) override;
  Status DoAppend(const std::string& key, std::string_view value) override;
  WaitId DoWaitAsync(std::vector<std::string> keys, std::chrono::milliseconds timeout,
                     WaitCallback done) override;
  bool DoCancelWait(WaitId id) override;

 private:
  std::string JoinKey(const std::string& key) const;
  std::vector<std::string> JoinKeys(const std::vector<std::string>& keys) const;

  const std::string prefix_;
  const std::shared_ptr<Store> inner_;
};

}  // namespace collectived
