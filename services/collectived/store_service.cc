#include "services/collectived/store_service.h"

#include <atomic>
#include <cctype>
#include <chrono>

#include "engine/group/rendezvous/group_keys.h"
#include "rpc/caller.h"
#include "rpc/grpc_status.h"
#include "services/collectived/refusals.h"

namespace collectived {
namespace {

StoreTimeout TimeoutOf(bool has_timeout, int64_t timeout_ms) {
  if (!has_timeout) return std::nullopt;
  return std::chrono::milliseconds(timeout_ms);
}

// The gRPC name of a store call named in snake case ("compare_set" -> "Store.CompareSet"), the
// label its refusals are counted under, like the other services' methods.
std::string StoreMethodLabel(std::string_view method) {
  std::string label = "Store.";
  bool upper = true;
  for (char c : method) {
    if (c == '_') {
      upper = true;
      continue;
    }
    label.push_back(upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c);
    upper = false;
  }
  return label;
}

// Finishes a unary call whose work is already done.
grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context, const Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status, context));
  return reactor;
}

}  // namespace

// One blocked get/wait/multi_get. Lives until gRPC calls OnDone and no other thread is still
// inside Arm() or Shutdown() with it (reference counted), because the store may complete the
// wait on another thread before WaitAsync has even returned.
class StoreService::PendingWait final : public grpc::ServerUnaryReactor {
 public:
  PendingWait(StoreService* service, grpc::CallbackServerContext* context,
              std::vector<std::string> keys, StoreTimeout timeout, std::function<Status()> read)
      : service_(service), context_(context), keys_(std::move(keys)), read_(std::move(read)) {
    // An absurd timeout is refused by the store; adding it to now() would overflow first.
    if (timeout && timeout->count() > 0 && *timeout <= kMaxStoreTimeout) {
      deadline_ = service_->clock_.After(*timeout);
    }
    timeout_ = timeout;
  }

  void Ref() { refs_.fetch_add(1); }
  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  // Registers the wait with the store; may complete (and Finish) before returning.
  void Arm(StoreTimeout timeout) {
    Ref();
    WaitId id = service_->store_->WaitAsync(keys_, timeout, [this](Status s) { OnWaitDone(s); });
    bool cancel = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!finished_) {
        wait_id_ = id;
        cancel = cancelled_;
      }
    }
    if (cancel && id != kInvalidWaitId) service_->store_->CancelWait(id);
    Unref();
  }

  // Ends the wait early because the sidecar stops.
  void Abandon() {
    WaitId id;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cancelled_ = true;
      id = wait_id_;
    }
    if (id != kInvalidWaitId) service_->store_->CancelWait(id);
  }

  void OnCancel() override { Abandon(); }

  void OnDone() override {
    service_->Forget(this);
    Unref();
  }

 private:
  void OnWaitDone(Status status) {
    if (status.ok()) {
      status = read_();
      if (status.IsTimeout()) {
        // A key vanished between the wait and the read: wait again for what is left of the time.
        StoreTimeout next = timeout_;
        bool expired = false;
        if (deadline_) {
          auto left =
              std::chrono::ceil<std::chrono::milliseconds>(*deadline_ - service_->clock_.Now());
          if (left.count() > 0) {
            next = left;
          } else {
            expired = true;
          }
        }
        if (!expired) {
          {
            std::lock_guard<std::mutex> lock(mutex_);
            wait_id_ = kInvalidWaitId;
          }
          Arm(next);
          return;
        }
        status = Status::Timeout("Timeout after " + std::to_string(timeout_->count()) +
                                 " ms waiting for keys in store: they were deleted again before " +
                                 "they could be read");
      }
    }
    grpc::Status result;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (finished_) return;
      finished_ = true;
      if (status.kind() == ErrorKind::kAborted && cancelled_) {
        std::string reason = service_->ShutdownReason();
        result = reason.empty() ? grpc::Status(grpc::StatusCode::CANCELLED, "wait cancelled")
                                : ToGrpcStatus(Status::Unavailable(reason), context_);
      } else {
        result = ToGrpcStatus(status, context_);
      }
    }
    Finish(result);  // Last touch of `this` on this path: OnDone may follow at once.
  }

  StoreService* const service_;
  grpc::CallbackServerContext* const context_;
  const std::vector<std::string> keys_;
  const std::function<Status()> read_;
  StoreTimeout timeout_;
  std::optional<Clock::TimePoint> deadline_;
  std::atomic<int> refs_{1};  // gRPC's reference, dropped in OnDone

  std::mutex mutex_;
  WaitId wait_id_ = kInvalidWaitId;  // guarded by mutex_
  bool cancelled_ = false;           // guarded by mutex_
  bool finished_ = false;            // guarded by mutex_
};

StoreService::StoreService(std::shared_ptr<Store> store, StoreAccessPolicy access, Metrics& metrics,
                           Clock& clock)
    : store_(std::move(store)), access_(std::move(access)), metrics_(metrics), clock_(clock) {}

grpc::ServerUnaryReactor* StoreService::Refuse(grpc::CallbackServerContext* context,
                                               std::string_view method, const Status& refusal) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(Answer(metrics_, StoreMethodLabel(method), refusal, context));
  return reactor;
}

template <typename Keys>
grpc::ServerUnaryReactor* StoreService::RefuseForbidden(grpc::CallbackServerContext* context,
                                                        std::string_view method, const Keys& keys) {
  const Caller caller = IdentifyCaller(*context);
  for (const auto& key : keys) {
    if (Status allowed = access_.CheckKey(caller, method, key); !allowed.ok()) {
      return Refuse(context, method, allowed);
    }
  }
  return nullptr;
}

grpc::ServerUnaryReactor* StoreService::RefuseForbiddenKey(grpc::CallbackServerContext* context,
                                                           std::string_view method,
                                                           std::string_view key) {
  return RefuseForbidden(context, method, std::initializer_list<std::string_view>{key});
}

StoreService::~StoreService() = default;

std::string StoreService::ShutdownReason() {
  std::lock_guard<std::mutex> lock(mutex_);
  return shutdown_reason_;
}

void StoreService::Shutdown(const std::string& reason) {
  std::vector<PendingWait*> waits;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_reason_ = reason;
    for (PendingWait* wait : pending_) {
      wait->Ref();
      waits.push_back(wait);
    }
  }
  for (PendingWait* wait : waits) {
    wait->Abandon();
    wait->Unref();
  }
}

size_t StoreService::pending_waits() {
  std::lock_guard<std::mutex> lock(mutex_);
  return pending_.size();
}

void StoreService::Forget(PendingWait* wait) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.erase(wait);
}

grpc::ServerUnaryReactor* StoreService::StartWait(grpc::CallbackServerContext* context,
                                                  std::vector<std::string> keys,
                                                  StoreTimeout timeout,
                                                  std::function<Status()> read) {
  auto* wait = new PendingWait(this, context, std::move(keys), timeout, std::move(read));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!shutdown_reason_.empty()) {
      std::string reason = shutdown_reason_;
      wait->Unref();
      return FinishNow(context, Status::Unavailable(reason));
    }
    pending_.insert(wait);
  }
  wait->Arm(timeout);
  return wait;
}

grpc::ServerUnaryReactor* StoreService::Set(grpc::CallbackServerContext* context,
                                            const v1::StoreSetRequest* request,
                                            v1::StoreSetResponse*) {
  if (auto* refused = RefuseForbiddenKey(context, "set", request->key())) return refused;
  return FinishNow(context, store_->Set(request->key(), request->value()));
}

grpc::ServerUnaryReactor* StoreService::Get(grpc::CallbackServerContext* context,
                                            const v1::StoreGetRequest* request,
                                            v1::StoreGetResponse* response) {
  if (auto* refused = RefuseForbiddenKey(context, "get", request->key())) return refused;
  const std::string& key = request->key();
  return StartWait(context, {key}, TimeoutOf(request->has_timeout_ms(), request->timeout_ms()),
                   [this, key, response]() -> Status {
                     StatusOr<std::vector<std::string>> values =
                         store_->MultiGet({key}, std::chrono::milliseconds(1));
                     if (!values.ok()) return values.status();
                     response->set_value(std::move(values->front()));
                     return Status::Ok();
                   });
}

grpc::ServerUnaryReactor* StoreService::Add(grpc::CallbackServerContext* context,
                                            const v1::StoreAddRequest* request,
                                            v1::StoreAddResponse* response) {
  if (auto* refused = RefuseForbiddenKey(context, "add", request->key())) return refused;
  StatusOr<int64_t> value = store_->Add(request->key(), request->delta());
  if (value.ok()) response->set_value(*value);
  return FinishNow(context, value.status());
}

grpc::ServerUnaryReactor* StoreService::CompareSet(grpc::CallbackServerContext* context,
                                                   const v1::StoreCompareSetRequest* request,
                                                   v1::StoreCompareSetResponse* response) {
  if (auto* refused = RefuseForbiddenKey(context, "compare_set", request->key())) return refused;
  StatusOr<std::string> value =
      store_->CompareSet(request->key(), request->expected(), request->desired());
  if (value.ok()) response->set_value(std::move(*value));
  return FinishNow(context, value.status());
}

grpc::ServerUnaryReactor* StoreService::Wait(grpc::CallbackServerContext* context,
                                             const v1::StoreWaitRequest* request,
                                             v1::StoreWaitResponse*) {
  if (auto* refused = RefuseForbidden(context, "wait", request->keys())) return refused;
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  return StartWait(context, std::move(keys),
                   TimeoutOf(request->has_timeout_ms(), request->timeout_ms()),
                   [] { return Status::Ok(); });
}

grpc::ServerUnaryReactor* StoreService::Check(grpc::CallbackServerContext* context,
                                              const v1::StoreCheckRequest* request,
                                              v1::StoreCheckResponse* response) {
  if (auto* refused = RefuseForbidden(context, "check", request->keys())) return refused;
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  StatusOr<bool> present = store_->Check(keys);
  if (present.ok()) response->set_all_present(*present);
  return FinishNow(context, present.status());
}

grpc::ServerUnaryReactor* StoreService::DeleteKey(grpc::CallbackServerContext* context,
                                                  const v1::StoreDeleteKeyRequest* request,
                                                  v1::StoreDeleteKeyResponse* response) {
  if (auto* refused = RefuseForbiddenKey(context, "delete_key", request->key())) return refused;
  StatusOr<bool> deleted = store_->DeleteKey(request->key());
  if (deleted.ok()) response->set_deleted(*deleted);
  return FinishNow(context, deleted.status());
}

grpc::ServerUnaryReactor* StoreService::DeletePrefix(grpc::CallbackServerContext* context,
                                                     const v1::StoreDeletePrefixRequest* request,
                                                     v1::StoreDeletePrefixResponse* response) {
  // Only for the keys of groups: a peer sidecar removes a destroyed group's keys, nothing else.
  if (!GroupKeys::IsGroupKey(request->prefix())) {
    return Refuse(context, "delete_prefix",
                  Status::PermissionDenied("store delete_prefix is only for the keys of groups "
                                           "(under collectived/groups/), and only for peer "
                                           "sidecars"));
  }
  if (auto* refused = RefuseForbiddenKey(context, "delete_prefix", request->prefix()))
    return refused;
  StatusOr<std::int64_t> deleted = store_->DeletePrefix(request->prefix());
  if (deleted.ok()) response->set_deleted(*deleted);
  return FinishNow(context, deleted.status());
}

grpc::ServerUnaryReactor* StoreService::NumKeys(grpc::CallbackServerContext* context,
                                                const v1::StoreNumKeysRequest*,
                                                v1::StoreNumKeysResponse* response) {
  StatusOr<int64_t> count = store_->NumKeys();
  if (count.ok()) response->set_num_keys(*count);
  return FinishNow(context, count.status());
}

grpc::ServerUnaryReactor* StoreService::MultiGet(grpc::CallbackServerContext* context,
                                                 const v1::StoreMultiGetRequest* request,
                                                 v1::StoreMultiGetResponse* response) {
  if (auto* refused = RefuseForbidden(context, "multi_get", request->keys())) return refused;
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  return StartWait(context, keys, TimeoutOf(request->has_timeout_ms(), request->timeout_ms()),
                   [this, keys, response]() -> Status {
                     StatusOr<std::vector<std::string>> values =
                         store_->MultiGet(keys, std::chrono::milliseconds(1));
                     if (!values.ok()) return values.status();
                     response->clear_values();
                     for (std::string& value : *values) response->add_values(std::move(value));
                     return Status::Ok();
                   });
}

grpc::ServerUnaryReactor* StoreService::MultiSet(grpc::CallbackServerContext* context,
                                                 const v1::StoreMultiSetRequest* request,
                                                 v1::StoreMultiSetResponse*) {
  if (auto* refused = RefuseForbidden(context, "multi_set", request->keys())) return refused;
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  std::vector<std::string> values(request->values().begin(), request->values().end());
  return FinishNow(context, store_->MultiSet(keys, std::move(values)));
}

grpc::ServerUnaryReactor* StoreService::Append(grpc::CallbackServerContext* context,
                                               const v1::StoreAppendRequest* request,
                                               v1::StoreAppendResponse*) {
  if (auto* refused = RefuseForbiddenKey(context, "append", request->key())) return refused;
  return FinishNow(context, store_->Append(request->key(), request->value()));
}

}  // namespace collectived
