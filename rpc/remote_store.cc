#include "rpc/remote_store.h"

#include "rpc/channel.h"
#include "rpc/grpc_status.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

void SetDeadline(grpc::ClientContext* context, milliseconds timeout) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

// Deadline of a call that waits up to `timeout` in the store (kNoTimeout: no deadline).
void SetWaitDeadline(grpc::ClientContext* context, milliseconds timeout) {
  if (timeout != kNoTimeout) SetDeadline(context, timeout + RemoteStore::kDeadlineSlack);
}

}  // namespace

struct RemoteStore::AsyncWait {
  grpc::ClientContext context;
  v1::StoreWaitRequest request;
  v1::StoreWaitResponse response;
  WaitCallback done;
  std::mutex mutex;
  bool cancelled = false;  // guarded by mutex: CancelWait already reported Aborted
};

StatusOr<std::shared_ptr<RemoteStore>> RemoteStore::Connect(const std::string& address,
                                                            const ChannelSecurity& security) {
  auto channel = OpenSidecarChannel(address, security);
  if (!channel.ok()) return channel.status();
  return std::make_shared<RemoteStore>(*channel);
}

RemoteStore::RemoteStore(std::shared_ptr<grpc::Channel> channel)
    : stub_(v1::Store::NewStub(std::move(channel))) {}

RemoteStore::~RemoteStore() {
  std::map<WaitId, std::shared_ptr<AsyncWait>> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(pending_);
  }
  for (auto& [id, wait] : pending) {
    {
      std::lock_guard<std::mutex> lock(wait->mutex);
      wait->cancelled = true;
    }
    wait->context.TryCancel();
    wait->done(Status::Aborted("store client destroyed while waiting"));
  }
  // The callbacks of cancelled calls still run on gRPC's threads and touch this object.
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [this] { return outstanding_ == 0; });
}

Status RemoteStore::DoSet(const std::string& key, std::string value) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallDeadline);
  v1::StoreSetRequest request;
  request.set_key(key);
  request.set_value(std::move(value));
  v1::StoreSetResponse response;
  return FromGrpcStatus(stub_->Set(&context, request, &response), &context);
}

StatusOr<std::string> RemoteStore::DoGet(const std::string& key, milliseconds timeout) {
  grpc::ClientContext context;
  SetWaitDeadline(&context, timeout);
  v1::StoreGetRequest request;
  request.set_key(key);
  request.set_timeout_ms(timeout.count());
  v1::StoreGetResponse response;
  Status status = FromGrpcStatus(stub_->Get(&context, request, &response), &context);
  if (!status.ok()) return status;
  return std::move(*response.mutable_value());
}

StatusOr<std::int64_t> RemoteStore::DoAdd(const std::string& key, std::int64_t delta) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallDeadline);
  v1::StoreAddRequest request;
  request.set_key(key);
  request.set_delta(delta);
  v1::StoreAddResponse response;
  Status status = FromGrpcStatus(stub_->Add(&context, request, &response), &context);
  if (!status.ok()) return status;
  return response.value();
}

StatusOr<std::string> RemoteStore::DoCompareSet(const std::string& key, const std::string& expected,
                                                std::string desired) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallDeadline);
  v1::StoreCompareSetRequest request;
  request.set_key(key);
  request.set_expected(expected);
  request.set_desired(std::move(desired));
  v1::StoreCompareSetResponse response;
  Status status = FromGrpcStatus(stub_->CompareSet(&context, request, &response), &context);
  if (!status.ok()) return status;
  return std::move(*response.mutable_value());
}

Status RemoteStore::DoWait(const std::vector<std::string>& keys, milliseconds timeout) {
  grpc::ClientContext context;
  SetWaitDeadline(&context, timeout);
  v1::StoreWaitRequest request;
  for (const auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(timeout.count());
  v1::StoreWaitResponse response;
  return FromGrpcStatus(stub_->Wait(&context, request, &response), &context);
}

StatusOr<bool> RemoteStore::DoCheck(const std::vector<std::string>& keys) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallDeadline);
  v1::StoreCheckRequest request;
  for (const auto& key : keys) request.add_keys(key);
  v1::StoreCheckResponse response;
  Status status = FromGrpcStatus(stub_->Check(&context, request, &response), &context);
  if (!status.ok()) return status;
  return response.all_present();
}

StatusOr<bool> RemoteStore::DoDeleteKey(const std::string& key) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallDeadline);
  v1::StoreDeleteKeyRequest request;
  request.set_key(key);
  v1::StoreDeleteKeyResponse response;
  Status status = FromGrpcStatus(stub_->DeleteKey(&context, request, &response), &context);
  if (!status.ok()) return status;
  return response.deleted();
}

StatusOr<std::int64_t> RemoteStore::DoDeletePrefix(const std::string& prefix) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallDeadline);
  v1::StoreDeletePrefixRequest request;
  request.set_prefix(prefix);
  v1::StoreDeletePrefixResponse response;
  Status status = FromGrpcStatus(stub_->DeletePrefix(&context, request, &response), &context);
  if (!status.ok()) return status;
  return response.deleted();
}

StatusOr<std::int64_t> RemoteStore::DoNumKeys() {
  grpc::ClientContext context;
  SetDeadline(&context, kCallDeadline);
  v1::StoreNumKeysRequest request;
  v1::StoreNumKeysResponse response;
  Status status = FromGrpcStatus(stub_->NumKeys(&context, request, &response), &context);
  if (!status.ok()) return status;
  return response.num_keys();
}

StatusOr<std::vector<std::string>> RemoteStore::DoMultiGet(const std::vector<std::string>& keys,
                                                           milliseconds timeout) {
  grpc::ClientContext context;
  SetWaitDeadline(&context, timeout);
  v1::StoreMultiGetRequest request;
  for (const auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(timeout.count());
  v1::StoreMultiGetResponse response;
  Status status = FromGrpcStatus(stub_->MultiGet(&context, request, &response), &context);
  if (!status.ok()) return status;
  return std::vector<std::string>(response.values().begin(), response.values().end());
}

Status RemoteStore::DoMultiSet(const std::vector<std::string>& keys,
                               std::vector<std::string> values) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallDeadline);
  v1::StoreMultiSetRequest request;
  for (const auto& key : keys) request.add_keys(key);
  for (auto& value : values) request.add_values(std::move(value));
  v1::StoreMultiSetResponse response;
  return FromGrpcStatus(stub_->MultiSet(&context, request, &response), &context);
}

Status RemoteStore::DoAppend(const std::string& key, std::string_view value) {
  grpc::ClientContext context;
  SetDeadline(&context, kCallDeadline);
  v1::StoreAppendRequest request;
  request.set_key(key);
  request.set_value(std::string(value));
  v1::StoreAppendResponse response;
  return FromGrpcStatus(stub_->Append(&context, request, &response), &context);
}

WaitId RemoteStore::DoWaitAsync(std::vector<std::string> keys, milliseconds timeout,
                                WaitCallback done) {
  auto wait = std::make_shared<AsyncWait>();
  for (auto& key : keys) wait->request.add_keys(std::move(key));
  wait->request.set_timeout_ms(timeout.count());
  wait->done = std::move(done);
  SetWaitDeadline(&wait->context, timeout);
  WaitId id;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    id = next_wait_id_++;
    pending_.emplace(id, wait);
    ++outstanding_;
  }
  stub_->async()->Wait(&wait->context, &wait->request, &wait->response,
                       [this, id, wait](grpc::Status grpc_status) {
                         {
                           std::lock_guard<std::mutex> lock(mutex_);
                           pending_.erase(id);
                         }
                         bool report;
                         {
                           std::lock_guard<std::mutex> lock(wait->mutex);
                           report = !wait->cancelled;
                           wait->cancelled = true;
                         }
                         if (report) wait->done(FromGrpcStatus(grpc_status, &wait->context));
                         std::lock_guard<std::mutex> lock(mutex_);
                         if (--outstanding_ == 0) idle_.notify_all();
                       });
  return id;
}

bool RemoteStore::DoCancelWait(WaitId id) {
  std::shared_ptr<AsyncWait> wait;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = pending_.find(id);
    if (it == pending_.end()) return false;
    wait = it->second;
    pending_.erase(it);
  }
  {
    std::lock_guard<std::mutex> lock(wait->mutex);
    if (wait->cancelled) return false;
    wait->cancelled = true;
  }
  wait->context.TryCancel();
  wait->done(Status::Aborted("store wait cancelled"));
  return true;
}

}  // namespace collectived
