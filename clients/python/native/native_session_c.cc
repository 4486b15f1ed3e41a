// A C interface to a session of the C++ client (clients/cpp/client.h), for the torch backend's
// native op path (collectived/native_session.py loads it with ctypes as
// libcollectived_native.so). An op issued through it costs the trainer one call: the C++ client
// exports the tensor, writes the request to the submission ring and takes the completion on its
// own reader thread, with no Python and no GIL. Errors come back as "<kind>\n<message>" (kind as
// engine/vocabulary/status.h names it: "peer_lost", "timeout", ...), cut to the caller's buffer.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "clients/cpp/client.h"
#include "collectived/v1/group.pb.h"
#include "engine/vocabulary/op.h"
#include "rpc/tls.h"

using collectived::Client;
using collectived::ClientOptions;
using collectived::ClientTensor;
using collectived::ClientWork;
using collectived::DType;
using collectived::ErrorKind;
using collectived::ReduceOp;
using collectived::ReduceOpKind;
using collectived::Status;
using collectived::StatusOr;

namespace {

void CopyOut(const std::string& text, char* out, uint64_t capacity) {
  if (out == nullptr || capacity == 0) return;
  const size_t bytes = std::min<size_t>(text.size(), capacity - 1);
  std::memcpy(out, text.data(), bytes);
  out[bytes] = '\0';
}

void CopyError(const Status& status, char* out, uint64_t capacity) {
  CopyOut(std::string(collectived::ErrorKindName(status.kind())) + "\n" + status.message(), out,
          capacity);
}

// What the exception being handled says (call only inside a catch block).
std::string ThrownText() {
  try {
    throw;
  } catch (const std::exception& error) {
    return error.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// `body()`'s result, or when it throws, `thrown` with the exception's text named `what` (written
// to `error` where the call has one): nothing may unwind through the C interface.
template <typename Result, typename Body>
Result Guarded(const char* what, Result thrown, char* error, uint64_t capacity, Body body) {
  try {
    return body();
  } catch (...) {
    try {
      CopyError(Status::Internal(std::string(what) + ": " + ThrownText()), error, capacity);
    } catch (...) {  // no memory left for the words: the result alone says it failed
    }
    return thrown;
  }
}

// Failures after which a group's later ops cannot succeed (torch's process group stops taking
// ops): the first one of each group is kept for the session's owner to read.
bool PoisonsGroup(const Status& status) {
  // Unavailable: the session to the sidecar is lost (the sidecar died), and with it every group
  // of the session. torch 1.13's DDP takes a bucket's future as done whatever its op's outcome
  // (a failed future crashes its reducer), so the next op must raise instead.
  return status.kind() == ErrorKind::kPeerLost || status.kind() == ErrorKind::kAborted ||
         status.kind() == ErrorKind::kTimeout || status.kind() == ErrorKind::kUnavailable;
}

// Shared with the ops' completion callbacks, which may run after the session closed.
struct GroupFailures {
  std::mutex mu;
  std::unordered_map<std::string, Status> first;  // group -> its first poisoning failure
  // Groups that shrink when they lose a rank (docs/fault-tolerance.md): an op that failed for
  // a lost rank leaves them working.
  std::unordered_set<std::string> shrinking;
  // How many groups have a failure: read by the caller before each op, without a call, so that
  // it asks for a group's failure only once there is one (see collectived_native_failure_count).
  std::atomic<uint64_t> count{0};

  // Keeps `status` as `group`'s failure when it poisons the group and is the first.
  void Note(const std::string& group, const Status& status) {
    if (status.ok() || !PoisonsGroup(status)) return;
    std::lock_guard<std::mutex> lock(mu);
    if (status.kind() == ErrorKind::kPeerLost && shrinking.count(group)) return;
    if (first.try_emplace(group, status).second) count.fetch_add(1, std::memory_order_release);
  }
};

// The caller reads the count as a plain 64-bit word (ctypes); an atomic of that size is one.
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
              sizeof(std::atomic<uint64_t>) == sizeof(uint64_t));

// A session's handle. It stays valid after collectived_native_close (a few bytes are never
// freed), so that a call racing with close gets an error instead of touching freed memory; the
// client itself goes when close and the last call that was using it have both finished.
struct NativeSession {
  std::mutex mu;
  std::shared_ptr<Client> client;  // null once closed
  std::shared_ptr<GroupFailures> failures = std::make_shared<GroupFailures>();

  // The client for one call, or null once the session is closed.
  std::shared_ptr<Client> Use() {
    std::lock_guard<std::mutex> lock(mu);
    return client;
  }
};

NativeSession& SessionOf(void* session) {
  return *static_cast<NativeSession*>(session);
}

Status Closed() {
  return Status::Unavailable("the native session is closed");
}

// An op's handle. A failure is noted here by whichever sees it first, its completion callback
// or a call that returns it: a waiter woken by the failure may ask for the group's failure
// before the callback has run.
struct NativeOp {
  std::shared_ptr<ClientWork> work;  // null when the call threw before the op was submitted
  Status thrown;                     // then: why
  std::shared_ptr<GroupFailures> failures;
  std::string group;
  // Whether the op's failure fails its group: not a send's or a recv's (a point-to-point op
  // that timed out leaves the group working, as in c10d; a lost peer fails the group anyway).
  bool poisons = true;

  bool completed() const { return work == nullptr || work->IsCompleted(); }
  Status status() const { return work == nullptr ? thrown : work->status(); }
  Status Seen(Status status) const {
    if (poisons) failures->Note(group, status);
    return status;
  }
};

const NativeOp& OpOf(const void* op) {
  return *static_cast<const NativeOp*>(op);
}

// A C string argument; null reads as empty (the client then refuses the call, naming what).
std::string Text(const char* text) {
  return text != nullptr ? text : "";
}

std::optional<std::chrono::milliseconds> TimeoutOf(int64_t timeout_ms) {
  if (timeout_ms < 0) return std::nullopt;
  return std::chrono::milliseconds(timeout_ms);
}

// A tensor of an op: caller memory whose bytes travel in the request (`cuda_device` -1), or
// device memory of CUDA device `cuda_device` produced on `cuda_stream`; `dtype` in
// engine/vocabulary/dtype_enum.h's numbers.
ClientTensor TensorOf(void* data, int cuda_device, void* cuda_stream, int dtype, uint64_t count) {
  const auto type = static_cast<DType>(dtype);
  return cuda_device >= 0 ? ClientTensor::Cuda(data, cuda_device, type, count, cuda_stream)
                          : ClientTensor::Inline(data, type, count);
}

ReduceOp ReduceOf(int reduce_kind, double scale) {
  return ReduceOp{static_cast<ReduceOpKind>(reduce_kind), scale};
}

// The handle of the op `submit(client, group)` submits on `group` of `session` (`what` names it
// in the error of a call that threw), or null when not even the handle could be made: the op
// calls below differ only in `submit`.
template <typename Submit>
void* Issue(void* session, const char* group, const char* what, Submit submit,
            bool poisons = true) {
  NativeSession& native = SessionOf(session);
  NativeOp* op = nullptr;
  try {  // nothing may unwind through the C interface
    op = new NativeOp{nullptr, Status::Ok(), native.failures, Text(group), poisons};
    const std::shared_ptr<Client> client = native.Use();
    if (client == nullptr) {
      op->thrown = Closed();
      return op;
    }
    op->work = submit(*client, op->group);
  } catch (...) {
    if (op == nullptr) return nullptr;
    op->thrown =
        Status::Internal(std::string(what) + " on group '" + op->group + "': " + ThrownText());
    return op;
  }
  if (!poisons) return op;
  try {
    op->work->AddCallback([failures = op->failures, name = op->group](const Status& status) {
      failures->Note(name, status);
    });
  } catch (...) {
    // The op was submitted: its work stays (the sidecar may still use the memory), and a
    // failure is noted by whichever call sees it (NativeOp::Seen).
  }
  return op;
}

}  // namespace

extern "C" {

// One tensor of collectived_native_submit (ctypes declares the same layout:
// collectived/native_session.py). Its bytes are `count` elements of `dtype`
// (engine/vocabulary/dtype_enum.h's numbers): at byte `offset` of `buffer` (a buffer of
// collectived_native_allocate_buffer: zero-copy) when `buffer` is set; else device memory at
// `data` when `cuda_device` >= 0; else caller memory at `data` whose bytes travel in the request.
struct collectived_native_tensor {
  void* data;
  const void* buffer;
  uint64_t offset;
  uint64_t count;
  int32_t dtype;
  int32_t cuda_device;
};

// One op of collectived_native_submit: CollectiveArgs in C. `type` is OpKind's number,
// `reduce_kind` the API's ReduceOp.Kind and `scale` PREMUL_SUM's factor (reducing ops), `root` a
// group rank (rooted ops), `peer` a group rank or -1 for any source (send, recv), `tag` (send,
// recv), the splits in elements (alltoall_single; none = equal), `timeout_ms` 0 = the group's,
// `cuda_stream` the stream CUDA tensors were produced on.
struct collectived_native_op {
  int32_t type;
  int32_t reduce_kind;
  double scale;
  int32_t root;
  int32_t peer;
  int64_t tag;
  const uint64_t* input_splits;
  uint64_t input_split_count;
  const uint64_t* output_splits;
  uint64_t output_split_count;
  int64_t timeout_ms;
  void* cuda_stream;
};

}  // extern "C"

namespace {

ClientTensor TensorOf(const collectived_native_tensor& t, void* cuda_stream) {
  const auto type = static_cast<DType>(t.dtype);
  if (t.buffer != nullptr) {
    return ClientTensor::Shm(*static_cast<const collectived::RegisteredBuffer*>(t.buffer), t.offset,
                             type, t.count);
  }
  return TensorOf(t.data, t.cuda_device, cuda_stream, t.dtype, t.count);
}

std::vector<ClientTensor> TensorsOf(const collectived_native_tensor* tensors, uint64_t count,
                                    void* cuda_stream) {
  std::vector<ClientTensor> out;
  out.reserve(count);
  for (uint64_t i = 0; i < count; ++i) out.push_back(TensorOf(tensors[i], cuda_stream));
  return out;
}

// The buffer `make(client)` registers on `session` (its memory at `*data`), or null with the
// error: allocate_buffer and register_fd differ only in `make`.
template <typename Make>
const void* BufferOf(void* session, const char* what, void** data, char* error, uint64_t capacity,
                     Make make) {
  return Guarded<const void*>(what, nullptr, error, capacity, [&]() -> const void* {
    const std::shared_ptr<Client> client = SessionOf(session).Use();
    if (client == nullptr) {
      CopyError(Closed(), error, capacity);
      return nullptr;
    }
    StatusOr<const collectived::RegisteredBuffer*> buffer = make(*client);
    if (!buffer.ok()) {
      CopyError(buffer.status(), error, capacity);
      return nullptr;
    }
    *data = (*buffer)->data();
    return *buffer;
  });
}

std::vector<uint64_t> SplitsOf(const uint64_t* splits, uint64_t count) {
  return splits == nullptr ? std::vector<uint64_t>{}
                           : std::vector<uint64_t>(splits, splits + count);
}

}  // namespace

extern "C" {

// A session with the sidecar at `address` (empty: $COLLECTIVED_ADDRESS or the default), named
// `client_name` in the sidecar's logs. `stream_signals`: 1 or 0 forces the CUDA wait path, -1
// takes $COLLECTIVED_STREAM_WAIT. Null on failure, with the error in `error`.
// Opens a session with the sidecar at `address` (empty: $COLLECTIVED_ADDRESS or the default).
// `stream_signals`: -1 as the environment says, else 0 or 1. `connect_timeout_ms` <= 0: the
// client's default. `tls`: -1 from $COLLECTIVED_TLS_*, 0 plaintext, 1 the files given (a TCP
// address only). The session's handle, or null with the error.
void* collectived_native_connect(const char* address, const char* client_name, int stream_signals,
                                 int64_t connect_timeout_ms, int tls, const char* tls_ca,
                                 const char* tls_cert, const char* tls_key,
                                 const char* tls_server_name, char* error, uint64_t capacity) {
  return Guarded<void*>("native session", nullptr, error, capacity, [&]() -> void* {
    ClientOptions options;
    options.address = Text(address);
    options.client_name = Text(client_name);
    if (stream_signals >= 0) options.stream_signals = stream_signals != 0;
    if (connect_timeout_ms > 0)
      options.connect_timeout = std::chrono::milliseconds(connect_timeout_ms);
    if (tls >= 0) {
      collectived::TlsClientOptions files;
      if (tls > 0) {
        files.ca_file = Text(tls_ca);
        files.cert_file = Text(tls_cert);
        files.key_file = Text(tls_key);
        files.server_name = Text(tls_server_name);
      }
      options.tls = files;
    }
    StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    if (!client.ok()) {
      CopyError(client.status(), error, capacity);
      return nullptr;
    }
    auto session = std::make_unique<NativeSession>();
    session->client = std::move(client).value();
    return session.release();
  });
}

// What the session is, by `what`: 0 its id (a secret), 1 its label, 2 the sidecar's id, 3 the
// sidecar's version, 4 why it has no submission ring (empty while it has one). Written to `out`;
// returns the text's whole length (more than `capacity` - 1 when it was cut), or -1 when the
// session is closed or `what` is unknown.
int64_t collectived_native_session_info(void* session, int what, char* out, uint64_t capacity) {
  return Guarded<int64_t>("session info", -1, nullptr, 0, [&]() -> int64_t {
    const std::shared_ptr<Client> client = SessionOf(session).Use();
    if (client == nullptr) return -1;
    std::string text;
    switch (what) {
      case 0:
        text = client->session_id();
        break;
      case 1:
        text = client->session_label();
        break;
      case 2:
        text = client->sidecar_id();
        break;
      case 3:
        text = client->sidecar_version();
        break;
      case 4:
        text = client->ring_error();
        break;
      default:
        return -1;
    }
    CopyOut(text, out, capacity);
    return static_cast<int64_t>(text.size());
  });
}

// Ends the session: its pending ops fail (Aborted) once no call is using it any more. Calls on it
// afterwards, or racing with this one, fail as on a closed session (Unavailable); closing twice
// is harmless.
void collectived_native_close(void* session) {
  Guarded("close", 0, nullptr, 0, [&] {
    std::shared_ptr<Client> client;
    {
      NativeSession& native = SessionOf(session);
      std::lock_guard<std::mutex> lock(native.mu);
      client.swap(native.client);
    }
    // The last reference (here, or in a call still running) destroys the client outside the
    // lock.
    return 0;
  });
}

// The sidecar's advertised host:port (Client::SidecarAdvertiseAddress) into `address`. 0, or 1
// with the error in `error`.
int collectived_native_sidecar_address(void* session, char* address, uint64_t address_capacity,
                                       char* error, uint64_t capacity) {
  return Guarded("sidecar address", 1, error, capacity, [&] {
    const std::shared_ptr<Client> client = SessionOf(session).Use();
    if (client == nullptr) {
      CopyError(Closed(), error, capacity);
      return 1;
    }
    StatusOr<std::string> advertised = client->SidecarAdvertiseAddress();
    if (!advertised.ok()) {
      CopyError(advertised.status(), error, capacity);
      return 1;
    }
    CopyOut(*advertised, address, address_capacity);
    return 0;
  });
}

// Joins group `name` (GroupOptions' fields; `members`: `member_count` global ranks of a
// subgroup, none for all; `cuda_device` -1 for a CPU group; `shrink` nonzero for a group that
// shrinks, down to `min_ranks`). 0 with the group as a serialized
// collectived.v1.CreateGroupResponse in `info` (`*info_bytes` its length; -1 when `info_capacity`
// is too small), or 1 with the error.
int collectived_native_create_group(void* session, const char* name, int rank, int world_size,
                                    const int32_t* members, uint64_t member_count,
                                    const char* store_address, const char* store_prefix,
                                    int64_t timeout_ms, const char* job_token, int cuda_device,
                                    int shrink, int min_ranks, char* info, uint64_t info_capacity,
                                    int64_t* info_bytes, char* error, uint64_t capacity) {
  return Guarded("create group", 1, error, capacity, [&] {
    collectived::GroupOptions options;
    options.shrink = shrink != 0;
    options.min_ranks = min_ranks;
    options.name = Text(name);
    options.rank = rank;
    options.world_size = world_size;
    if (members != nullptr) options.members.assign(members, members + member_count);
    options.store_address = Text(store_address);
    options.store_prefix = Text(store_prefix);
    options.timeout = std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
    options.job_token = Text(job_token);
    options.cuda_device = cuda_device;
    const std::shared_ptr<Client> client = SessionOf(session).Use();
    if (client == nullptr) {
      CopyError(Closed(), error, capacity);
      return 1;
    }
    StatusOr<collectived::GroupInfo> joined = client->CreateGroup(options);
    if (!joined.ok()) {
      CopyError(joined.status(), error, capacity);
      return 1;
    }
    if (options.shrink) {
      GroupFailures& failures = *SessionOf(session).failures;
      std::lock_guard<std::mutex> lock(failures.mu);
      failures.shrinking.insert(options.name);
    }
    if (info_bytes != nullptr) {
      collectived::v1::CreateGroupResponse response;
      response.set_group(joined->name);
      response.set_group_rank(joined->group_rank);
      response.set_group_size(joined->group_size);
      for (int member : joined->members) response.add_members(member);
      for (int local : joined->local_group_ranks) response.add_local_group_ranks(local);
      response.set_num_sidecars(joined->num_sidecars);
      response.set_sequence_number(joined->sequence_number);
      response.set_replacement(joined->replacement);
      response.set_epoch(joined->epoch);
      const std::string bytes = response.SerializeAsString();
      if (info == nullptr || bytes.size() > info_capacity) {
        *info_bytes = -1;
      } else {
        std::memcpy(info, bytes.data(), bytes.size());
        *info_bytes = static_cast<int64_t>(bytes.size());
      }
    }
    return 0;
  });
}

// Leaves group `name`. 0, or 1 with the error.
int collectived_native_destroy_group(void* session, const char* name, char* error,
                                     uint64_t capacity) {
  return Guarded("destroy group", 1, error, capacity, [&] {
    const std::shared_ptr<Client> client = SessionOf(session).Use();
    const Status status = client == nullptr ? Closed() : client->DestroyGroup(Text(name));
    if (status.ok()) return 0;
    CopyError(status, error, capacity);
    return 1;
  });
}

// The op calls: each submits one collective on `group` and returns its work (to free with
// collectived_native_work_free); an op refused at once is a work that failed; null when no
// memory was left for the work itself. Tensors are as
// TensorOf takes them, every tensor of an op on one device and stream; their memory stays the
// caller's, untouched until the work completes. `reduce_kind` is the API's ReduceOp.Kind
// (engine/vocabulary/reduce_op.h's order), `scale` PREMUL_SUM's factor, `root` a group rank;
// `timeout_ms` 0 = the group's.

// Allreduce of `count` elements at `data`, in place.
void* collectived_native_allreduce(void* session, const char* group, void* data, int cuda_device,
                                   void* cuda_stream, int dtype, uint64_t count, int reduce_kind,
                                   double scale, int64_t timeout_ms) {
  return Issue(session, group, "allreduce", [&](Client& client, const std::string& name) {
    return client.AllReduce(name, TensorOf(data, cuda_device, cuda_stream, dtype, count),
                            ReduceOf(reduce_kind, scale), std::chrono::milliseconds(timeout_ms));
  });
}

// Broadcast of `count` elements at `data` from group rank `root`, in place.
void* collectived_native_broadcast(void* session, const char* group, void* data, int cuda_device,
                                   void* cuda_stream, int dtype, uint64_t count, int root,
                                   int64_t timeout_ms) {
  return Issue(session, group, "broadcast", [&](Client& client, const std::string& name) {
    return client.Broadcast(name, TensorOf(data, cuda_device, cuda_stream, dtype, count), root,
                            std::chrono::milliseconds(timeout_ms));
  });
}

// Every rank's `input_count` elements at `input`, in rank order into the `output_count` at
// `output` (group size times as many).
void* collectived_native_allgather_into_tensor(void* session, const char* group, void* output,
                                               void* input, int cuda_device, void* cuda_stream,
                                               int dtype, uint64_t output_count,
                                               uint64_t input_count, int64_t timeout_ms) {
  return Issue(session, group, "allgather_into_tensor",
               [&](Client& client, const std::string& name) {
                 return client.AllGatherIntoTensor(
                     name, TensorOf(input, cuda_device, cuda_stream, dtype, input_count),
                     TensorOf(output, cuda_device, cuda_stream, dtype, output_count),
                     std::chrono::milliseconds(timeout_ms));
               });
}

// The reduction of every rank's `input_count` elements at `input`, this rank's share of it (the
// `output_count` elements at rank * output_count) into `output`.
void* collectived_native_reduce_scatter_tensor(void* session, const char* group, void* output,
                                               void* input, int cuda_device, void* cuda_stream,
                                               int dtype, uint64_t output_count,
                                               uint64_t input_count, int reduce_kind, double scale,
                                               int64_t timeout_ms) {
  return Issue(session, group, "reduce_scatter_tensor",
               [&](Client& client, const std::string& name) {
                 return client.ReduceScatterTensor(
                     name, TensorOf(input, cuda_device, cuda_stream, dtype, input_count),
                     TensorOf(output, cuda_device, cuda_stream, dtype, output_count),
                     ReduceOf(reduce_kind, scale), std::chrono::milliseconds(timeout_ms));
               });
}

// Waits (the GIL released: load with CDLL) until the work completes, at most `timeout_ms` (-1:
// no bound). 1 when it completed, 0 when the time ran out, -1 when the wait itself failed (an
// exception inside the library).
int collectived_native_work_wait(void* work, int64_t timeout_ms) {
  const NativeOp& op = OpOf(work);
  return Guarded("wait", -1, nullptr, 0, [&] {
    if (op.work != nullptr) static_cast<void>(op.Seen(op.work->Wait(TimeoutOf(timeout_ms))));
    return op.completed() ? 1 : 0;
  });
}

// ClientWork::WaitStream: `stream` waits for the op's results (it may wait on the CPU: call it
// with the GIL released). 0, or 1 with the error.
int collectived_native_work_wait_stream(void* work, void* stream, int64_t timeout_ms, char* error,
                                        uint64_t capacity) {
  const NativeOp& op = OpOf(work);
  return Guarded("wait_stream", 1, error, capacity, [&] {
    const Status status = op.work == nullptr
                              ? op.thrown
                              : op.Seen(op.work->WaitStream(stream, TimeoutOf(timeout_ms)));
    if (status.ok()) return 0;
    CopyError(status, error, capacity);
    return 1;
  });
}

// 0 pending, 1 succeeded, 2 failed (the error with collectived_native_work_error).
int collectived_native_work_state(const void* work) {
  const NativeOp& op = OpOf(work);
  return Guarded("work state", 2, nullptr, 0, [&] {
    if (!op.completed()) return 0;
    return op.Seen(op.status()).ok() ? 1 : 2;
  });
}

// The error of a failed work (nothing for others).
void collectived_native_work_error(const void* work, char* error, uint64_t capacity) {
  Guarded("work error", 0, error, capacity, [&] {
    const Status status = OpOf(work).Seen(OpOf(work).status());
    if (!status.ok()) CopyError(status, error, capacity);
    return 0;
  });
}

// Calls `callback(token)` once the work completes: on the client's reader thread, or at once on
// this one when it has. The callback must not call into this session's waits.
void collectived_native_work_on_done(void* work, void (*callback)(uint64_t), uint64_t token) {
  const NativeOp& op = OpOf(work);
  if (op.work == nullptr) {
    callback(token);
    return;
  }
  const int added = Guarded("on_done", 1, nullptr, 0, [&] {
    op.work->AddCallback([callback, token](const Status&) { callback(token); });
    return 0;
  });
  if (added != 0) {
    // No memory for the callback: it runs here once the op completed, late but once.
    while (!Guarded("on_done", false, nullptr, 0, [&] { return op.completed(); })) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    callback(token);
  }
}

void collectived_native_work_free(void* work) {
  delete static_cast<NativeOp*>(work);
}

// The address of the session's count of groups with a failure (a 64-bit word that lives as long
// as the session's handle: never freed). It grows with each group's first failure under the lock
// collectived_native_group_failure takes, so that a caller which reads it before each op asks
// for the groups' failures only when it changed.
const uint64_t* collectived_native_failure_count(void* session) {
  return reinterpret_cast<const uint64_t*>(&SessionOf(session).failures->count);
}

// 1 with the error of the first op of group `group` that failed it (peer lost, aborted, timed
// out); else 0.
int collectived_native_group_failure(void* session, const char* group, char* error,
                                     uint64_t capacity) {
  return Guarded("group failure", 1, error, capacity, [&] {
    GroupFailures& failures = *SessionOf(session).failures;
    std::lock_guard<std::mutex> lock(failures.mu);
    const auto found = failures.first.find(Text(group));
    if (found == failures.first.end()) return 0;
    CopyError(found->second, error, capacity);
    return 1;
  });
}

// Any collective of the C++ client (Client::Submit): the general form of the op calls above, for
// every op type, with tensors in shared memory, inline or on a CUDA device. The op's name for a
// call that threw comes from its type.
void* collectived_native_submit(void* session, const char* group, const collectived_native_op* op,
                                const collectived_native_tensor* inputs, uint64_t input_count,
                                const collectived_native_tensor* outputs, uint64_t output_count) {
  const auto type = static_cast<collectived::OpKind>(op->type);
  const std::string what(collectived::OpKindName(type));
  return Issue(
      session, group, what.c_str(),
      [&](Client& client, const std::string& name) {
        collectived::CollectiveArgs args;
        args.type = type;
        args.inputs = TensorsOf(inputs, input_count, op->cuda_stream);
        args.outputs = TensorsOf(outputs, output_count, op->cuda_stream);
        args.reduce_op = ReduceOf(op->reduce_kind, op->scale);
        args.root = op->root;
        args.peer = op->peer;
        args.tag = op->tag;
        args.input_splits = SplitsOf(op->input_splits, op->input_split_count);
        args.output_splits = SplitsOf(op->output_splits, op->output_split_count);
        args.timeout = std::chrono::milliseconds(op->timeout_ms);
        return client.Submit(name, std::move(args));
      },
      !collectived::IsPointToPoint(type));
}

// 1 when the op's CUDA results are waited for on a stream-signal word (the sidecar's stream
// writes it: no CPU wait), 0 otherwise (host ops; the event path).
int collectived_native_work_stream_signal(const void* work) {
  const NativeOp& op = OpOf(work);
  return Guarded("stream signal", 0, nullptr, 0,
                 [&] { return op.work != nullptr && op.work->has_stream_signal() ? 1 : 0; });
}

// The group rank a completed recv took its message from (any source), else -1.
int collectived_native_work_source_rank(const void* work) {
  const NativeOp& op = OpOf(work);
  return Guarded("source rank", -1, nullptr, 0, [&] {
    return op.work != nullptr && op.completed() ? op.work->source_rank() : -1;
  });
}

// The group's sequence number of a completed op, as the sidecar assigned it; 0 before.
uint64_t collectived_native_work_sequence_number(const void* work) {
  const NativeOp& op = OpOf(work);
  return Guarded<uint64_t>("sequence number", 0, nullptr, 0, [&]() -> uint64_t {
    return op.work != nullptr && op.completed() ? op.work->sequence_number() : 0;
  });
}

// A completed op's membership epoch (a shrinking group's; 0 otherwise), and that epoch's first
// sequence number in `*first_sequence` (1 otherwise); -1 before it completed.
int collectived_native_work_epoch(const void* work, uint64_t* first_sequence) {
  const NativeOp& op = OpOf(work);
  return Guarded("epoch", -1, nullptr, 0, [&] {
    if (op.work == nullptr || !op.completed()) return -1;
    if (first_sequence != nullptr) *first_sequence = op.work->epoch_first_sequence_number();
    return op.work->epoch();
  });
}

// Replacements of lost ranks in shrinking group `group` (Client::Replacements): `action` 0
// lists, 1 accepts, 2 admits the `joiner_count` group ranks `joiners` after op `after_sequence`.
// The number of lost ranks whose replacement waits, their group ranks in `waiting` (at most
// `waiting_capacity`), or -1 with the error.
int64_t collectived_native_replacements(void* session, const char* group, int action,
                                        uint64_t after_sequence, const int32_t* joiners,
                                        uint64_t joiner_count, int32_t* waiting,
                                        uint64_t waiting_capacity, char* error, uint64_t capacity) {
  return Guarded<int64_t>("replacements", -1, error, capacity, [&]() -> int64_t {
    const std::shared_ptr<Client> client = SessionOf(session).Use();
    if (client == nullptr) {
      CopyError(Closed(), error, capacity);
      return -1;
    }
    if (action < 0 || action > 2) {
      CopyError(collectived::Status::InvalidArgument("replacements: unknown action " +
                                                     std::to_string(action)),
                error, capacity);
      return -1;
    }
    std::vector<int> admitted;
    if (joiners != nullptr) admitted.assign(joiners, joiners + joiner_count);
    StatusOr<std::vector<int>> answer = client->Replacements(
        Text(group), static_cast<collectived::ReplacementAction>(action), after_sequence, admitted);
    if (!answer.ok()) {
      CopyError(answer.status(), error, capacity);
      return -1;
    }
    for (size_t i = 0; i < answer->size() && i < waiting_capacity && waiting != nullptr; ++i) {
      waiting[i] = (*answer)[i];
    }
    return static_cast<int64_t>(answer->size());
  });
}

// The bytes of results a completed op got back inline (0: all written in place); 0 before.
uint64_t collectived_native_work_inline_result_bytes(const void* work) {
  const NativeOp& op = OpOf(work);
  return Guarded<uint64_t>("inline result bytes", 0, nullptr, 0, [&]() -> uint64_t {
    return op.work != nullptr && op.completed() ? op.work->inline_result_bytes() : 0;
  });
}

// The sidecar's id of a registered buffer (ShmRef.buffer_id, in this session only).
uint64_t collectived_native_buffer_id(const void* buffer) {
  return static_cast<const collectived::RegisteredBuffer*>(buffer)->buffer_id;
}

// A buffer of `bytes` bytes of shared memory registered with the session's sidecar
// (Client::AllocateBuffer): tensors in it travel zero-copy. Its memory is at `*data` until
// collectived_native_free_buffer. Null with the error on failure.
const void* collectived_native_allocate_buffer(void* session, uint64_t bytes, void** data,
                                               char* error, uint64_t capacity) {
  return BufferOf(session, "allocate buffer", data, error, capacity,
                  [&](Client& client) { return client.AllocateBuffer(bytes); });
}

// Registers the first `bytes` bytes of the caller's shared-memory file `fd` (Client::RegisterFd;
// the caller keeps `fd`), mapped here at `*data`: a buffer as collectived_native_allocate_buffer
// makes one. Null with the error on failure.
const void* collectived_native_register_fd(void* session, int fd, uint64_t bytes, void** data,
                                           char* error, uint64_t capacity) {
  return BufferOf(session, "register fd", data, error, capacity,
                  [&](Client& client) { return client.RegisterFd(fd, bytes); });
}

// Unregisters and unmaps a buffer of collectived_native_allocate_buffer: no op may still use it.
// 0, or 1 with the error (a buffer of another session, or freed already).
int collectived_native_free_buffer(void* session, const void* buffer, char* error,
                                   uint64_t capacity) {
  return Guarded("free buffer", 1, error, capacity, [&] {
    const std::shared_ptr<Client> client = SessionOf(session).Use();
    const Status status =
        client == nullptr
            ? Closed()
            : client->FreeBuffer(static_cast<const collectived::RegisteredBuffer*>(buffer));
    if (status.ok()) return 0;
    CopyError(status, error, capacity);
    return 1;
  });
}

}  // extern "C"
