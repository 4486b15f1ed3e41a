// Client: connecting a session, buffers, groups, and submitting ops (the parts it relies on are
// listed in client_impl.h).
#include "clients/cpp/client.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "clients/cpp/client_impl.h"
#include "clients/cpp/cuda_tensor_export.h"
#include "collectived/v1/admin.grpc.pb.h"
#include "engine/vocabulary/op_traits.h"
#include "rpc/address.h"
#include "rpc/channel.h"
#include "rpc/client_environment.h"
#include "rpc/grpc_status.h"

namespace collectived {
namespace {

using client_detail::DeadlineIn;
using client_detail::DescribeWork;
using client_detail::kCallDeadline;
using client_detail::kCreateGroupSlack;
using std::chrono::milliseconds;

std::string DefaultClientName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  return "pid " + std::to_string(getpid()) + " on " + (host[0] ? host : "unknown host");
}

// Why nothing answers at `address`, as far as can be told without the sidecar.
std::string UnreachableHint(const std::string& address) {
  StatusOr<std::string> target = ToGrpcTarget(address);
  if (!target.ok() || target->rfind("unix:", 0) != 0) {
    return "is collectived running there, and reachable from here?";
  }
  std::string path = target->substr(5);
  struct stat info {};
  if (stat(path.c_str(), &info) != 0) {
    return path + ": " + std::strerror(errno) + " (is collectived running?)";
  }
  if (!S_ISSOCK(info.st_mode)) return path + " is not a socket";
  if (access(path.c_str(), R_OK | W_OK) != 0) {
    return path + ": " + std::strerror(errno) +
           " (the socket's mode or group does not admit this user)";
  }
  return "is collectived running? nothing accepts connections on " + path;
}

// Waits until the channel is connected. Without `wait_for_sidecar`, a failed connection attempt
// ends the wait at once: a trainer whose sidecar is down learns it immediately.
Status WaitForChannel(grpc::Channel& channel, const std::string& address, milliseconds timeout,
                      bool wait_for_sidecar) {
  const auto deadline = DeadlineIn(timeout);
  for (;;) {
    grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) return Status::Ok();
    if (state == GRPC_CHANNEL_SHUTDOWN ||
        (state == GRPC_CHANNEL_TRANSIENT_FAILURE && !wait_for_sidecar)) {
      return Status::Unavailable("cannot connect to the sidecar at " + address + ": " +
                                 UnreachableHint(address));
    }
    if (!channel.WaitForStateChange(state, deadline)) {
      return Status::Unavailable("cannot connect to the sidecar at " + address + " within " +
                                 std::to_string(timeout.count()) +
                                 " ms: " + UnreachableHint(address));
    }
  }
}

}  // namespace

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Client::~Client() = default;

StatusOr<std::unique_ptr<Client>> Client::Connect(const std::string& address,
                                                  std::string client_name) {
  ClientOptions options;
  options.address = address;
  options.client_name = std::move(client_name);
  return Connect(options);
}

StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.connect_timeout.count() <= 0) {
    return Status::InvalidArgument("connect_timeout must be positive, got " +
                                   std::to_string(options.connect_timeout.count()) + " ms");
  }
  const auto start = std::chrono::steady_clock::now();
  auto impl = std::make_unique<Impl>();
  impl->address = ResolveSidecarAddress(options.address);
  impl->fd_channel = std::make_unique<FdChannelClient>(impl->address, kCallDeadline);
  impl->cuda_vmm = std::make_unique<CudaVmmRegistrar>(
      [channel = impl->fd_channel.get()](int fd, uint64_t bytes, int device) {
        return channel->RegisterCudaVmm(fd, bytes, device);
      },
      [channel = impl->fd_channel.get()](uint64_t id) { (void)channel->UnregisterCudaVmm(id); });
  StatusOr<std::shared_ptr<grpc::Channel>> channel =
      OpenClientChannel(impl->address, options.tls.value_or(TlsClientOptions::FromEnvironment()));
  if (!channel.ok()) return channel.status();
  impl->channel = *channel;
  COLLECTIVED_RETURN_IF_ERROR(WaitForChannel(*impl->channel, impl->address, options.connect_timeout,
                                             options.wait_for_sidecar));
  impl->session_stub = v1::Session::NewStub(impl->channel);
  impl->groups_stub = v1::Groups::NewStub(impl->channel);

  impl->stream = impl->session_stub->Attach(&impl->attach_context);
  v1::SessionRequest open;
  open.mutable_open()->set_client_name(options.client_name.empty() ? DefaultClientName()
                                                                   : options.client_name);
  open.mutable_open()->set_pid(getpid());
  impl->Write(open);  // a failure ends the stream, which the reader reports
  Impl* raw = impl.get();
  impl->reader = std::thread([raw] { raw->ReadLoop(); });

  const auto deadline = start + options.connect_timeout;
  std::unique_lock<std::mutex> lock(impl->mu);
  impl->cv.wait_until(lock, deadline, [&] { return impl->opened || impl->reader_done; });
  if (impl->opened && !impl->reader_done) {
    lock.unlock();
    if (!options.use_ring) {
      impl->NoRing("not asked for (ClientOptions::use_ring)");
    } else if (ClientSetting("COLLECTIVED_RING").value_or("1") == "0") {
      impl->NoRing("disabled by COLLECTIVED_RING=0");
    } else if (!impl->fd_channel->has_token()) {
      impl->NoRing("only a session on the sidecar's Unix socket has a submission ring");
    } else {
      impl->OpenRing();
    }
    impl->stream_signals_wanted = options.stream_signals.value_or(
        ClientSetting("COLLECTIVED_STREAM_WAIT").value_or("event") == "signal");
    return std::unique_ptr<Client>(new Client(std::move(impl)));
  }
  Status failure = impl->reader_done
                       ? impl->session_status
                       : Status::Unavailable(
                             "the sidecar at " + impl->address + " did not open a session within " +
                             std::to_string(options.connect_timeout.count()) + " ms");
  lock.unlock();
  impl->attach_context.TryCancel();
  return failure;  // ~Impl joins the reader
}

const std::string& Client::address() const {
  return impl_->address;
}
const std::string& Client::session_id() const {
  return impl_->session_id;
}
std::shared_ptr<grpc::Channel> Client::channel() const {
  return impl_->channel;
}
const std::string& Client::session_label() const {
  return impl_->session_label;
}
const std::string& Client::sidecar_id() const {
  return impl_->sidecar_id;
}
const std::string& Client::sidecar_version() const {
  return impl_->sidecar_version;
}
bool Client::sidecar_has_gpu_backend() const {
  return impl_->gpu_backend;
}

StatusOr<std::string> Client::SidecarAdvertiseAddress() {
  std::unique_ptr<v1::Admin::Stub> admin = v1::Admin::NewStub(channel());
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(kCallDeadline));
  v1::SidecarInfo info;
  const Status status =
      FromGrpcStatus(admin->GetInfo(&context, v1::GetInfoRequest(), &info), &context);
  if (!status.ok()) return status.WithContext("cannot ask the sidecar for its address");
  return info.advertise_address();
}

Status Client::session_status() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->session_status;
}

std::string Client::ring_error() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->ring_usable ? "" : impl_->ring_error;
}

StatusOr<const RegisteredBuffer*> Client::AllocateBuffer(size_t bytes) {
  COLLECTIVED_RETURN_IF_ERROR(session_status());
  StatusOr<std::unique_ptr<ShmBuffer>> shm = ShmBuffer::Create(bytes);
  if (!shm.ok()) return shm.status();
  const int fd = (*shm)->fd();
  StatusOr<const RegisteredBuffer*> buffer = KeepRegistered(
      std::move(*shm), fd, "cannot register a buffer of " + std::to_string(bytes) + " bytes");
  // The sidecar holds its own descriptor; the mapping keeps the memory.
  if (buffer.ok()) close((*buffer)->shm->TakeFd());
  return buffer;
}

StatusOr<const RegisteredBuffer*> Client::RegisterFd(int fd, size_t bytes) {
  COLLECTIVED_RETURN_IF_ERROR(session_status());
  StatusOr<std::unique_ptr<ShmBuffer>> shm = ShmBuffer::Map(fd, bytes);
  if (!shm.ok()) return shm.status();
  return KeepRegistered(std::move(*shm), fd,
                        "cannot register descriptor " + std::to_string(fd) + " (" +
                            std::to_string(bytes) + " bytes)");
}

StatusOr<const RegisteredBuffer*> Client::KeepRegistered(std::unique_ptr<ShmBuffer> shm, int fd,
                                                         const std::string& what) {
  StatusOr<uint64_t> id = impl_->fd_channel->Register(fd, shm->size());
  if (!id.ok()) return id.status().WithContext(what);
  auto buffer = std::make_unique<RegisteredBuffer>();
  buffer->shm = std::move(shm);
  buffer->buffer_id = *id;
  return impl_->buffers.Add(std::move(buffer));
}

Status Client::FreeBuffer(const RegisteredBuffer* buffer) {
  std::unique_ptr<RegisteredBuffer> owned = impl_->buffers.Take(buffer);
  if (!owned) {
    return Status::InvalidArgument(
        "FreeBuffer: the buffer was not allocated by this client, or was freed already");
  }
  // A session that ended has released the sidecar's mapping already.
  if (!session_status().ok()) return Status::Ok();
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(kCallDeadline));
  v1::UnregisterBufferRequest request;
  request.set_session_id(impl_->session_id);
  request.set_buffer_id(owned->buffer_id);
  v1::UnregisterBufferResponse response;
  return FromGrpcStatus(impl_->session_stub->UnregisterBuffer(&context, request, &response),
                        &context);
}

StatusOr<GroupInfo> Client::CreateGroup(const GroupOptions& options) {
  if (options.name.empty()) return Status::InvalidArgument("CreateGroup: a group needs a name");
  if (options.timeout.count() < 0) {
    return Status::InvalidArgument("CreateGroup: negative timeout for group '" + options.name +
                                   "' (0 means 30 minutes)");
  }
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(
      (options.timeout.count() == 0 ? kDefaultGroupTimeout : options.timeout) + kCreateGroupSlack));
  v1::CreateGroupRequest request;
  request.set_session_id(impl_->session_id);
  request.set_name(options.name);
  request.set_rank(options.rank);
  request.set_world_size(options.world_size);
  for (int member : options.members) request.add_members(member);
  request.set_store_address(options.store_address);
  request.set_store_prefix(options.store_prefix);
  request.set_timeout_ms(options.timeout.count());
  request.set_device_type(options.cuda_device >= 0 ? v1::CUDA : v1::CPU);
  if (options.cuda_device >= 0) request.set_cuda_device(options.cuda_device);
  request.set_job_token(options.job_token);
  if (options.shrink) {
    request.mutable_fault_tolerance()->set_mode(v1::FaultTolerance::SHRINK);
    request.mutable_fault_tolerance()->set_min_ranks(options.min_ranks);
  }
  v1::CreateGroupResponse response;
  COLLECTIVED_RETURN_IF_ERROR(
      FromGrpcStatus(impl_->groups_stub->CreateGroup(&context, request, &response), &context));
  GroupInfo info;
  info.name = response.group().empty() ? options.name : response.group();
  info.group_rank = response.group_rank();
  info.group_size = response.group_size();
  info.members.assign(response.members().begin(), response.members().end());
  info.local_group_ranks.assign(response.local_group_ranks().begin(),
                                response.local_group_ranks().end());
  info.num_sidecars = response.num_sidecars();
  info.sequence_number = response.sequence_number();
  info.replacement = response.replacement();
  info.epoch = static_cast<int>(response.epoch());
  return info;
}

StatusOr<std::vector<int>> Client::Replacements(const std::string& group, ReplacementAction action,
                                                uint64_t after_sequence,
                                                const std::vector<int>& joiners) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(kCallDeadline));
  v1::ReplacementsRequest request;
  request.set_session_id(impl_->session_id);
  request.set_group(group);
  request.set_action(action == ReplacementAction::kAccept  ? v1::ReplacementsRequest::ACCEPT
                     : action == ReplacementAction::kAdmit ? v1::ReplacementsRequest::ADMIT
                                                           : v1::ReplacementsRequest::LIST);
  request.set_after_sequence_number(after_sequence);
  for (int joiner : joiners) request.add_joiners(joiner);
  v1::ReplacementsResponse response;
  COLLECTIVED_RETURN_IF_ERROR(
      FromGrpcStatus(impl_->groups_stub->Replacements(&context, request, &response), &context));
  return std::vector<int>(response.waiting().begin(), response.waiting().end());
}

Status Client::DestroyGroup(const std::string& name) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(kCallDeadline));
  v1::DestroyGroupRequest request;
  request.set_session_id(impl_->session_id);
  request.set_group(name);
  v1::DestroyGroupResponse response;
  if (impl_->signal_words != nullptr) impl_->signal_words->Forget(name);
  return FromGrpcStatus(impl_->groups_stub->DestroyGroup(&context, request, &response), &context);
}

std::shared_ptr<ClientWork> Client::Submit(const std::string& group, CollectiveArgs args) {
  const uint64_t id = impl_->next_op_id.fetch_add(1);
  auto work =
      std::make_shared<ClientWork>(group, args.type, id, client_internal::WritebackTensors(args));
  v1::SessionRequest message;
  v1::CollectiveRequest* request = message.mutable_submit();
  Status built;
  // A client whose streams wait on stream-signal words leases its ready events (see
  // ReadyEventLease): given back once the sidecar waited on them, or the op completed. Taken
  // here, so that running out of them fails the op as ResourceExhausted rather than as one of
  // the tensor errors the request builder reports; the exports record these leases.
  OpReadyLeases leases;
  if (impl_->stream_signals_wanted) {
    for (const auto* tensors : {&args.inputs, &args.outputs}) {
      for (const ClientTensor& tensor : *tensors) {
        if (tensor.cuda == nullptr || tensor.cuda_device < 0) continue;
        Status taken = leases.TakeFor(tensor.cuda_device, tensor.cuda_stream);
        if (!taken.ok()) {
          work->Fail(taken.WithContext(DescribeWork(work->op(), id, group)));
          return work;
        }
      }
    }
  }
  {
    // Held while building, so that FreeBuffer cannot free a buffer the request is reading.
    std::unique_lock<std::mutex> lock = impl_->buffers.Lock();
    built = impl_->buffers.CheckOwnedLocked(group, args);
    if (built.ok()) {
      built =
          client_internal::BuildCollectiveRequest(group, args, request, impl_->cuda_vmm.get(),
                                                  impl_->stream_signals_wanted ? &leases : nullptr);
    }
  }
  if (!built.ok()) {
    work->Fail(std::move(built));
    return work;
  }
  work->ready_leases_ = std::move(leases);
  request->set_client_op_id(id);
  // CUDA ops hear when their GPU work is enqueued (WaitStream). An op's tensors share one
  // device (the sidecar refuses a mix), so the first CUDA tensor names it.
  for (const auto* tensors : {&args.inputs, &args.outputs}) {
    auto cuda = std::find_if(tensors->begin(), tensors->end(),
                             [](const ClientTensor& tensor) { return tensor.cuda != nullptr; });
    if (cuda == tensors->end()) continue;
    work->cuda_device_ = cuda->cuda_device;
    // A collective waits on its stream-signal word where it gets one, else on the event the
    // sidecar's early response names.
    std::shared_ptr<StreamSignalWords> words =
        IsPointToPoint(args.type) ? nullptr : impl_->SignalWords(cuda->cuda_device);
    std::optional<StreamSignalWords::Assigned> assigned;
    if (words != nullptr) assigned = words->Assign(group);
    if (assigned) {
      work->signal_words_ = std::move(words);
      work->signal_ = *assigned;
      v1::StreamSignal* signal = request->mutable_stream_signal();
      signal->set_buffer_id(impl_->signal_buffer_id);
      signal->set_offset(assigned->offset);
      signal->set_value(assigned->value);
    } else {
      request->set_stream_ordered(true);
    }
    break;
  }
  // The ring takes collectives whose request and inline results are small (a send's order is
  // per peer and tag, which a fence across paths could break: point-to-point takes the stream).
  std::string payload;
  bool via_ring = false;
  if (impl_->ring_usable && !IsPointToPoint(args.type)) {
    size_t inline_results = 0;
    for (const ClientTensor& tensor : work->writeback_) {
      // Shared-memory and CUDA results stay where they are: they take no room in a response.
      if (tensor.is_inline()) inline_results += tensor.bytes();
    }
    if (inline_results <= kRingInlineLimit && request->ByteSizeLong() <= kRingInlineLimit) {
      via_ring = request->SerializeToString(&payload);
    }
  }
  if (!via_ring) request->set_session_id(impl_->session_id);
  work->via_ring_ = via_ring;
  impl_->Fence(group, via_ring, work);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->session_status.ok()) {
      Status why = impl_->session_status;
      work->Fail(std::move(why));
      return work;
    }
    if (via_ring && !impl_->ring_usable) {
      work->Fail(Status::Unavailable("session " + impl_->session_label +
                                     ": the submission ring "
                                     "closed: " +
                                     impl_->ring_error));
      return work;
    }
    // Registered before the write, so a completion can never arrive for an unknown op.
    impl_->pending.emplace(id, work);
  }
  if (via_ring) {
    const RingQueueResult submitted =
        impl_->ring->Submit(payload.data(), payload.size(), std::chrono::seconds(30));
    if (submitted != RingQueueResult::kOk) {
      {
        std::lock_guard<std::mutex> lock(impl_->mu);
        impl_->pending.erase(id);
      }
      work->Fail(Status::Unavailable(
          DescribeWork(work->op(), id, group) + ": the submission ring took no submission: " +
          (submitted == RingQueueResult::kFull ? std::string("full for 30 s")
                                               : impl_->ring->reason())));
    }
    return work;
  }
  // On failure the stream is gone and the reader fails the op with the reason.
  impl_->Write(message);
  return work;
}

std::shared_ptr<StreamSignalWords> Client::Impl::SignalWords(int device) {
  if (!stream_signals_wanted) return nullptr;
  std::call_once(signal_setup, [this, device] {
    using client_detail::kSignalBufferBytes;
    StatusOr<std::unique_ptr<ShmBuffer>> shm = ShmBuffer::Create(kSignalBufferBytes);
    if (!shm.ok() || !RegisterSignalWords((*shm)->data(), kSignalBufferBytes, device).ok()) {
      return;
    }
    StatusOr<uint64_t> id = fd_channel->Register((*shm)->fd(), kSignalBufferBytes);
    if (!id.ok()) {
      UnregisterSignalWords((*shm)->data());
      return;
    }
    close((*shm)->TakeFd());  // the sidecar holds its own
    // Mapped and registered for the life of the process: a stream may read its word after the
    // session ended, and unregistering memory a stream still waits on is undefined.
    ShmBuffer* kept = shm->release();
    signal_buffer_id = *id;
    signal_words = std::make_shared<StreamSignalWords>(reinterpret_cast<uint32_t*>(kept->data()),
                                                       kSignalBufferBytes / sizeof(uint32_t));
  });
  return signal_words;
}

namespace {

CollectiveArgs MakeArgs(CollectiveType type, std::vector<ClientTensor> inputs,
                        std::vector<ClientTensor> outputs, milliseconds timeout) {
  CollectiveArgs args;
  args.type = type;
  args.inputs = std::move(inputs);
  args.outputs = std::move(outputs);
  args.timeout = timeout;
  return args;
}

}  // namespace

std::shared_ptr<ClientWork> Client::AllReduce(const std::string& group, ClientTensor tensor,
                                              ReduceOp op, milliseconds timeout) {
  CollectiveArgs args = MakeArgs(CollectiveType::kAllReduce, {std::move(tensor)}, {}, timeout);
  args.reduce_op = op;
  return Submit(group, std::move(args));
}

std::shared_ptr<ClientWork> Client::AllReduceCoalesced(const std::string& group,
                                                       std::vector<ClientTensor> tensors,
                                                       ReduceOp op, milliseconds timeout) {
  CollectiveArgs args =
      MakeArgs(CollectiveType::kAllReduceCoalesced, std::move(tensors), {}, timeout);
  args.reduce_op = op;
  return Submit(group, std::move(args));
}

std::shared_ptr<ClientWork> Client::Broadcast(const std::string& group, ClientTensor tensor,
                                              int root, milliseconds timeout) {
  CollectiveArgs args = MakeArgs(CollectiveType::kBroadcast, {std::move(tensor)}, {}, timeout);
  args.root = root;
  return Submit(group, std::move(args));
}

std::shared_ptr<ClientWork> Client::Reduce(const std::string& group, ClientTensor tensor, int root,
                                           ReduceOp op, milliseconds timeout) {
  CollectiveArgs args = MakeArgs(CollectiveType::kReduce, {std::move(tensor)}, {}, timeout);
  args.root = root;
  args.reduce_op = op;
  return Submit(group, std::move(args));
}

std::shared_ptr<ClientWork> Client::AllGather(const std::string& group, ClientTensor input,
                                              std::vector<ClientTensor> outputs,
                                              milliseconds timeout) {
  return Submit(
      group, MakeArgs(CollectiveType::kAllGather, {std::move(input)}, std::move(outputs), timeout));
}

std::shared_ptr<ClientWork> Client::AllGatherIntoTensor(const std::string& group,
                                                        ClientTensor input, ClientTensor output,
                                                        milliseconds timeout) {
  return Submit(group, MakeArgs(CollectiveType::kAllGatherIntoTensor, {std::move(input)},
                                {std::move(output)}, timeout));
}

std::shared_ptr<ClientWork> Client::AllGatherCoalesced(const std::string& group,
                                                       std::vector<ClientTensor> inputs,
                                                       std::vector<ClientTensor> outputs,
                                                       milliseconds timeout) {
  return Submit(group, MakeArgs(CollectiveType::kAllGatherCoalesced, std::move(inputs),
                                std::move(outputs), timeout));
}

std::shared_ptr<ClientWork> Client::ReduceScatter(const std::string& group,
                                                  std::vector<ClientTensor> inputs,
                                                  ClientTensor output, ReduceOp op,
                                                  milliseconds timeout) {
  CollectiveArgs args =
      MakeArgs(CollectiveType::kReduceScatter, std::move(inputs), {std::move(output)}, timeout);
  args.reduce_op = op;
  return Submit(group, std::move(args));
}

std::shared_ptr<ClientWork> Client::ReduceScatterTensor(const std::string& group,
                                                        ClientTensor input, ClientTensor output,
                                                        ReduceOp op, milliseconds timeout) {
  CollectiveArgs args = MakeArgs(CollectiveType::kReduceScatterTensor, {std::move(input)},
                                 {std::move(output)}, timeout);
  args.reduce_op = op;
  return Submit(group, std::move(args));
}

std::shared_ptr<ClientWork> Client::AllToAll(const std::string& group,
                                             std::vector<ClientTensor> inputs,
                                             std::vector<ClientTensor> outputs,
                                             milliseconds timeout) {
  return Submit(
      group, MakeArgs(CollectiveType::kAllToAll, std::move(inputs), std::move(outputs), timeout));
}

std::shared_ptr<ClientWork> Client::AllToAllSingle(const std::string& group, ClientTensor input,
                                                   ClientTensor output,
                                                   std::vector<uint64_t> input_splits,
                                                   std::vector<uint64_t> output_splits,
                                                   milliseconds timeout) {
  CollectiveArgs args =
      MakeArgs(CollectiveType::kAllToAllSingle, {std::move(input)}, {std::move(output)}, timeout);
  args.input_splits = std::move(input_splits);
  args.output_splits = std::move(output_splits);
  return Submit(group, std::move(args));
}

std::shared_ptr<ClientWork> Client::Gather(const std::string& group, ClientTensor input,
                                           std::vector<ClientTensor> outputs, int root,
                                           milliseconds timeout) {
  CollectiveArgs args =
      MakeArgs(CollectiveType::kGather, {std::move(input)}, std::move(outputs), timeout);
  args.root = root;
  return Submit(group, std::move(args));
}

std::shared_ptr<ClientWork> Client::Scatter(const std::string& group,
                                            std::vector<ClientTensor> inputs, ClientTensor output,
                                            int root, milliseconds timeout) {
  CollectiveArgs args =
      MakeArgs(CollectiveType::kScatter, std::move(inputs), {std::move(output)}, timeout);
  args.root = root;
  return Submit(group, std::move(args));
}

std::shared_ptr<ClientWork> Client::Barrier(const std::string& group, milliseconds timeout) {
  return Submit(group, MakeArgs(CollectiveType::kBarrier, {}, {}, timeout));
}

std::shared_ptr<ClientWork> Client::Send(const std::string& group, ClientTensor tensor, int dst,
                                         int64_t tag, milliseconds timeout) {
  CollectiveArgs args = MakeArgs(CollectiveType::kSend, {std::move(tensor)}, {}, timeout);
  args.peer = dst;
  args.tag = tag;
  return Submit(group, std::move(args));
}

std::shared_ptr<ClientWork> Client::Recv(const std::string& group, ClientTensor tensor, int src,
                                         int64_t tag, milliseconds timeout) {
  CollectiveArgs args = MakeArgs(CollectiveType::kRecv, {}, {std::move(tensor)}, timeout);
  args.peer = src;
  args.tag = tag;
  return Submit(group, std::move(args));
}

Status Client::Ping(milliseconds timeout) {
  const uint64_t nonce = impl_->next_nonce.fetch_add(1);
  auto ping = std::make_shared<Promise<void>>();
  Future<void> pong = ping->future();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    if (!impl_->session_status.ok()) return impl_->session_status;
    impl_->pings.emplace(nonce, std::move(ping));
  }
  v1::SessionRequest message;
  message.set_ping(nonce);
  impl_->Write(message);  // on failure the reader fails the ping with the reason
  static_cast<void>(pong.Wait(timeout));
  if (pong.IsReady()) return pong.status();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->pings.erase(nonce);
  }
  return Status::Timeout("Timeout: no pong from the sidecar at " + impl_->address + " within " +
                         std::to_string(timeout.count()) + " ms");
}

}  // namespace collectived
