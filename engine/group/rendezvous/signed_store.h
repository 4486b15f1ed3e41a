// SignedStore: the store of a group created with a job token, as its member sidecars see it.
// What they write with Set or MultiSet carries an HMAC-SHA256 of the key and the value under a
// key derived from the job token; Get and MultiGet refuse (PermissionDenied) a value whose MAC
// does not verify. So the group's records (announcements, the transport's addresses, the
// failure record) can be written only by sidecars that were given the token by a member rank:
// not by clients (the store already refuses them group keys), and not by other sidecars either.
// Counters (Add), CompareSet, Append and the existence of keys (Wait, Check, WaitAsync) pass
// through unauthenticated: a forged key can make a member wait or look, never believe.
#pragma once

#include <memory>
#include <string>

#include "engine/group/rendezvous/job_token.h"
#include "engine/store/store.h"

namespace collectived {

class SignedStore final : public Store {
 public:
  // `mac_key`: JobRecordKey of the group (job_token.h). Requires a non-null `inner`.
  SignedStore(std::shared_ptr<Store> inner, std::string mac_key);
  ~SignedStore() override;

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
  // `value` followed by its MAC.
  std::string Sign(const std::string& key, std::string value) const;
  // The value without its MAC, or PermissionDenied naming the key.
  StatusOr<std::string> Verify(const std::string& key, std::string signed_value) const;
  std::string Mac(const std::string& key, std::string_view value) const;

  const std::shared_ptr<Store> inner_;
  const KeyedHmacSha256 mac_;  // keyed once: every call signs or verifies
};

}  // namespace collectived
