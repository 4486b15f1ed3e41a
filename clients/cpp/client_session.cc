// The session's Attach stream: its reader (SessionOpened, completions, pongs, the sidecar's
// closing), the writes, and the close.
#include "clients/cpp/client_impl.h"
#include "engine/vocabulary/logging.h"
#include "rpc/grpc_status.h"

namespace collectived {

void Client::Impl::ReadLoop() {
  v1::SessionEvent event;
  Status protocol_error;
  bool first = true;
  while (stream->Read(&event)) {
    if (first) {
      first = false;
      if (!event.has_opened()) {
        protocol_error = Status::Internal("the sidecar at " + address +
                                          " did not start the session with SessionOpened");
        attach_context.TryCancel();
        continue;  // drain until the cancellation ends the stream
      }
      std::lock_guard<std::mutex> lock(mu);
      session_id = event.opened().session_id();
      session_label = event.opened().session_label();
      sidecar_id = event.opened().sidecar_id();
      sidecar_version = event.opened().version();
      gpu_backend = event.opened().gpu_backend();
      fd_channel->SetSession(event.opened().fd_channel().token(), session_label);
      opened = true;
      cv.notify_all();
      continue;
    }
    if (!protocol_error.ok()) continue;
    switch (event.kind_case()) {
      case v1::SessionEvent::kCompletion:
        HandleCompletion(event.completion());
        break;
      case v1::SessionEvent::kPong:
        HandlePong(event.pong());
        break;
      case v1::SessionEvent::kClosing: {
        std::lock_guard<std::mutex> lock(mu);
        Status why = client_internal::StatusFromProto(event.closing());
        if (why.ok()) why = Status::Aborted("the sidecar ended the session");
        closing = why;
        break;
      }
      default:
        // A second `opened`, or an event kind newer than this client: nothing to act on.
        LogDebug("ignoring a session event", {{"kind", std::to_string(event.kind_case())}});
        break;
    }
  }

  grpc::Status final_status;
  {
    std::lock_guard<std::mutex> lock(write_mu);
    finished = true;
    final_status = stream->Finish();
  }

  // Completions the sidecar wrote to the ring before the session went are still in the ring's
  // memory: they complete their ops rather than fail them with the session.
  bool taking;
  {
    std::lock_guard<std::mutex> lock(mu);
    taking = !closed_by_client;
  }
  if (taking && ring_usable.load()) TakeCompletionsLeftInRing();  // set once `ring` is

  std::map<uint64_t, std::shared_ptr<ClientWork>> orphans;
  std::map<uint64_t, std::shared_ptr<Promise<void>>> orphan_pings;
  Status why;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (closed_by_client) {
      why = Status::Aborted("the client closed its session to " + address +
                            " before the op completed");
    } else if (closing.has_value()) {
      why = Status(closing->kind(),
                   "session to " + address + " closed by the sidecar: " + closing->message());
    } else if (!protocol_error.ok()) {
      why = protocol_error;
    } else if (!opened) {
      // A refusal keeps its kind (a share used up, a credential refused): the caller can tell
      // it from a sidecar that is not there.
      const Status refused = FromGrpcStatus(final_status);
      const ErrorKind kind = refused.kind();
      const bool refusal =
          kind == ErrorKind::kResourceExhausted || kind == ErrorKind::kPermissionDenied ||
          kind == ErrorKind::kUnauthenticated || kind == ErrorKind::kInvalidArgument;
      why =
          Status(refusal ? kind : ErrorKind::kUnavailable,
                 "cannot open a session with the sidecar at " + address + ": " + refused.message());
    } else {
      why = Status::Unavailable("session to " + address + " lost: " +
                                (final_status.ok() ? std::string("the sidecar closed the stream")
                                                   : FromGrpcStatus(final_status).message()));
    }
    session_status = why;
    reader_done = true;
    orphans.swap(pending);
    orphan_pings.swap(pings);
  }
  cv.notify_all();
  for (auto& [id, work] : orphans) work->Fail(why);
  for (auto& [nonce, ping] : orphan_pings) ping->SetError(why);
}

void Client::Impl::HandleCompletion(const v1::CollectiveResponse& completion) {
  std::shared_ptr<ClientWork> work;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = pending.find(completion.client_op_id());
    if (completion.enqueued()) {
      // Not the op's completion: its GPU work is enqueued; the completion follows.
      if (it != pending.end()) it->second->MarkEnqueued(completion.completion_event());
      return;
    }
    if (it != pending.end()) {
      work = std::move(it->second);
      pending.erase(it);
    }
  }
  if (work == nullptr) {
    LogWarning("completion for an op this client is not waiting for",
               {{"client_op_id", std::to_string(completion.client_op_id())},
                {"group", completion.group()},
                {"op", completion.op()}});
    return;
  }
  // Outside the lock: this writes inline results and runs the work's callbacks.
  work->CompleteFrom(completion);
}

void Client::Impl::HandlePong(uint64_t nonce) {
  std::shared_ptr<Promise<void>> ping;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = pings.find(nonce);
    if (it == pings.end()) return;  // its Ping already timed out
    ping = std::move(it->second);
    pings.erase(it);
  }
  ping->SetValue();
}

void Client::Impl::Close() {
  if (reader.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu);
      closed_by_client = true;
    }
    {
      std::lock_guard<std::mutex> lock(write_mu);
      if (!writes_done && !finished) stream->WritesDone();
      writes_done = true;
    }
    {
      std::unique_lock<std::mutex> lock(mu);
      if (!cv.wait_for(lock, client_detail::kCloseGrace, [this] { return reader_done; })) {
        lock.unlock();
        attach_context.TryCancel();
      }
    }
    reader.join();
  }
  if (ring_reader.joinable()) ring_reader.join();  // it sees the session end within 100 ms
  ring.reset();
  fd_channel->Close();
  // After the session: the sidecar releases its mappings when the session ends.
  buffers.Clear();
  std::vector<OpReadyLeases> retired;
  {
    std::lock_guard<std::mutex> lock(mu);
    retired.swap(retired_leases);
  }
}

}  // namespace collectived
