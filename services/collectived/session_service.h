// The Session gRPC service: Attach (the session's lifetime is the stream's; completions of
// asynchronous ops travel back on it) and shared-memory buffer registration.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "collectived/v1/session.grpc.pb.h"
#include "engine/sidecar/sidecar.h"
#include "services/collectived/metrics.h"

namespace collectived {

// A session is bound to the connection of its Attach stream (SessionBinding); UnregisterBuffer
// from another connection is refused with PERMISSION_DENIED and counted in `metrics`.
// RegisterBuffer (by name) is always refused: memory arrives over the fd channel
// (FdChannelServer), whose tokens the Attach stream hands out.
class SessionService final : public v1::Session::Service {
 public:
  // `fd_channel_path` is where local sessions register memory (empty: nowhere); sessions
  // attached over the Unix socket get a one-time token for it, TCP sessions none.
  SessionService(Sidecar& sidecar, Metrics& metrics, std::string version, bool gpu_backend,
                 std::string fd_channel_path);

  grpc::Status RegisterBuffer(grpc::ServerContext* context,
                              const v1::RegisterBufferRequest* request,
                              v1::RegisterBufferResponse* response) override;
  grpc::Status UnregisterBuffer(grpc::ServerContext* context,
                                const v1::UnregisterBufferRequest* request,
                                v1::UnregisterBufferResponse* response) override;

  // Tells every attached client why its session ends (a `closing` event), then ends the streams
  // so the server can stop without waiting for them.
  void Shutdown(const Status& reason);

  // Writes `event` on the Attach stream of the session whose secret id is `session_id` (a call
  // of that session was accepted); does nothing once that stream ended.
  void Deliver(const std::string& session_id, const v1::SessionEvent& event);

 private:
  using RawSessionStream = grpc::ServerReaderWriter<v1::SessionEvent, grpc::ByteBuffer>;

  // The session's lifetime: the first message must be `open`; then submissions and pings until
  // the client closes. A malformed message or a broken protocol ends the stream with
  // INVALID_ARGUMENT; an exception while serving it ends only this session.
  grpc::Status AttachRaw(grpc::ServerContext* context, RawSessionStream* stream);
  // Submits an op received on the stream of `session` (the stream's own session and binding);
  // a refusal is answered on the stream as a completion.
  void SubmitOnStream(const SessionRef& session, const v1::CollectiveRequest& request,
                      const std::function<bool(const v1::SessionEvent&)>& write);

  Sidecar& sidecar_;
  Metrics& metrics_;
  const std::string version_;
  const bool gpu_backend_;
  const std::string fd_channel_path_;

  struct Stream {
    grpc::ServerContext* context;
    std::function<bool(const v1::SessionEvent&)> write;
  };
  std::mutex mutex_;
  std::map<std::string, Stream> streams_;  // guarded by mutex_; live Attach streams by session
  Status shutdown_;                        // guarded by mutex_
};

}  // namespace collectived
