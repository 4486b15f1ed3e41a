#include "services/collectived/runtime.h"

#include "rpc/remote_store.h"
#include "services/collectived/translate.h"

namespace collectived {

// Completed responses kept per session for a late Wait.
constexpr size_t kCompletedOpsKept = 1024;

struct Runtime::OpRecord {
  TranslatedRequest translated;
  std::shared_ptr<Work> work;
  uint64_t client_op_id = 0;
};

Runtime::Runtime(GroupRegistryOptions options, std::shared_ptr<Store> local_store)
    : sidecar_id_(options.sidecar_id),
      local_store_(std::move(local_store)),
      groups_(std::move(options)),
      sessions_(groups_) {}

Runtime::~Runtime() = default;

StatusOr<std::shared_ptr<Store>> Runtime::StoreAt(const std::string& address) {
  if (address.empty()) return local_store_;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = remote_stores_.find(address);
  if (it != remote_stores_.end()) return it->second;
  StatusOr<std::shared_ptr<RemoteStore>> store = RemoteStore::Connect(address);
  if (!store.ok()) return store.status();
  remote_stores_.emplace(address, *store);
  return std::shared_ptr<Store>(*store);
}

std::shared_ptr<Runtime::SessionOps> Runtime::OpsOf(const std::string& session_id) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto& ops = session_ops_[session_id];
  if (!ops) ops = std::make_shared<SessionOps>();
  return ops;
}

void Runtime::SetSink(const std::string& session_id, EventSink sink) {
  auto ops = OpsOf(session_id);
  std::lock_guard<std::mutex> lock(ops->mutex);
  ops->sink = std::move(sink);
}

void Runtime::EndSession(const std::string& session_id, const std::string& why) {
  sessions_.Close(session_id, why);
  std::lock_guard<std::mutex> lock(mutex_);
  session_ops_.erase(session_id);
}

StatusOr<std::shared_ptr<Runtime::OpRecord>> Runtime::Start(const v1::CollectiveRequest& request) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!shutdown_.ok()) return shutdown_;
  }
  StatusOr<std::shared_ptr<Session>> session = sessions_.Find(request.session_id());
  if (!session.ok()) return session.status();
  std::shared_ptr<Group> group = groups_.Find(request.group());
  if (!group)
    return Status::InvalidArgument("unknown group '" + request.group() + "' (create it first)");
  int group_rank = (*session)->GroupRankIn(request.group());
  if (group_rank < 0) {
    return Status::InvalidArgument("session " + request.session_id() + " is not part of group '" +
                                   request.group() + "'");
  }
  StatusOr<TranslatedRequest> translated = TranslateRequest(request, **session);
  if (!translated.ok()) return translated.status();
  auto record = std::make_shared<OpRecord>();
  record->client_op_id = request.client_op_id();
  record->translated = std::move(*translated);
  record->work = group->Submit(group_rank, record->translated.request);
  return record;
}

StatusOr<v1::CollectiveResponse> Runtime::Run(const v1::CollectiveRequest& request) {
  StatusOr<std::shared_ptr<OpRecord>> record = Start(request);
  if (!record.ok()) return record.status();
  const Work& work = *(*record)->work;
  (void)work.future().Wait();  // the engine completes every op: by success, failure or timeout
  v1::CollectiveResponse response;
  FillResponse((*record)->translated, work, request.client_op_id(), &response);
  return response;
}

StatusOr<uint64_t> Runtime::Submit(const v1::CollectiveRequest& request) {
  StatusOr<std::shared_ptr<OpRecord>> started = Start(request);
  if (!started.ok()) return started.status();
  std::shared_ptr<OpRecord> record = *started;
  std::shared_ptr<SessionOps> ops = OpsOf(request.session_id());
  {
    std::lock_guard<std::mutex> lock(ops->mutex);
    ops->ops[record->client_op_id] = record;
  }
  std::weak_ptr<SessionOps> weak_ops = ops;
  record->work->AddCallback([weak_ops, record](const Status&) {
    auto ops = weak_ops.lock();
    if (!ops) return;
    v1::SessionEvent event;
    FillResponse(record->translated, *record->work, record->client_op_id,
                 event.mutable_completion());
    std::lock_guard<std::mutex> lock(ops->mutex);
    ops->completed.push_back(record->client_op_id);
    while (ops->completed.size() > kCompletedOpsKept) {
      auto oldest = ops->ops.find(ops->completed.front());
      if (oldest != ops->ops.end() && oldest->second->work->IsCompleted()) ops->ops.erase(oldest);
      ops->completed.pop_front();
    }
    if (ops->sink) ops->sink(event);
  });
  return record->work->info().sequence_number;
}

StatusOr<v1::CollectiveResponse> Runtime::Wait(const std::string& session_id, uint64_t client_op_id,
                                               std::chrono::milliseconds timeout) {
  std::shared_ptr<OpRecord> record;
  {
    auto ops = OpsOf(session_id);
    std::lock_guard<std::mutex> lock(ops->mutex);
    auto it = ops->ops.find(client_op_id);
    if (it == ops->ops.end()) {
      return Status::NotFound("session " + session_id + " has no op with client_op_id " +
                              std::to_string(client_op_id) +
                              " (never submitted, or completed long ago)");
    }
    record = it->second;
  }
  v1::CollectiveResponse response;
  Status waited = timeout.count() > 0 ? record->work->Wait(timeout) : record->work->future().Wait();
  if (!record->work->IsCompleted()) {
    response.set_client_op_id(client_op_id);
    response.set_group(record->work->info().group);
    response.set_op(record->work->info().op);
    response.set_sequence_number(record->work->info().sequence_number);
    FillError(waited, response.mutable_error());
    return response;
  }
  FillResponse(record->translated, *record->work, client_op_id, &response);
  return response;
}

void Runtime::Shutdown(const Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    shutdown_ = reason;
  }
  groups_.Shutdown(reason);
}

}  // namespace collectived
