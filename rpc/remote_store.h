// RemoteStore: the engine's Store interface served by a collectived over gRPC, so everything
// written against Store (the store-based barrier, the Gloo rendezvous adapter, prefixes) works
// unchanged against any sidecar's store.
//
// Thread-safety: safe for concurrent use from many threads (one gRPC channel underneath).
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>

#include "collectived/v1/store.grpc.pb.h"
#include "engine/store/store.h"
#include "rpc/tls.h"

namespace collectived {

class RemoteStore final : public Store {
 public:
  // Connects lazily to the sidecar at `address` (see rpc/address.h), over TLS with `security`
  // when it is a TCP address that holds credentials. Returns InvalidArgument for a malformed
  // address.
  static StatusOr<std::shared_ptr<RemoteStore>> Connect(const std::string& address,
                                                        const ChannelSecurity& security = {});

  explicit RemoteStore(std::shared_ptr<grpc::Channel> channel);
  ~RemoteStore() override;

  // Extra time given to the RPC beyond the store timeout, so a timeout is reported by the
  // store (with its message naming the keys) rather than by gRPC's deadline.
  static constexpr std::chrono::milliseconds kDeadlineSlack{5000};
  // Deadline of calls that do not wait (set, add, ...): an unreachable sidecar fails them with
  // Unavailable after this long instead of hanging.
  static constexpr std::chrono::milliseconds kCallDeadline{60000};

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
  struct AsyncWait;

  std::unique_ptr<v1::Store::Stub> stub_;
  std::mutex mutex_;
  WaitId next_wait_id_ = 1;                               // guarded by mutex_
  std::map<WaitId, std::shared_ptr<AsyncWait>> pending_;  // guarded by mutex_
  int outstanding_ = 0;  // async calls whose callback has not finished; guarded by mutex_
  std::condition_variable idle_;
};

}  // namespace collectived
