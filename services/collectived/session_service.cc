#include "services/collectived/session_service.h"

#include <mutex>

#include "engine/logging.h"
#include "rpc/grpc_status.h"
#include "services/collectived/collective_calls.h"
#include "services/collectived/translate.h"

namespace collectived {

grpc::Status SessionService::Attach(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::SessionEvent, v1::SessionRequest>* stream) {
  v1::SessionRequest first;
  if (!stream->Read(&first))
    return grpc::Status(grpc::StatusCode::CANCELLED, "stream closed before open");
  if (!first.has_open()) {
    return ToGrpcStatus(Status::InvalidArgument("the first message on Attach must be `open`"),
                        context);
  }
  std::shared_ptr<Session> session =
      sidecar_.OpenSession(first.open().client_name(), first.open().pid());
  const std::string id = session->id();

  // Completions arrive on engine threads while this thread reads: serialize the writes, and
  // stop writing once this handler is about to return.
  struct Writer {
    std::mutex mutex;
    bool open = true;
  };
  auto writer = std::make_shared<Writer>();
  auto write = [writer, stream](const v1::SessionEvent& event) {
    std::lock_guard<std::mutex> lock(writer->mutex);
    if (!writer->open) return false;
    if (!stream->Write(event)) writer->open = false;
    return writer->open;
  };
  v1::SessionEvent opened;
  opened.mutable_opened()->set_session_id(id);
  opened.mutable_opened()->set_sidecar_id(sidecar_.sidecar_id());
  opened.mutable_opened()->set_version(version_);
  opened.mutable_opened()->set_gpu_backend(gpu_backend_);
  write(opened);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    streams_[id] = {context, write};  // completions of ops submitted by unary calls come here
    if (!shutdown_.ok()) {
      v1::SessionEvent closing;
      FillError(shutdown_, closing.mutable_closing());
      write(closing);
      context->TryCancel();
    }
  }
  LogInfo("session opened", {{"session", id},
                             {"client", first.open().client_name()},
                             {"pid", std::to_string(first.open().pid())},
                             {"peer", context->peer()}});

  v1::SessionRequest request;
  while (stream->Read(&request)) {
    if (request.has_submit()) {
      v1::CollectiveRequest submit = request.submit();
      submit.set_session_id(id);
      StatusOr<uint64_t> accepted = SubmitCollective(sidecar_, submit, write);
      if (!accepted.ok()) {
        // Refused before it started: answer on the stream like any completion.
        v1::SessionEvent event;
        v1::CollectiveResponse* response = event.mutable_completion();
        response->set_client_op_id(submit.client_op_id());
        response->set_group(submit.group());
        FillError(accepted.status(), response->mutable_error());
        write(event);
      }
    } else if (request.kind_case() == v1::SessionRequest::kPing) {
      v1::SessionEvent pong;
      pong.set_pong(request.ping());
      write(pong);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    streams_.erase(id);
  }
  {
    std::lock_guard<std::mutex> lock(writer->mutex);
    writer->open = false;
  }
  std::string why =
      context->IsCancelled() ? "the client disconnected" : "the client closed its session";
  LogInfo("session ended", {{"session", id}, {"why", why}});
  sidecar_.CloseSession(id, why);
  return grpc::Status::OK;
}

void SessionService::Deliver(const std::string& session_id, const v1::SessionEvent& event) {
  std::function<bool(const v1::SessionEvent&)> write;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = streams_.find(session_id);
    if (it == streams_.end()) return;
    write = it->second.write;
  }
  write(event);
}

void SessionService::Shutdown(const Status& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  shutdown_ = reason;
  v1::SessionEvent closing;
  FillError(reason, closing.mutable_closing());
  for (auto& [id, stream] : streams_) {
    stream.write(closing);
    stream.context->TryCancel();
  }
}

grpc::Status SessionService::RegisterBuffer(grpc::ServerContext* context,
                                            const v1::RegisterBufferRequest* request,
                                            v1::RegisterBufferResponse* response) {
  StatusOr<MappedBuffer> buffer =
      sidecar_.RegisterBuffer(request->session_id(), request->shm_name(), request->size());
  if (!buffer.ok()) return ToGrpcStatus(buffer.status(), context);
  response->set_buffer_id(buffer->buffer_id);
  response->set_mapped_size(buffer->mapped_size);
  return grpc::Status::OK;
}

grpc::Status SessionService::UnregisterBuffer(grpc::ServerContext* context,
                                              const v1::UnregisterBufferRequest* request,
                                              v1::UnregisterBufferResponse*) {
  return ToGrpcStatus(sidecar_.UnregisterBuffer(request->session_id(), request->buffer_id()),
                      context);
}

}  // namespace collectived
