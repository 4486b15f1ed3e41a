// The Store gRPC service: c10d store semantics over the engine's Store. Uses gRPC's callback
// API so that a blocked get/wait/multi_get holds no server thread; a client that cancels or
// disconnects ends its wait at once.
//
// Thread-safety: all methods are called concurrently by gRPC; Shutdown() may be called from
// any thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>

#include "collectived/v1/store.grpc.pb.h"
#include "engine/concurrency/clock.h"
#include "engine/store/store.h"
#include "services/collectived/metrics.h"
#include "services/collectived/store_access.h"

namespace collectived {

class StoreService final : public v1::Store::CallbackService {
 public:
  // Refusals (StoreAccessPolicy) are counted in `metrics`, which must outlive the service, as
  // must `clock`: the one `store` reads its timeouts on.
  StoreService(std::shared_ptr<Store> store, StoreAccessPolicy access, Metrics& metrics,
               Clock& clock = Clock::Real());
  ~StoreService() override;

  // Fails every pending wait with UNAVAILABLE carrying `reason`, and every later one too.
  void Shutdown(const std::string& reason);

  // Number of blocked get/wait/multi_get calls (for tests and diagnostics).
  size_t pending_waits();

  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* context,
                                const v1::StoreSetRequest* request,
                                v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* context,
                                const v1::StoreGetRequest* request,
                                v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* context,
                                const v1::StoreAddRequest* request,
                                v1::StoreAddResponse* response) override;
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* context,
                                       const v1::StoreCompareSetRequest* request,
                                       v1::StoreCompareSetResponse* response) override;
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* context,
                                 const v1::StoreWaitRequest* request,
                                 v1::StoreWaitResponse* response) override;
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const v1::StoreCheckRequest* request,
                                  v1::StoreCheckResponse* response) override;
  grpc::ServerUnaryReactor* DeleteKey(grpc::CallbackServerContext* context,
                                      const v1::StoreDeleteKeyRequest* request,
                                      v1::StoreDeleteKeyResponse* response) override;
  grpc::ServerUnaryReactor* DeletePrefix(grpc::CallbackServerContext* context,
                                         const v1::StoreDeletePrefixRequest* request,
                                         v1::StoreDeletePrefixResponse* response) override;
  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* context,
                                    const v1::StoreNumKeysRequest* request,
                                    v1::StoreNumKeysResponse* response) override;
  grpc::ServerUnaryReactor* MultiGet(grpc::CallbackServerContext* context,
                                     const v1::StoreMultiGetRequest* request,
                                     v1::StoreMultiGetResponse* response) override;
  grpc::ServerUnaryReactor* MultiSet(grpc::CallbackServerContext* context,
                                     const v1::StoreMultiSetRequest* request,
                                     v1::StoreMultiSetResponse* response) override;
  grpc::ServerUnaryReactor* Append(grpc::CallbackServerContext* context,
                                   const v1::StoreAppendRequest* request,
                                   v1::StoreAppendResponse* response) override;

  class PendingWait;  // One blocked get/wait/multi_get (defined in the .cc).

 private:
  // Null when the caller of `context` may touch every key in `keys` (StoreAccessPolicy); else
  // the call, finished with the refusal (counted and logged). `method` is the store call in
  // snake case ("compare_set").
  template <typename Keys>
  grpc::ServerUnaryReactor* RefuseForbidden(grpc::CallbackServerContext* context,
                                            std::string_view method, const Keys& keys);
  grpc::ServerUnaryReactor* RefuseForbiddenKey(grpc::CallbackServerContext* context,
                                               std::string_view method, std::string_view key);
  // Finishes the call with `refusal`, counted under the method's gRPC name.
  grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context, std::string_view method,
                                   const Status& refusal);

  friend class PendingWait;
  // Starts a wait for `keys`; when they exist, `read` fills the response (it may return
  // Timeout to ask for the wait to be re-armed if a key vanished meanwhile).
  grpc::ServerUnaryReactor* StartWait(grpc::CallbackServerContext* context,
                                      std::vector<std::string> keys, StoreTimeout timeout,
                                      std::function<Status()> read);
  void Forget(PendingWait* wait);
  std::string ShutdownReason();

  const std::shared_ptr<Store> store_;
  const StoreAccessPolicy access_;
  Metrics& metrics_;
  Clock& clock_;
  std::mutex mutex_;
  std::unordered_set<PendingWait*> pending_;  // guarded by mutex_
  std::string shutdown_reason_;               // guarded by mutex_; non-empty once shut down
};

}  // namespace collectived
