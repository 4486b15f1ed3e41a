#include "services/collectived/collective_calls.h"

#include <memory>
#include <string>

#include "services/collectived/translate.h"

namespace collectived {
namespace {

// The engine op for `request`, checked in the order a submission is checked (shutdown,
// session, group, membership) before its tensors are translated; `frontend_state` keeps the
// translation for the answer.
StatusOr<OpSubmission> Translate(Sidecar& sidecar, const std::string& binding,
                                 const v1::CollectiveRequest& request) {
  SessionRef ref{request.session_id(), binding};
  StatusOr<std::shared_ptr<Session>> session = sidecar.CheckSubmitter(ref, request.group());
  if (!session.ok()) return session.status();
  StatusOr<TranslatedRequest> translated = TranslateRequest(request, **session);
  if (!translated.ok()) return translated.status();
  auto kept = std::make_shared<const TranslatedRequest>(std::move(*translated));
  OpSubmission submission;
  submission.session = std::move(ref);
  submission.group = request.group();
  submission.request = kept->request;
  submission.client_op_id = request.client_op_id();
  submission.held_bytes = kept->inline_bytes;
  submission.frontend_state = kept;
  return submission;
}

const TranslatedRequest& TranslationOf(const SubmittedOp& op) {
  return *std::static_pointer_cast<const TranslatedRequest>(op.frontend_state);
}

}  // namespace

StatusOr<v1::CollectiveResponse> RunCollective(Sidecar& sidecar, const std::string& binding,
                                               const v1::CollectiveRequest& request) {
  StatusOr<OpSubmission> submission = Translate(sidecar, binding, request);
  if (!submission.ok()) return submission.status();
  auto translated = std::static_pointer_cast<const TranslatedRequest>(submission->frontend_state);
  StatusOr<std::shared_ptr<Work>> work = sidecar.Start(std::move(*submission));
  if (!work.ok()) return work.status();
  (void)(*work)->future().Wait();  // the engine completes every op: by success, failure or timeout
  v1::CollectiveResponse response;
  FillResponse(*translated, **work, request.client_op_id(), &response);
  return response;
}

StatusOr<uint64_t> SubmitCollective(Sidecar& sidecar, const std::string& binding,
                                    const v1::CollectiveRequest& request,
                                    SessionEventSink deliver) {
  StatusOr<OpSubmission> submission = Translate(sidecar, binding, request);
  if (!submission.ok()) return submission.status();
  // Only device backends record a completion event: a host op never calls this.
  if (request.stream_ordered() && deliver) {
    submission->request.on_enqueued = [deliver, client_op_id = request.client_op_id(),
                                       group = request.group()](const std::string& event) {
      v1::SessionEvent early;
      v1::CollectiveResponse* response = early.mutable_completion();
      response->set_client_op_id(client_op_id);
      response->set_group(group);
      response->set_enqueued(true);
      response->set_completion_event(event);
      deliver(early);
    };
  }
  StatusOr<std::shared_ptr<const SubmittedOp>> op =
      sidecar.Submit(std::move(*submission), [deliver = std::move(deliver)](const SubmittedOp& op) {
        if (!deliver) return;
        v1::SessionEvent event;
        FillResponse(TranslationOf(op), *op.work, op.client_op_id, event.mutable_completion());
        deliver(event);
      });
  if (!op.ok()) return op.status();
  return (*op)->work->info().sequence_number;
}

Status SubmitOrRefuse(Sidecar& sidecar, const SessionRef& session, v1::CollectiveRequest request,
                      const SessionEventSink& deliver) {
  request.set_session_id(session.id);
  StatusOr<uint64_t> accepted = SubmitCollective(sidecar, session.binding, request, deliver);
  if (accepted.ok()) return Status::Ok();
  v1::SessionEvent event;
  v1::CollectiveResponse* response = event.mutable_completion();
  response->set_client_op_id(request.client_op_id());
  response->set_group(request.group());
  FillError(accepted.status(), response->mutable_error());
  deliver(event);
  return accepted.status();
}

StatusOr<v1::CollectiveResponse> WaitCollective(Sidecar& sidecar, const std::string& binding,
                                                const v1::WaitRequest& request) {
  // On the wire, timeout_ms <= 0 means "no limit".
  const std::chrono::milliseconds timeout =
      request.timeout_ms() > 0 ? std::chrono::milliseconds(request.timeout_ms()) : kWaitForever;
  StatusOr<OpWait> waited =
      sidecar.Wait(SessionRef{request.session_id(), binding}, request.client_op_id(), timeout);
  if (!waited.ok()) return waited.status();
  const SubmittedOp& op = *waited->op;
  v1::CollectiveResponse response;
  if (!op.work->IsCompleted()) {
    response.set_client_op_id(op.client_op_id);
    response.set_group(op.work->info().group);
    response.set_op(op.work->info().op);
    response.set_sequence_number(op.work->info().sequence_number);
    FillError(waited->status, response.mutable_error());
    return response;
  }
  FillResponse(TranslationOf(op), *op.work, op.client_op_id, &response);
  return response;
}

}  // namespace collectived
