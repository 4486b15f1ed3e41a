#include "services/collectived/session_service.h"

#include <grpcpp/support/method_handler.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <exception>
#include <mutex>

#include "engine/vocabulary/logging.h"
#include "rpc/grpc_status.h"
#include "services/collectived/collective_calls.h"
#include "services/collectived/refusals.h"
#include "services/collectived/session_binding.h"
#include "services/collectived/translate.h"
#include "services/collectived/unix_connections.h"

namespace collectived {

SessionService::SessionService(Sidecar& sidecar, Metrics& metrics, std::string version,
                               bool gpu_backend, std::string fd_channel_path)
    : sidecar_(sidecar),
      metrics_(metrics),
      version_(std::move(version)),
      gpu_backend_(gpu_backend),
      fd_channel_path_(std::move(fd_channel_path)) {
  // Attach reads raw bytes and parses them itself: gRPC's own parsing makes Read() return false
  // on a malformed message, indistinguishable from a client that closed its side, so the stream
  // would end with OK. Method 0 is Attach (proto/collectived/v1/session.proto).
  MarkMethodStreamed(
      0,
      new grpc::internal::BidiStreamingHandler<SessionService, grpc::ByteBuffer, v1::SessionEvent>(
          [](SessionService* service, grpc::ServerContext* context, RawSessionStream* stream) {
            return service->AttachRaw(context, stream);
          },
          this));
}

namespace {

// Parses one message of the session stream; InvalidArgument naming the message otherwise.
Status ParseSessionRequest(grpc::ByteBuffer& bytes, size_t index, v1::SessionRequest* request) {
  grpc::ProtoBufferReader reader(&bytes);
  if (!reader.status().ok() || !request->ParseFromZeroCopyStream(&reader)) {
    return Status::InvalidArgument("message " + std::to_string(index) +
                                   " on the session stream is not a valid "
                                   "collectived.v1.SessionRequest (malformed protobuf)");
  }
  return Status::Ok();
}

}  // namespace

grpc::Status SessionService::AttachRaw(grpc::ServerContext* context, RawSessionStream* stream) {
  grpc::ByteBuffer bytes;
  v1::SessionRequest first;
  if (!stream->Read(&bytes))
    return grpc::Status(grpc::StatusCode::CANCELLED, "stream closed before open");
  if (Status parsed = ParseSessionRequest(bytes, 0, &first); !parsed.ok())
    return ToGrpcStatus(parsed, context);
  if (!first.has_open()) {
    return ToGrpcStatus(Status::InvalidArgument("the first message on Attach must be `open`"),
                        context);
  }
  const std::string binding = SessionBinding(*context);
  std::optional<UnixConnections::Connection> local =
      UnixConnections::Instance().Find(context->peer());
  StatusOr<std::shared_ptr<Session>> opened_session =
      sidecar_.OpenSession(first.open().client_name(), first.open().pid(), binding,
                           local ? local->peer : PeerCredentials{}, ClientIdentity(*context));
  if (!opened_session.ok()) return ToGrpcStatus(opened_session.status(), context);
  std::shared_ptr<Session> session = std::move(*opened_session);
  // The secret id leaves the sidecar once, in the `opened` event below; everything else (logs,
  // errors) names the session by its label.
  const std::string id = session->id();
  const std::string label = session->label();
  const SessionRef self{id, binding};

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
  // However this handler ends (a closed stream, a malformed message, an exception), the stream
  // is forgotten and the session closed: a stream left registered would take writes after its
  // handler returned.
  std::string why = "the client closed its session";
  auto end_session = [&] {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      streams_.erase(id);
    }
    {
      std::lock_guard<std::mutex> lock(writer->mutex);
      writer->open = false;
    }
    LogInfo("session ended", {{"session", label}, {"why", why}});
    sidecar_.CloseSession(id, why);
  };
  struct EndSession {
    std::function<void()> end;
    ~EndSession() { end(); }
  } ending{end_session};

  v1::SessionEvent opened;
  opened.mutable_opened()->set_session_id(id);
  opened.mutable_opened()->set_session_label(label);
  opened.mutable_opened()->set_sidecar_id(sidecar_.sidecar_id());
  opened.mutable_opened()->set_version(version_);
  opened.mutable_opened()->set_gpu_backend(gpu_backend_);
  // Only a local client can hand over memory: a TCP session gets no fd-channel token.
  const bool may_register = IsUnixBinding(binding) && !fd_channel_path_.empty();
  auto issue_token = [&](v1::FdChannel* channel, uint64_t nonce) {
    channel->set_token(sidecar_.IssueChannelToken(session));
    channel->set_path(fd_channel_path_);
    channel->set_nonce(nonce);
  };
  if (may_register) issue_token(opened.mutable_opened()->mutable_fd_channel(), 0);
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
  LogInfo("session opened", {{"session", label},
                             {"client", first.open().client_name()},
                             {"pid", std::to_string(first.open().pid())},
                             {"peer", context->peer()}});

  try {
    v1::SessionRequest request;
    for (size_t index = 1; stream->Read(&bytes); ++index) {
      request.Clear();
      if (Status parsed = ParseSessionRequest(bytes, index, &request); !parsed.ok()) {
        why = "it sent a malformed message";
        return ToGrpcStatus(parsed.WithContext("session " + label), context);
      }
      switch (request.kind_case()) {
        case v1::SessionRequest::kSubmit:
          SubmitOnStream(self, request.submit(), write);
          break;
        case v1::SessionRequest::kPing: {
          v1::SessionEvent pong;
          pong.set_pong(request.ping());
          write(pong);
          break;
        }
        case v1::SessionRequest::kFdChannelToken: {
          if (!may_register) {
            why = "it asked for an fd-channel token over TCP";
            return ToGrpcStatus(
                Status::PermissionDenied("session " + label +
                                         " is attached over TCP: only local clients on the Unix "
                                         "socket register memory; send tensors inline"),
                context);
          }
          v1::SessionEvent event;
          issue_token(event.mutable_fd_channel(), request.fd_channel_token());
          write(event);
          break;
        }
        case v1::SessionRequest::kOpen:
        case v1::SessionRequest::KIND_NOT_SET:
          why = "it broke the session protocol";
          return ToGrpcStatus(
              Status::InvalidArgument("session " + label + ": message " + std::to_string(index) +
                                      (request.has_open()
                                           ? " is a second `open` (a session opens once)"
                                           : " carries no known kind (expected submit, ping or "
                                             "fd_channel_token)")),
              context);
      }
    }
  } catch (const std::exception& error) {
    // An allocation failure (or any other exception) ends this session, not the sidecar.
    why = std::string("serving it failed: ") + error.what();
    LogError("session failed", {{"session", label}, {"error", error.what()}});
    return ToGrpcStatus(Status::ResourceExhausted("session " + label + " ended: " + why), context);
  }
  if (context->IsCancelled()) why = "the client disconnected";
  return grpc::Status::OK;
}

void SessionService::SubmitOnStream(const SessionRef& session, const v1::CollectiveRequest& request,
                                    const std::function<bool(const v1::SessionEvent&)>& write) {
  const Status accepted = SubmitOrRefuse(sidecar_, session, request,
                                         [write](const v1::SessionEvent& event) { write(event); });
  if (!accepted.ok()) metrics_.CountRefusedCall("Session.Attach", accepted.kind());
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
                                            const v1::RegisterBufferRequest*,
                                            v1::RegisterBufferResponse*) {
  return Answer(metrics_, "Session.RegisterBuffer",
                Status::PermissionDenied(
                    "registration of shared memory by name was removed (it let a client map "
                    "memory it does not hold): a local client passes the memory's file "
                    "descriptor over the session's fd channel (the `fd_channel` of its Attach "
                    "stream's `opened` event; see docs/api.md); a TCP client cannot register "
                    "memory and sends tensors inline"),
                context);
}

grpc::Status SessionService::UnregisterBuffer(grpc::ServerContext* context,
                                              const v1::UnregisterBufferRequest* request,
                                              v1::UnregisterBufferResponse*) {
  return Answer(
      metrics_, "Session.UnregisterBuffer",
      sidecar_.UnregisterBuffer(SessionRef{request->session_id(), SessionBinding(*context)},
                                request->buffer_id()),
      context);
}

}  // namespace collectived
