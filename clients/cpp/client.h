// Client: a trainer's session with its local collectived sidecar. It keeps the session open (the
// Session.Attach stream), registers shared-memory buffers, creates process groups and runs c10d
// collectives on them; every collective returns a ClientWork handle at once.
//
// Synchronous use is the asynchronous call followed by Wait():
//
//   auto client = collectived::Client::Connect();             // $COLLECTIVED_ADDRESS or the socket
//   auto buffer = (*client)->AllocateBuffer(n * sizeof(float));
//   ... fill (*buffer)->data() ...
//   auto tensor = ClientTensor::Shm(**buffer, 0, DType::kFloat32, n);
//   Status s = (*client)->AllReduce("g", tensor, ReduceOp::Sum())->Wait();
//
// CUDA tensors (ClientTensor::Cuda) go to groups created with GroupOptions::cuda_device, on a
// sidecar built with the GPU backend, over its Unix socket.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "clients/cpp/cuda_tensor_export.h"
#include "clients/cpp/shm_buffer.h"
#include "clients/cpp/stream_signal_words.h"
#include "engine/vocabulary/dtype.h"
#include "engine/vocabulary/op.h"
#include "engine/vocabulary/reduce_op.h"
#include "engine/vocabulary/status.h"
#include "engine/vocabulary/work.h"
#include "rpc/limits.h"
#include "rpc/tls.h"

namespace grpc {
class Channel;
}  // namespace grpc

namespace collectived {

namespace v1 {
class CollectiveRequest;
class CollectiveResponse;
class Error;
}  // namespace v1

// A shared-memory buffer registered with the sidecar of a session (its memfd was passed over the
// fd channel): the sidecar has mapped it and knows it as `buffer_id`. Created and owned by
// Client::AllocateBuffer.
class CudaVmmRegistrar;
class Store;

struct RegisteredBuffer {
  std::unique_ptr<ShmBuffer> shm;
  uint64_t buffer_id = 0;  // ShmRef.buffer_id; valid only in the session that registered it

  std::byte* data() const { return shm->data(); }
  size_t size() const { return shm->size(); }
};

// One tensor argument of a collective: dtype, element count and where its bytes are: a range of
// a RegisteredBuffer (zero-copy: the sidecar reads and writes it in place), CUDA device memory
// (the sidecar opens its allocation through CUDA IPC and works on it in place, in a CUDA group),
// or caller memory whose bytes travel in the request and, for outputs, are written back from the
// response. The caller keeps that memory alive and untouched until the op's work completes.
struct ClientTensor {
  DType dtype = DType::kUnspecified;
  size_t count = 0;
  const RegisteredBuffer* shm = nullptr;  // zero-copy: bytes [offset, offset + bytes()) of shm
  size_t offset = 0;
  void* host = nullptr;  // inline: count * DTypeSize(dtype) bytes of caller memory
  // CUDA: count * DTypeSize(dtype) bytes of device memory of `cuda_device` (cudaMalloc'd, or
  // from an allocator built on it; not managed nor VMM memory), produced by work on
  // `cuda_stream` (a cudaStream_t; nullptr = the legacy default stream): the sidecar's work on it
  // is ordered after what was queued there when the op was submitted.
  void* cuda = nullptr;
  int cuda_device = -1;
  void* cuda_stream = nullptr;
  std::vector<int64_t> shape;  // informational (flight recorder, messages); empty = 1-D

  // `count` elements of `dtype` at byte `offset` of `buffer`.
  static ClientTensor Shm(const RegisteredBuffer& buffer, size_t offset, DType dtype, size_t count);
  // `count` elements of `dtype` at `data`.
  static ClientTensor Inline(void* data, DType dtype, size_t count);
  // `count` elements of `dtype` at device pointer `data` of CUDA device `device`, ordered after
  // the work queued on `stream`.
  static ClientTensor Cuda(void* data, int device, DType dtype, size_t count,
                           void* stream = nullptr);

  // Whether the bytes travel in the request and response (neither shared memory nor CUDA).
  bool is_inline() const { return shm == nullptr && cuda == nullptr; }

  // count * DTypeSize(dtype) (0 for an unspecified dtype); saturates at SIZE_MAX on overflow.
  size_t bytes() const;
};

// kMaxInlineBytes (rpc/limits.h) bounds the inline bytes of one request and of its response: use
// a RegisteredBuffer for big tensors.

// The collective an op runs: the engine's op kinds (engine/vocabulary/op.h); OpKindName gives
// torch's spelling ("allreduce", "alltoall_single", ...).
using CollectiveType = OpKind;

// One collective, as Client::Submit takes it. The tensors each type takes (n = group size) are
// the engine's OpRequest's, listed once in engine/vocabulary/op_traits.h
// (TraitsOf(type).inputs/.outputs); the in-place types (TraitsOf(type).in_place: allreduce,
// allreduce_coalesced, broadcast, reduce) take their tensors as inputs. Inline inputs (and in-place
// tensors) send their bytes; inline outputs send only dtype and count and receive the result.
struct CollectiveArgs {
  CollectiveType type = CollectiveType::kBarrier;
  std::vector<ClientTensor> inputs;
  std::vector<ClientTensor> outputs;
  ReduceOp reduce_op;                    // reducing ops only
  int root = 0;                          // group rank; broadcast, reduce, gather, scatter
  int peer = -1;                         // group rank; send, recv
  int64_t tag = 0;                       // send, recv
  std::vector<uint64_t> input_splits;    // alltoall_single, in elements; empty = equal
  std::vector<uint64_t> output_splits;   // alltoall_single, in elements; empty = equal
  std::chrono::milliseconds timeout{0};  // 0 = the group's timeout
};

// What Client::CreateGroup learned about the group (Groups.CreateGroup's response).
struct GroupInfo {
  std::string name;
  int group_rank = -1;
  int group_size = 0;
  std::vector<int> members;            // sorted global ranks
  std::vector<int> local_group_ranks;  // group ranks hosted by this sidecar
  int num_sidecars = 0;
  uint64_t sequence_number = 0;  // 0 for a new group
  // Joined a running shrinking group as the replacement of a lost rank (docs/fault-tolerance.md):
  // its first op is the group's next one; its state must come from a live rank.
  bool replacement = false;
  int epoch = 0;  // the group's membership epoch
};

// What Client::Replacements does before it lists the lost ranks whose replacement waits.
enum class ReplacementAction { kList, kAccept, kAdmit };

// How to join a group (Groups.CreateGroup). Every member rank calls CreateGroup with the same
// name, world_size, members, store and token.
struct GroupOptions {
  std::string name;  // unique among the job's live groups
  int rank = -1;     // the caller's global rank, in [0, world_size)
  int world_size = 0;
  std::vector<int> members;   // global ranks of a subgroup; empty = all of [0, world_size)
  std::string store_address;  // host:port of the rendezvous store; empty = the local sidecar
  std::string store_prefix;   // key prefix of the rendezvous in that store
  std::chrono::milliseconds timeout{0};  // ops' default and the rendezvous'; 0 = 30 minutes
  std::string job_token;                 // optional shared secret of the job's members
  // -1: a CPU group (Gloo). A CUDA device ordinal: a CUDA group (NCCL) whose tensors are
  // ClientTensor::Cuda on that device; every member gives one.
  int cuda_device = -1;
  // What the group does when it loses a rank (docs/fault-tolerance.md); every member must ask
  // for the same. Shrink: it goes on among the live ranks, down to `min_ranks`.
  bool shrink = false;
  int min_ranks = 1;
};

// How a rank that is not torch joins a process group that torch trainers create on the
// "collectived" backend (init_process_group("collectived", store=collectived.torch.Store(...))):
// rank 0's backend publishes the group's name and rendezvous store in torch's store
// (rpc/torch_names.h).
struct TorchJoin {
  std::shared_ptr<Store> store;    // the store torch was given (no prefix of its own)
  std::string group_prefix = "0";  // torch's prefix of the group's keys ("0": the default group)
  int rank = -1;                   // this rank's global rank
  int world_size = 0;
  // The counter of torch's store-based barrier that ends init_process_group
  // ("store_based_barrier_key:1" in torch 1.13): this rank adds itself. Empty: no barrier.
  std::string barrier_key;
  std::chrono::milliseconds timeout{0};  // the group's default op timeout; 0 = 30 minutes
  std::string job_token;                 // the job's token, as the trainers present it
};

// The handle of one submitted collective (like c10d's Work).
//
// Thread-safety: safe for concurrent use from any number of threads. It does not refer to the
// Client, so it may outlive it (a work pending when its Client is destroyed fails with Aborted).
class ClientWork {
 public:
  // Created by Client::Submit; `writeback` are the tensors that receive inline results.
  ClientWork(std::string group, CollectiveType type, uint64_t client_op_id,
             std::vector<ClientTensor> writeback);
  ClientWork(const ClientWork&) = delete;
  ClientWork& operator=(const ClientWork&) = delete;

  const std::string& group() const { return group_; }
  CollectiveType type() const { return type_; }
  std::string_view op() const { return OpKindName(type_); }
  uint64_t client_op_id() const { return client_op_id_; }

  // Returns true once the op has completed, successfully or not. Never blocks.
  bool IsCompleted() const { return future_.IsReady(); }
  // Whether the op was submitted through the submission ring (else the Attach stream).
  bool via_ring() const { return via_ring_; }

  // Blocks until the op completes, or at most `timeout` (a negative one polls). Returns OK
  // when the op succeeded (inline outputs have then been written to caller memory), the op's
  // error when it failed (the sidecar's kind and message: Timeout, PeerLost, Desync, ...;
  // Unavailable when the session was lost), and when `timeout` passes first a Timeout
  // ("Timeout: allreduce (client op 7) on group 'g' Timed out: it did not complete within
  // 100 ms; ...")
  // that leaves the op running: a later Wait may still succeed. Without `timeout` it relies on
  // the sidecar, which fails every op once its own timeout passes.
  Status Wait(std::optional<std::chrono::milliseconds> timeout = std::nullopt) const;

  // c10d's Work.wait() on CUDA: makes `cuda_stream` (a cudaStream_t of the op's device;
  // nullptr = the legacy default stream) wait for the op's results, blocking the CPU only
  // until the sidecar has enqueued the op's GPU work (not until it ran), or with stream signals
  // (ClientOptions::stream_signals) not at all: the stream waits on the op's word. Returns the op's
  // error when it failed before that; a failure afterwards shows in status() and future(), and
  // fails the group's next ops. Ops on host memory, and ops already completed, wait as Wait().
  // `timeout` bounds the CPU wait as in Wait().
  Status WaitStream(void* cuda_stream,
                    std::optional<std::chrono::milliseconds> timeout = std::nullopt) const;

  // Whether WaitStream waits on a stream-signal word (a CUDA collective of a client with
  // stream signals, which got a word) rather than on the sidecar's event.
  bool has_stream_signal() const { return signal_words_ != nullptr; }

  // The op's error once it has failed; OK while pending or after success. Never blocks.
  Status status() const { return future_.status(); }
  // Same as status(); named after c10d's Work::exception().
  Status exception() const { return status(); }

  // Completes when the op does (after inline outputs have been written back).
  Future<void> future() const { return future_; }
  // Same contract as Future::AddCallback. Callbacks of ops completed by the sidecar run on the
  // Client's reader thread: they must be short and must neither wait for another work of the
  // same Client nor destroy it (that thread delivers every completion).
  void AddCallback(std::function<void(const Status&)> callback) const {
    future_.AddCallback(std::move(callback));
  }

  // The op's sequence number in its group, as the sidecar assigned it. Known only once the op
  // has completed (the Attach stream acknowledges an op with its completion); 0 before, for
  // send/recv, and for ops rejected before they got one.
  uint64_t sequence_number() const;
  // A shrinking group's membership epoch the op ran in and that epoch's first sequence number,
  // once completed (0 and 1 otherwise). A step whose first op's sequence number is below its
  // last op's epoch_first_sequence_number() ran in more than one membership.
  int epoch() const;
  uint64_t epoch_first_sequence_number() const;
  // Recv: the group rank the data came from, once completed; -1 otherwise.
  int source_rank() const;
  // The bytes of results the sidecar sent back in its response (inline tensors' results, copied
  // into them), once completed: 0 when every result was written in place (shared memory).
  uint64_t inline_result_bytes() const;
  // Time from the sidecar accepting the op to its completion on this rank; 0 until completed.
  std::chrono::microseconds duration() const;

 private:
  friend class Client;

  // Completes from the sidecar's response: writes inline outputs back, then completes the
  // future with the response's error (or a write-back failure). Returns false if the work had
  // already completed (nothing is written then).
  bool CompleteFrom(const v1::CollectiveResponse& response);
  // Fails the work with `status` unless it has already completed.
  bool Fail(Status status);
  // A CUDA op's early response: its GPU work is enqueued, after it the sidecar's event.
  void MarkEnqueued(const std::string& completion_event);
  // The Timeout of a wait that ended before the op did.
  Status WaitTimedOut(std::chrono::milliseconds timeout) const;

  // Sets the op's stream-signal word (if it has one) as the op completes.
  void ReleaseSignal(bool succeeded);
  // Gives back the leased ready events (the sidecar waited on them, or never will).
  void ReleaseReadyEvents();
  // Hands them over instead: an op stranded by a closed ring may still be enqueued by the
  // sidecar while the session lasts, so its leases are kept until then.
  OpReadyLeases TakeReadyEvents();

  const std::string group_;
  const CollectiveType type_;
  const uint64_t client_op_id_;
  const std::vector<ClientTensor> writeback_;
  bool via_ring_ = false;  // set before the op is submitted
  int cuda_device_ = -1;   // the device of a CUDA op's tensors (set before it is submitted)
  // A CUDA collective's stream-signal word (set before it is submitted), or none.
  std::shared_ptr<StreamSignalWords> signal_words_;
  // The leased ready events of its CUDA tensors (set before it is submitted), given back once
  // the sidecar waited on them (enqueued) or never will (completed).
  OpReadyLeases ready_leases_;  // guarded by mu_ once submitted
  StreamSignalWords::Assigned signal_;

  mutable std::condition_variable enqueued_cv_;  // completion_event_ set, or completing_
  std::string completion_event_;                 // guarded by mu_; a CUDA op's, once enqueued

  mutable std::mutex mu_;
  bool completing_ = false;                // guarded by mu_; the first completion wins
  uint64_t sequence_number_ = 0;           // guarded by mu_
  int epoch_ = 0;                          // guarded by mu_
  uint64_t epoch_first_sequence_ = 1;      // guarded by mu_
  int source_rank_ = -1;                   // guarded by mu_
  uint64_t inline_result_bytes_ = 0;       // guarded by mu_
  std::chrono::microseconds duration_{0};  // guarded by mu_

  Promise<void> promise_;
  const Future<void> future_;
};

// How to reach the sidecar and how long to try.
struct ClientOptions {
  std::string address;      // see rpc/address.h; empty = $COLLECTIVED_ADDRESS or default
  std::string client_name;  // for the sidecar's logs and admin API; empty = "pid N on HOST"
  // Bound on Connect: reaching the sidecar and receiving SessionOpened.
  std::chrono::milliseconds connect_timeout{10000};
  // false: fail at once when nothing listens at the address (the sidecar is not running).
  // true: keep retrying until connect_timeout (the sidecar may still be starting).
  bool wait_for_sidecar = false;
  // TLS to a TCP address (ignored for a Unix socket): nullopt = from the environment
  // (TlsClientOptions::FromEnvironment: $COLLECTIVED_TLS_CA, _CERT, _KEY, _PEER_NAME); a value
  // with no files = plaintext.
  std::optional<TlsClientOptions> tls;
  // Submit collectives through the session's submission ring (rpc/submission_ring.h) when the
  // sidecar is on a Unix socket and the op's request and inline results fit in
  // kRingInlineLimit; the Attach stream otherwise. $COLLECTIVED_RING=0 turns it off too.
  bool use_ring = true;
  // CUDA collectives: WaitStream makes the stream wait on a word that the sidecar's stream
  // writes when the op is done (StreamSignalWords; cuStreamWaitValue32), instead of first
  // waiting on the CPU for the sidecar's response that names its completion event. nullopt =
  // $COLLECTIVED_STREAM_WAIT ("signal" or "event"; default "event" until the sidecar's
  // point-to-point staging without CPU waits has run on a GPU, see docs/gpu.md). Falls back to
  // the event path where the driver refuses.
  std::optional<bool> stream_signals;
};

// Ops whose request and inline results each fit in this many bytes may take the ring.
inline constexpr size_t kRingInlineLimit = size_t{128} << 10;

// A session with one sidecar.
//
// Thread-safety: a Client is safe for concurrent use from multiple threads without external
// synchronization; ops may be submitted from several threads at once (their order on the stream,
// which is the order the sidecar sees, is the order in which the Submit calls write it). The
// destructor must not run concurrently with other calls, nor on the reader thread (from a
// ClientWork callback).
class Client {
 public:
  // Connects to the sidecar (`address` or, when empty, ResolveSidecarAddress()), opens the
  // Attach stream and waits for SessionOpened. Returns the client on success. Returns
  // InvalidArgument for a malformed address; Unavailable naming the address when nothing
  // answers there ("is collectived running?"), when the session cannot be opened, or when
  // SessionOpened does not arrive within options.connect_timeout. Never hangs past that bound.
  static StatusOr<std::unique_ptr<Client>> Connect(const std::string& address = "",
                                                   std::string client_name = "");
  static StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // Ends the session: half-closes the stream and waits (a few seconds at most, then cancels)
  // for the sidecar to close it; ops still pending fail with Aborted. Then unmaps the buffers;
  // the sidecar releases its own mappings when the session ends.
  ~Client();

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const std::string& address() const;
  // From SessionOpened. The session id is a secret (whoever holds it could use the session from
  // this connection): show session_label() instead.
  const std::string& session_id() const;
  const std::string& session_label() const;
  // The gRPC channel of the session's connection: a call that names the session must come
  // through it (a session is usable only from the connection that attached it). For raw calls
  // of the API that the client does not wrap.
  std::shared_ptr<grpc::Channel> channel() const;
  const std::string& sidecar_id() const;
  const std::string& sidecar_version() const;
  bool sidecar_has_gpu_backend() const;
  // The host:port under which the sidecar's peers reach it (Admin.GetInfo's advertise_address):
  // what a group's first rank offers the others as the rendezvous store. The sidecar's error
  // otherwise.
  StatusOr<std::string> SidecarAdvertiseAddress();

  // OK while the session is alive; once it has ended, the error every later op fails with
  // (Unavailable "session to <address> lost: ...", or the sidecar's `closing` error).
  Status session_status() const;
  // Why collectives go over the session stream only: empty while the session has a submission
  // ring (a TCP session has none, nor one whose ring closed or was turned off).
  std::string ring_error() const;

  // Creates a sealed memfd buffer of `bytes` bytes (ShmBuffer::Create) and hands its file
  // descriptor to the sidecar over the session's fd channel (connected and bound with the
  // session's one-time token on first use). Returns the buffer, owned by the Client and valid
  // until FreeBuffer or destruction. Errors: ShmBuffer::Create's; PermissionDenied for a session
  // over TCP (only local clients hand memory over: send tensors inline); the sidecar's
  // (Unavailable when the session or the channel is gone). The memory has no name: nothing is
  // left in /dev/shm when either process dies.
  StatusOr<const RegisteredBuffer*> AllocateBuffer(size_t bytes);

  // Registers the first `bytes` bytes of the caller's shared-memory file `fd` (a memfd, a file
  // of /dev/shm: memory the caller already uses, such as a torch storage moved into shared
  // memory) with the sidecar, and maps it here too; the caller keeps `fd`. Tensors in the buffer
  // travel zero-copy. Errors: ShmBuffer::Map's, then AllocateBuffer's. FreeBuffer gives it back.
  StatusOr<const RegisteredBuffer*> RegisterFd(int fd, size_t bytes);

  // Unregisters and unmaps `buffer`; `buffer` is invalid after the call whatever it returns.
  // Ops already submitted on it keep the sidecar's mapping until they finish, but results that
  // land in it after this call are lost. Returns OK, InvalidArgument for a buffer this client does
  // not own (nothing is freed then), or the sidecar's error (the local memory is freed anyway).
  Status FreeBuffer(const RegisteredBuffer* buffer);

  // Joins this rank to a group; returns when every member's sidecar has met (the sidecar's
  // TIMEOUT names the missing ranks). Returns the group's description on success,
  // InvalidArgument for an empty name or negative timeout, and otherwise the sidecar's error.
  StatusOr<GroupInfo> CreateGroup(const GroupOptions& options);

  // Joins the torch group `join` describes: reads its bootstrap record (waiting for rank 0 to
  // write it, up to the store's timeout), joins as join.rank and checks in at torch's barrier.
  // Returns the group's description (its `name` is the group's name in the sidecars, for the
  // collectives); InvalidArgument without a store or for a malformed record; the store's or
  // CreateGroup's error otherwise.
  StatusOr<GroupInfo> JoinTorchGroup(const TorchJoin& join);

  // Leaves the group; this rank's pending ops on it fail with Aborted. Returns OK or the
  // sidecar's error (NotFound for an unknown group).
  Status DestroyGroup(const std::string& name);

  // Replacements of lost ranks in shrinking group `group` (Groups.Replacements): kAccept says
  // the job admits them (until then a replacement is refused at once), kAdmit admits `joiners`
  // after this rank's last op `after_sequence` (every live rank at the same step boundary); then
  // the lost group ranks whose replacement waits. The sidecar's error otherwise.
  StatusOr<std::vector<int>> Replacements(const std::string& group, ReplacementAction action,
                                          uint64_t after_sequence = 0,
                                          const std::vector<int>& joiners = {});

  // Submits `args` on group `group` through the Attach stream and returns its work at once.
  // Never returns null: an op rejected before it reaches the sidecar (a malformed tensor, a
  // buffer this client did not allocate or has freed, too many inline bytes, a lost session)
  // returns a work that has already failed, with InvalidArgument (naming the op, the group and
  // the tensor) or the session's error.
  // Caller memory of inline tensors must stay valid until the work completes.
  std::shared_ptr<ClientWork> Submit(const std::string& group, CollectiveArgs args);

  // The collectives of c10d; each builds CollectiveArgs (layouts above) and calls Submit.
  // Synchronous use: op(...)->Wait(). `timeout` 0 = the group's timeout. Ranks are group ranks.
  std::shared_ptr<ClientWork> AllReduce(const std::string& group, ClientTensor tensor,
                                        ReduceOp op = ReduceOp::Sum(),
                                        std::chrono::milliseconds timeout = {});
  std::shared_ptr<ClientWork> AllReduceCoalesced(const std::string& group,
                                                 std::vector<ClientTensor> tensors,
                                                 ReduceOp op = ReduceOp::Sum(),
                                                 std::chrono::milliseconds timeout = {});
  std::shared_ptr<ClientWork> Broadcast(const std::string& group, ClientTensor tensor, int root,
                                        std::chrono::milliseconds timeout = {});
  std::shared_ptr<ClientWork> Reduce(const std::string& group, ClientTensor tensor, int root,
                                     ReduceOp op = ReduceOp::Sum(),
                                     std::chrono::milliseconds timeout = {});
  std::shared_ptr<ClientWork> AllGather(const std::string& group, ClientTensor input,
                                        std::vector<ClientTensor> outputs,
                                        std::chrono::milliseconds timeout = {});
  std::shared_ptr<ClientWork> AllGatherIntoTensor(const std::string& group, ClientTensor input,
                                                  ClientTensor output,
                                                  std::chrono::milliseconds timeout = {});
  std::shared_ptr<ClientWork> AllGatherCoalesced(const std::string& group,
                                                 std::vector<ClientTensor> inputs,
                                                 std::vector<ClientTensor> outputs,
                                                 std::chrono::milliseconds timeout = {});
  std::shared_ptr<ClientWork> ReduceScatter(const std::string& group,
                                            std::vector<ClientTensor> inputs, ClientTensor output,
                                            ReduceOp op = ReduceOp::Sum(),
                                            std::chrono::milliseconds timeout = {});
  std::shared_ptr<ClientWork> ReduceScatterTensor(const std::string& group, ClientTensor input,
                                                  ClientTensor output,
                                                  ReduceOp op = ReduceOp::Sum(),
                                                  std::chrono::milliseconds timeout = {});
  std::shared_ptr<ClientWork> AllToAll(const std::string& group, std::vector<ClientTensor> inputs,
                                       std::vector<ClientTensor> outputs,
                                       std::chrono::milliseconds timeout = {});
  // Splits are in elements; empty = equal splits.
  std::shared_ptr<ClientWork> AllToAllSingle(const std::string& group, ClientTensor input,
                                             ClientTensor output,
                                             std::vector<uint64_t> input_splits = {},
                                             std::vector<uint64_t> output_splits = {},
                                             std::chrono::milliseconds timeout = {});
  // `outputs`: group_size tensors on root, none elsewhere.
  std::shared_ptr<ClientWork> Gather(const std::string& group, ClientTensor input,
                                     std::vector<ClientTensor> outputs, int root,
                                     std::chrono::milliseconds timeout = {});
  // `inputs`: group_size tensors on root, none elsewhere.
  std::shared_ptr<ClientWork> Scatter(const std::string& group, std::vector<ClientTensor> inputs,
                                      ClientTensor output, int root,
                                      std::chrono::milliseconds timeout = {});
  std::shared_ptr<ClientWork> Barrier(const std::string& group,
                                      std::chrono::milliseconds timeout = {});
  std::shared_ptr<ClientWork> Send(const std::string& group, ClientTensor tensor, int dst,
                                   int64_t tag = 0, std::chrono::milliseconds timeout = {});
  // Receives from group rank `src`, or with `src` = kAnySource from whichever rank sends first
  // with `tag`; the work's source_rank() then names the sender.
  static constexpr int kAnySource = -1;
  std::shared_ptr<ClientWork> Recv(const std::string& group, ClientTensor tensor, int src,
                                   int64_t tag = 0, std::chrono::milliseconds timeout = {});

  // Round trip on the Attach stream (ping/pong). Returns OK, Timeout when no pong arrives within
  // `timeout`, or the session's error.
  Status Ping(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);

  // Registers the file `fd` that `shm` maps with the sidecar (over the fd channel; `what` names
  // it in the error) and keeps the mapping as one of the client's buffers.
  StatusOr<const RegisteredBuffer*> KeepRegistered(std::unique_ptr<ShmBuffer> shm, int fd,
                                                   const std::string& what);

  std::unique_ptr<Impl> impl_;
};

// Building blocks of Client, exposed for tests and for other language bindings.
namespace client_internal {

// Fills `request`'s group, timeout and op (not session_id nor client_op_id) from `args`.
// Returns OK, or InvalidArgument naming the op, the group and the tensor for what can be checked
// without the sidecar: the number of tensors the type takes, a missing dtype, a count whose byte
// size overflows, a tensor with both or neither of shm and host memory, a shared-memory range
// outside its buffer or misaligned for its dtype, inline bytes over kMaxInlineBytes (request or
// expected response), a negative timeout. `request` is unspecified after a failure. CUDA
// tensors in VMM memory are registered through `vmm` (none: refused, naming the setting). With
// `leases`, CUDA tensors' ready events are leased (ReadyEventLease), one per device and stream
// (taken before, OpReadyLeases::TakeFor, or by the export).
Status BuildCollectiveRequest(const std::string& group, const CollectiveArgs& args,
                              v1::CollectiveRequest* request, CudaVmmRegistrar* vmm = nullptr,
                              OpReadyLeases* leases = nullptr);

// The tensors whose inline results come back in CollectiveResponse.outputs, in order: the
// in-place tensors (args.inputs) of allreduce, allreduce_coalesced, broadcast and reduce;
// args.outputs for every other type.
std::vector<ClientTensor> WritebackTensors(const CollectiveArgs& args);

// Copies the results in `response.outputs` into the host memory of the inline tensors among
// `writeback` (from WritebackTensors). Accepts one entry per writeback tensor (entries of shm
// tensors ignored) or one per inline tensor only; no entries at all is accepted for reduce (a
// non-root rank's tensor is an input only). Returns OK, or Internal when the number of entries or
// an entry's size does not match; nothing is written then.
Status ApplyInlineOutputs(CollectiveType type, const std::vector<ClientTensor>& writeback,
                          const v1::CollectiveResponse& response);

// Maps a proto Error to a Status of the same ErrorKind (numbers are 1:1); kind OK gives OK, an
// unknown kind Internal.
Status StatusFromProto(const v1::Error& error);

}  // namespace client_internal
}  // namespace collectived
