// Runtime: the sidecar state the gRPC services share — the engine's group and session
// registries, the rendezvous stores (local, and remote ones by address), and the asynchronous
// ops of each session with the stream their completions are delivered on.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "collectived/v1/collectives.pb.h"
#include "collectived/v1/session.pb.h"
#include "engine/group/group_registry.h"
#include "engine/session.h"
#include "engine/store/store.h"

namespace collectived {

class Runtime {
 public:
  Runtime(GroupRegistryOptions options, std::shared_ptr<Store> local_store);
  ~Runtime();

  GroupRegistry& groups() { return groups_; }
  SessionRegistry& sessions() { return sessions_; }
  const std::string& sidecar_id() const { return sidecar_id_; }

  // The store at `address` ("" = this sidecar's own); remote stores are cached per address.
  StatusOr<std::shared_ptr<Store>> StoreAt(const std::string& address);

  // Delivers events to an attached session's stream; returns false once the stream is gone.
  using EventSink = std::function<bool(const v1::SessionEvent&)>;
  void SetSink(const std::string& session_id, EventSink sink);
  // Ends a session: its groups fail naming its rank, its pending ops are forgotten.
  void EndSession(const std::string& session_id, const std::string& why);

  // Synchronous op: returns the response (errors of the op travel in response.error; a
  // returned error means the request could not even be accepted).
  StatusOr<v1::CollectiveResponse> Run(const v1::CollectiveRequest& request);
  // Asynchronous op: returns its sequence number at once; the completion goes to the session's
  // stream and can be awaited with Wait.
  StatusOr<uint64_t> Submit(const v1::CollectiveRequest& request);
  StatusOr<v1::CollectiveResponse> Wait(const std::string& session_id, uint64_t client_op_id,
                                        std::chrono::milliseconds timeout);

  // Fails every group and every later request with `reason`.
  void Shutdown(const Status& reason);

 private:
  struct OpRecord;
  struct SessionOps {
    std::mutex mutex;
    EventSink sink;
    std::map<uint64_t, std::shared_ptr<OpRecord>> ops;  // pending and recently completed
    std::deque<uint64_t> completed;                     // oldest first, bounded
  };

  StatusOr<std::shared_ptr<OpRecord>> Start(const v1::CollectiveRequest& request);
  std::shared_ptr<SessionOps> OpsOf(const std::string& session_id);

  const std::string sidecar_id_;
  const std::shared_ptr<Store> local_store_;
  GroupRegistry groups_;
  SessionRegistry sessions_;

  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Store>> remote_stores_;     // guarded by mutex_
  std::map<std::string, std::shared_ptr<SessionOps>> session_ops_;  // guarded by mutex_
  Status shutdown_;                                                 // guarded by mutex_
};

}  // namespace collectived
