// The session's submission ring (rpc/submission_ring.h): opened over the fd channel, read by a
// thread of its own, and the fence that keeps a group's collectives in issue order across the
// ring and the Attach stream.
#include <unistd.h>

#include "clients/cpp/client_impl.h"
#include "engine/vocabulary/op_traits.h"

namespace collectived {

void Client::Impl::OpenRing() {
  StatusOr<int> ring_fd = fd_channel->OpenRing();
  std::string why;
  if (ring_fd.ok()) {
    ring = SubmissionRingClient::Attach(*ring_fd, &why);
    close(*ring_fd);
  } else {
    why = ring_fd.status().message();
  }
  if (!ring) {
    std::lock_guard<std::mutex> lock(mu);
    ring_error = why;
    return;
  }
  ring_usable = true;
  ring_reader = std::thread([this] { RingLoop(); });
}

void Client::Impl::NoRing(std::string why) {
  std::lock_guard<std::mutex> lock(mu);
  ring_error = std::move(why);
}

void Client::Impl::RingLoop() {
  std::string payload;
  v1::CollectiveResponse completion;
  std::string why;
  for (;;) {
    const RingWaitResult next = ring->NextCompletion(&payload, std::chrono::milliseconds(100));
    if (next == RingWaitResult::kClosed) {
      why = ring->reason();
      break;
    }
    bool closing_here;
    {
      std::lock_guard<std::mutex> lock(mu);
      closing_here = closed_by_client;
    }
    if (closing_here) break;  // what is pending fails as the stream's pending ops do
    if (next == RingWaitResult::kOk) {
      if (!completion.ParseFromString(payload)) {
        why = "the sidecar wrote a completion that is not a CollectiveResponse";
        break;
      }
      HandleCompletion(completion);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (reader_done) {
        why = "the session ended";
        break;
      }
    }
    if (fd_channel->Gone()) {
      why = "the sidecar closed the session's fd channel (it went away)";
      break;
    }
  }
  if (!why.empty()) TakeCompletionsLeftInRing();  // they complete rather than fail as stranded
  std::vector<std::shared_ptr<ClientWork>> stranded;
  Status failure;
  bool session_goes_on = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    ring_usable = false;
    session_goes_on = !closed_by_client;
    if (closed_by_client) {
      why = "the client closed its session";
      failure = Status::Aborted("the client closed its session to " + address +
                                " before the op completed");
    } else {
      failure = Status::Unavailable("the submission ring of session " + session_label +
                                    " closed with the op in flight: " + why);
    }
    ring_error = why;
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->second->via_ring()) {
        stranded.push_back(std::move(it->second));
        it = pending.erase(it);
      } else {
        ++it;
      }
    }
  }
  if (session_goes_on) {
    // The session may go on over its stream, and the sidecar still enqueue ops it took from the
    // ring: their ready events stay leased until the session ends (see ReadyEventLease).
    std::lock_guard<std::mutex> lock(mu);
    for (auto& work : stranded) retired_leases.push_back(work->TakeReadyEvents());
  }
  for (auto& work : stranded) work->Fail(failure);
}

void Client::Impl::TakeCompletionsLeftInRing() {
  std::string payload;
  v1::CollectiveResponse completion;
  while (ring->TryNextCompletion(&payload) == RingWaitResult::kOk &&
         completion.ParseFromString(payload)) {
    HandleCompletion(completion);
  }
}

void Client::Impl::Fence(const std::string& group, bool via_ring,
                         const std::shared_ptr<ClientWork>& work) {
  if (IsPointToPoint(work->type())) return;  // not in the group's sequence
  std::shared_ptr<ClientWork> before;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& last = last_submit[group];
    if (last.second != nullptr && last.first != via_ring) before = std::move(last.second);
    last = {via_ring, work};
  }
  if (before != nullptr) static_cast<void>(before->Wait());
}

}  // namespace collectived
