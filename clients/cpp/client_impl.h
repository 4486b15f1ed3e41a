// Client::Impl: the state of one client session, shared by the parts of the client that each do
// one job: the Attach stream and its reader (client_session.cc), the submission ring and its
// reader (client_ring.cc), the fd channel (fd_channel_client.h), the registered buffers
// (registered_buffers.h), the op handles (client_work.cc), the requests (request_builder.cc) and
// the public calls (client.cc). Internal to the client library.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "clients/cpp/client.h"
#include "clients/cpp/cuda_vmm_registrar.h"
#include "clients/cpp/fd_channel_client.h"
#include "clients/cpp/registered_buffers.h"
#include "clients/cpp/stream_signal_words.h"
#include "collectived/v1/collectives.pb.h"
#include "collectived/v1/group.grpc.pb.h"
#include "collectived/v1/session.grpc.pb.h"
#include "rpc/submission_ring.h"

namespace collectived {
namespace client_detail {

// Deadline of unary calls that do not wait for other ranks (buffers, DestroyGroup): a wedged
// sidecar fails them with a Timeout after this long instead of hanging the trainer.
inline constexpr std::chrono::milliseconds kCallDeadline{60000};
// CreateGroup waits for the rendezvous up to the group's timeout; the slack lets the sidecar's
// own TIMEOUT (which names the missing ranks) arrive before gRPC's deadline fires.
inline constexpr std::chrono::milliseconds kCreateGroupSlack{10000};
// The stream-signal words of a session: blocks for 64 groups (StreamSignalWords).
inline constexpr size_t kSignalBufferBytes = 64 * StreamSignalWords::kWordsPerGroup * 4;
// How long the destructor lets the sidecar close the stream after the half-close.
inline constexpr std::chrono::milliseconds kCloseGrace{5000};

inline std::chrono::system_clock::time_point DeadlineIn(std::chrono::milliseconds timeout) {
  return std::chrono::system_clock::now() + timeout;
}

// "allreduce (client op 7) on group 'g'", for messages.
std::string DescribeWork(std::string_view op, uint64_t client_op_id, const std::string& group);

}  // namespace client_detail

struct Client::Impl {
  using Stream = grpc::ClientReaderWriter<v1::SessionRequest, v1::SessionEvent>;

  ~Impl() { Close(); }

  // Writes one message unless the stream is closed for writing. Returns whether it was written;
  // false means the session is over, and the reader fails whatever was pending.
  bool Write(const v1::SessionRequest& message) {
    std::lock_guard<std::mutex> lock(write_mu);
    if (writes_done || finished) return false;
    return stream->Write(message);
  }

  void ReadLoop();
  // Opens the session's submission ring over the fd channel and starts its reader; on failure
  // the client keeps to the stream (ring_error says why).
  void OpenRing();
  // The session goes without a ring, for reason `why` (ring_error).
  void NoRing(std::string why);
  // Takes the ring's completions until the session or the ring ends; then fails the ops that
  // were submitted through it and are still pending.
  void RingLoop();
  // Keeps a group's collectives in issue order across the ring and the stream (the sidecar
  // numbers them as they arrive and the two paths race): before the first op of one path
  // follows ops of the other, the last of those is awaited (a group's collectives complete in
  // order).
  void Fence(const std::string& group, bool via_ring, const std::shared_ptr<ClientWork>& work);
  void HandleCompletion(const v1::CollectiveResponse& completion);
  // Completes the ops whose completions the sidecar wrote to the ring before it (or the session)
  // went: they are still in the ring's memory, and complete rather than fail.
  void TakeCompletionsLeftInRing();
  void HandlePong(uint64_t nonce);
  // Half-closes the stream, waits for the reader to finish (cancelling after kCloseGrace).
  void Close();

  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Session::Stub> session_stub;
  std::unique_ptr<v1::Groups::Stub> groups_stub;
  grpc::ClientContext attach_context;
  std::unique_ptr<Stream> stream;
  std::thread reader;

  // Written by the reader before `opened` is set, read-only afterwards.
  std::string session_id;
  std::string session_label;
  std::string sidecar_id;
  std::string sidecar_version;
  bool gpu_backend = false;

  // The session's fd channel, connected on the first registration (or the ring's opening).
  std::unique_ptr<FdChannelClient> fd_channel;
  // The session's CUDA VMM allocations registered over the fd channel (cuda_vmm_registrar.h).
  std::unique_ptr<CudaVmmRegistrar> cuda_vmm;

  // The session's stream-signal words, made on the first CUDA collective when wanted
  // (registered with CUDA with that op's `device` current); null once they could not be had
  // (the ops then take the event path).
  std::shared_ptr<StreamSignalWords> SignalWords(int device);
  bool stream_signals_wanted = false;  // set at Connect
  std::once_flag signal_setup;
  std::shared_ptr<StreamSignalWords> signal_words;  // set once by signal_setup
  uint64_t signal_buffer_id = 0;                    // set once by signal_setup

  std::atomic<uint64_t> next_op_id{1};
  std::atomic<uint64_t> next_nonce{1};

  mutable std::mutex mu;
  std::condition_variable cv;
  bool opened = false;            // guarded by mu
  bool reader_done = false;       // guarded by mu
  bool closed_by_client = false;  // guarded by mu
  Status session_status;          // guarded by mu; the reason every op fails once ended
  std::optional<Status> closing;  // guarded by mu; the sidecar's `closing` event
  std::map<uint64_t, std::shared_ptr<ClientWork>> pending;   // guarded by mu
  std::map<uint64_t, std::shared_ptr<Promise<void>>> pings;  // guarded by mu

  std::mutex write_mu;
  bool writes_done = false;  // guarded by write_mu
  bool finished = false;     // guarded by write_mu

  RegisteredBuffers buffers;

  std::unique_ptr<SubmissionRingClient> ring;  // set before ring_reader starts
  std::thread ring_reader;
  std::atomic<bool> ring_usable{false};
  std::string ring_error;  // guarded by mu
  // The ready-event leases of ops a closed ring stranded, kept until the session ends.
  std::vector<OpReadyLeases> retired_leases;  // guarded by mu
  // guarded by mu: the last collective of each group and whether it took the ring.
  std::map<std::string, std::pair<bool, std::shared_ptr<ClientWork>>> last_submit;
};

}  // namespace collectived
