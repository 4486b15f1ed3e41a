// The v1 collective calls (Run, Submit, Wait) over the Sidecar: each translates the protobuf
// request into an engine op, calls the facade, and translates the result back. Shared by the
// Collectives service (unary calls) and the Session service (submissions on the stream).
#pragma once

#include <functional>
#include <string>

#include "collectived/v1/collectives.pb.h"
#include "collectived/v1/session.pb.h"
#include "engine/sidecar/sidecar.h"

namespace collectived {

// Delivers an event to the submitting session's stream.
using SessionEventSink = std::function<void(const v1::SessionEvent&)>;

// Every call names its session by the request's session_id and the `binding` of the connection
// it came through (SessionBinding): a session is usable only from the connection that attached
// it (Sidecar::FindSession).

// Runs `request` and waits for it. Returns the response (errors of the op travel in
// response.error); a returned error means the request could not even be accepted (the
// sidecar is shutting down, unknown session or group, a session of another connection
// (PermissionDenied), the session is not a rank of it, a tensor that does not translate).
StatusOr<v1::CollectiveResponse> RunCollective(Sidecar& sidecar, const std::string& binding,
                                               const v1::CollectiveRequest& request);

// Submits `request` asynchronously: returns its sequence number at once; its completion goes
// to `deliver` (unless the session ended first) and can be awaited with WaitCollective.
// Errors as RunCollective.
StatusOr<uint64_t> SubmitCollective(Sidecar& sidecar, const std::string& binding,
                                    const v1::CollectiveRequest& request, SessionEventSink deliver);

// Submits `request` for the session `session` (its session_id is set from it) like
// SubmitCollective, and answers a refused submission through `deliver` as well, with an error
// completion: a submission on the session stream or the submission ring has no other answer.
// Returns OK when accepted, else the refusal (for the caller's metrics).
Status SubmitOrRefuse(Sidecar& sidecar, const SessionRef& session, v1::CollectiveRequest request,
                      const SessionEventSink& deliver);

// Waits for a submitted op (the wire's timeout_ms <= 0 waits without limit). An op still
// running when the wait times out is answered with the Timeout in response.error. Returns
// NotFound if the session has no such op; the errors of Sidecar::FindSession.
StatusOr<v1::CollectiveResponse> WaitCollective(Sidecar& sidecar, const std::string& binding,
                                                const v1::WaitRequest& request);

}  // namespace collectived
