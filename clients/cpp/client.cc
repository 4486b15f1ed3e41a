#include "clients/cpp/client.h"

#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "clients/cpp/cuda_tensor_export.h"
#include "collectived/v1/collectives.pb.h"
#include "collectived/v1/group.grpc.pb.h"
#include "collectived/v1/session.grpc.pb.h"
#include "engine/logging.h"
#include "engine/op_traits.h"
#include "rpc/address.h"
#include "rpc/channel.h"
#include "rpc/fd_channel_wire.h"
#include "rpc/grpc_status.h"
#include "rpc/submission_ring.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;

// Deadline of unary calls that do not wait for other ranks (buffers, DestroyGroup): a wedged
// sidecar fails them with a Timeout after this long instead of hanging the trainer.
constexpr milliseconds kCallDeadline{60000};
// CreateGroup waits for the rendezvous up to the group's timeout; the slack lets the sidecar's
// own TIMEOUT (which names the missing ranks) arrive before gRPC's deadline fires.
constexpr milliseconds kCreateGroupSlack{10000};
// How long the destructor lets the sidecar close the stream after the half-close.
constexpr milliseconds kCloseGrace{5000};

std::chrono::system_clock::time_point DeadlineIn(milliseconds timeout) {
  return std::chrono::system_clock::now() + timeout;
}

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

v1::DType ToProto(DType dtype) {
  return static_cast<v1::DType>(static_cast<int32_t>(dtype));
}

void ToProto(const ReduceOp& op, v1::ReduceOp* out) {
  // The engine's kinds are numbered like the proto's (SUM = 0 ... PREMUL_SUM = 8).
  out->set_kind(static_cast<v1::ReduceOp_Kind>(static_cast<int>(op.kind)));
  out->set_scale(op.scale);
}

// Fills v1::Tensor messages from ClientTensors and keeps count of the inline bytes that travel
// each way, so an oversized op is refused before it could end the session.
class TensorFiller {
 public:
  explicit TensorFiller(std::string where) : where_(std::move(where)) {}

  // Inputs send their bytes; outputs send dtype and count only and get the result back.
  Status Input(const ClientTensor& tensor, size_t index, v1::Tensor* out) {
    return Fill(tensor, "input tensor", index, /*send=*/true, /*receive=*/false, out);
  }
  Status InPlace(const ClientTensor& tensor, size_t index, v1::Tensor* out) {
    return Fill(tensor, "tensor", index, /*send=*/true, /*receive=*/true, out);
  }
  Status Output(const ClientTensor& tensor, size_t index, v1::Tensor* out) {
    return Fill(tensor, "output tensor", index, /*send=*/false, /*receive=*/true, out);
  }
  Status Inputs(const std::vector<ClientTensor>& tensors,
                google::protobuf::RepeatedPtrField<v1::Tensor>* out) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      COLLECTIVED_RETURN_IF_ERROR(Input(tensors[i], i, out->Add()));
    }
    return Status::Ok();
  }
  Status InPlaces(const std::vector<ClientTensor>& tensors,
                  google::protobuf::RepeatedPtrField<v1::Tensor>* out) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      COLLECTIVED_RETURN_IF_ERROR(InPlace(tensors[i], i, out->Add()));
    }
    return Status::Ok();
  }
  Status Outputs(const std::vector<ClientTensor>& tensors,
                 google::protobuf::RepeatedPtrField<v1::Tensor>* out) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      COLLECTIVED_RETURN_IF_ERROR(Output(tensors[i], i, out->Add()));
    }
    return Status::Ok();
  }

  Status CheckInlineTotals() const {
    if (sent_ > kMaxInlineBytes) {
      return Status::InvalidArgument(where_ + ": inline tensors of " + std::to_string(sent_) +
                                     " bytes exceed the " + std::to_string(kMaxInlineBytes) +
                                     "-byte message limit; use a shared-memory buffer "
                                     "(Client::AllocateBuffer)");
    }
    if (received_ > kMaxInlineBytes) {
      return Status::InvalidArgument(where_ + ": inline outputs of " + std::to_string(received_) +
                                     " bytes exceed the " + std::to_string(kMaxInlineBytes) +
                                     "-byte message limit; use a shared-memory buffer "
                                     "(Client::AllocateBuffer)");
    }
    return Status::Ok();
  }

 private:
  Status Fill(const ClientTensor& tensor, std::string_view role, size_t index, bool send,
              bool receive, v1::Tensor* out) {
    const std::string what = where_ + ": " + std::string(role) + " " + std::to_string(index);
    const size_t element = DTypeSize(tensor.dtype);
    if (element == 0) return Status::InvalidArgument(what + " has no dtype");
    if (tensor.count > std::numeric_limits<size_t>::max() / element) {
      return Status::InvalidArgument(what + ": " + std::to_string(tensor.count) + " elements of " +
                                     std::string(DTypeName(tensor.dtype)) +
                                     " overflow the byte size");
    }
    const size_t bytes = tensor.count * element;
    out->set_dtype(ToProto(tensor.dtype));
    out->set_count(tensor.count);
    for (int64_t dim : tensor.shape) out->add_shape(dim);

    if ((tensor.shm != nullptr) + (tensor.host != nullptr) + (tensor.cuda != nullptr) > 1) {
      return Status::InvalidArgument(what +
                                     " has more than one of a shared-memory buffer, a host "
                                     "pointer and a CUDA pointer; give one");
    }
    if (tensor.cuda != nullptr) {
      if (tensor.cuda_device < 0) {
        return Status::InvalidArgument(what + " is a CUDA tensor without a device (cuda_device " +
                                       std::to_string(tensor.cuda_device) + ")");
      }
      StatusOr<ExportedCudaTensor> exported =
          ExportCudaTensor(tensor.cuda, bytes, tensor.cuda_device, tensor.cuda_stream);
      if (!exported.ok()) {
        return Status::InvalidArgument(what + " (CUDA device " +
                                       std::to_string(tensor.cuda_device) +
                                       "): " + exported.status().message());
      }
      v1::CudaIpcRef* ref = out->mutable_cuda();
      ref->set_mem_handle(exported->memory_handle);
      ref->set_offset(exported->offset);
      ref->set_length(exported->length);
      ref->set_device(exported->device);
      ref->set_event_handle(exported->event_handle);
      return Status::Ok();
    }
    if (tensor.shm != nullptr) {
      if (tensor.shm->shm == nullptr) {
        return Status::InvalidArgument(what + " refers to a buffer without memory");
      }
      const size_t size = tensor.shm->size();
      if (tensor.offset > size || bytes > size - tensor.offset) {
        return Status::InvalidArgument(
            what + ": bytes [" + std::to_string(tensor.offset) + ", " +
            std::to_string(tensor.offset) + " + " + std::to_string(bytes) + ") (" +
            std::to_string(tensor.count) + " x " + std::string(DTypeName(tensor.dtype)) +
            ") lie outside its shared-memory buffer of " + std::to_string(size) + " bytes");
      }
      if (tensor.offset % element != 0) {
        return Status::InvalidArgument(what + ": offset " + std::to_string(tensor.offset) +
                                       " is not aligned to the " + std::to_string(element) +
                                       "-byte elements of " + std::string(DTypeName(tensor.dtype)));
      }
      v1::ShmRef* ref = out->mutable_shm();
      ref->set_buffer_id(tensor.shm->buffer_id);
      ref->set_offset(tensor.offset);
      ref->set_length(bytes);
      return Status::Ok();
    }
    if (tensor.host == nullptr && bytes != 0) {
      return Status::InvalidArgument(what +
                                     " has no memory (neither a shared-memory buffer nor a "
                                     "host pointer)");
    }
    if (send) {
      sent_ = AddCapped(sent_, bytes);
      if (sent_ > kMaxInlineBytes) return CheckInlineTotals();
      out->set_inline_(static_cast<const char*>(tensor.host), bytes);
    } else {
      // Only dtype and count are needed, but the oneof must say "inline".
      out->mutable_inline_();
    }
    if (receive) received_ = AddCapped(received_, bytes);
    return Status::Ok();
  }

  // The totals are only compared against kMaxInlineBytes: saturate just above it.
  static size_t AddCapped(size_t total, size_t bytes) {
    if (bytes > kMaxInlineBytes || total + bytes > kMaxInlineBytes) return kMaxInlineBytes + 1;
    return total + bytes;
  }

  const std::string where_;
  size_t sent_ = 0;
  size_t received_ = 0;
};

// How many tensors of `layout` an op takes, where the client can tell without knowing the group
// size; -1 = any number (the sidecar checks it).
int FixedTensorCount(TensorLayout layout) {
  switch (layout) {
    case TensorLayout::kNone:
      return 0;
    case TensorLayout::kOne:
    case TensorLayout::kOneOfGroupSize:
    case TensorLayout::kOneSplit:
      return 1;
    case TensorLayout::kOnePerRank:
    case TensorLayout::kOnePerRankOnRoot:
    case TensorLayout::kList:
    case TensorLayout::kListTimesGroupSize:
      return -1;
  }
  return -1;
}

// -1 = any number.
Status ExpectTensors(const std::string& where, const CollectiveArgs& args, int inputs,
                     int outputs) {
  auto check = [&](const std::vector<ClientTensor>& tensors, int expected,
                   std::string_view role) -> Status {
    if (expected < 0 || tensors.size() == static_cast<size_t>(expected)) return Status::Ok();
    return Status::InvalidArgument(where + ": expected " + std::to_string(expected) + " " +
                                   std::string(role) + "tensor(s), got " +
                                   std::to_string(tensors.size()));
  };
  COLLECTIVED_RETURN_IF_ERROR(
      check(args.inputs, inputs, TraitsOf(args.type).in_place ? "" : "input "));
  return check(args.outputs, outputs, "output ");
}

Status NeedAtLeastOne(const std::string& where, const std::vector<ClientTensor>& tensors) {
  if (!tensors.empty()) return Status::Ok();
  return Status::InvalidArgument(where + ": needs at least one tensor");
}

std::string DescribeWork(std::string_view op, uint64_t client_op_id, const std::string& group) {
  return std::string(op) + " (client op " + std::to_string(client_op_id) + ") on group '" + group +
         "'";
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ClientTensor, CollectiveType

ClientTensor ClientTensor::Shm(const RegisteredBuffer& buffer, size_t offset, DType dtype,
                               size_t count) {
  ClientTensor tensor;
  tensor.dtype = dtype;
  tensor.count = count;
  tensor.shm = &buffer;
  tensor.offset = offset;
  return tensor;
}

ClientTensor ClientTensor::Inline(void* data, DType dtype, size_t count) {
  ClientTensor tensor;
  tensor.dtype = dtype;
  tensor.count = count;
  tensor.host = data;
  return tensor;
}

ClientTensor ClientTensor::Cuda(void* data, int device, DType dtype, size_t count, void* stream) {
  ClientTensor tensor;
  tensor.dtype = dtype;
  tensor.count = count;
  tensor.cuda = data;
  tensor.cuda_device = device;
  tensor.cuda_stream = stream;
  return tensor;
}

size_t ClientTensor::bytes() const {
  const size_t element = DTypeSize(dtype);
  if (element != 0 && count > std::numeric_limits<size_t>::max() / element) {
    return std::numeric_limits<size_t>::max();
  }
  return count * element;
}

// ---------------------------------------------------------------------------------------------
// client_internal

namespace client_internal {

Status BuildCollectiveRequest(const std::string& group, const CollectiveArgs& args,
                              v1::CollectiveRequest* request) {
  const std::string where = std::string(OpKindName(args.type)) + " on group '" + group + "'";
  if (args.timeout.count() < 0) {
    return Status::InvalidArgument(where + ": negative timeout " +
                                   std::to_string(args.timeout.count()) +
                                   " ms (0 means the group's timeout)");
  }
  request->Clear();
  request->set_group(group);
  request->set_timeout_ms(args.timeout.count());
  if (!IsValidOpKind(args.type)) {
    return Status::InvalidArgument("unknown collective type " +
                                   std::to_string(static_cast<int>(args.type)) + " on group '" +
                                   group + "'");
  }
  // The number of tensors the type's layout fixes (engine/op_traits.h); the sidecar checks the
  // rest, which depends on the group size.
  const OpTraits& traits = TraitsOf(args.type);
  COLLECTIVED_RETURN_IF_ERROR(ExpectTensors(where, args, FixedTensorCount(traits.inputs),
                                            FixedTensorCount(traits.outputs)));
  if (traits.inputs == TensorLayout::kList) {
    COLLECTIVED_RETURN_IF_ERROR(NeedAtLeastOne(where, args.inputs));
  }
  TensorFiller fill(where);

  switch (args.type) {
    case CollectiveType::kAllReduce: {
      v1::AllReduce* op = request->mutable_allreduce();
      COLLECTIVED_RETURN_IF_ERROR(fill.InPlace(args.inputs[0], 0, op->mutable_tensor()));
      ToProto(args.reduce_op, op->mutable_op());
      break;
    }
    case CollectiveType::kAllReduceCoalesced: {
      v1::AllReduceCoalesced* op = request->mutable_allreduce_coalesced();
      COLLECTIVED_RETURN_IF_ERROR(fill.InPlaces(args.inputs, op->mutable_tensors()));
      ToProto(args.reduce_op, op->mutable_op());
      break;
    }
    case CollectiveType::kBroadcast: {
      v1::Broadcast* op = request->mutable_broadcast();
      COLLECTIVED_RETURN_IF_ERROR(fill.InPlace(args.inputs[0], 0, op->mutable_tensor()));
      op->set_root(args.root);
      break;
    }
    case CollectiveType::kReduce: {
      v1::Reduce* op = request->mutable_reduce();
      COLLECTIVED_RETURN_IF_ERROR(fill.InPlace(args.inputs[0], 0, op->mutable_tensor()));
      op->set_root(args.root);
      ToProto(args.reduce_op, op->mutable_op());
      break;
    }
    case CollectiveType::kAllGather: {
      v1::AllGather* op = request->mutable_allgather();
      COLLECTIVED_RETURN_IF_ERROR(fill.Input(args.inputs[0], 0, op->mutable_input()));
      COLLECTIVED_RETURN_IF_ERROR(fill.Outputs(args.outputs, op->mutable_outputs()));
      break;
    }
    case CollectiveType::kAllGatherIntoTensor: {
      v1::AllGatherIntoTensor* op = request->mutable_allgather_into_tensor();
      COLLECTIVED_RETURN_IF_ERROR(fill.Input(args.inputs[0], 0, op->mutable_input()));
      COLLECTIVED_RETURN_IF_ERROR(fill.Output(args.outputs[0], 0, op->mutable_output()));
      break;
    }
    case CollectiveType::kAllGatherCoalesced: {
      v1::AllGatherCoalesced* op = request->mutable_allgather_coalesced();
      COLLECTIVED_RETURN_IF_ERROR(fill.Inputs(args.inputs, op->mutable_inputs()));
      COLLECTIVED_RETURN_IF_ERROR(fill.Outputs(args.outputs, op->mutable_outputs()));
      break;
    }
    case CollectiveType::kReduceScatter: {
      v1::ReduceScatter* op = request->mutable_reduce_scatter();
      COLLECTIVED_RETURN_IF_ERROR(fill.Inputs(args.inputs, op->mutable_inputs()));
      COLLECTIVED_RETURN_IF_ERROR(fill.Output(args.outputs[0], 0, op->mutable_output()));
      ToProto(args.reduce_op, op->mutable_op());
      break;
    }
    case CollectiveType::kReduceScatterTensor: {
      v1::ReduceScatterTensor* op = request->mutable_reduce_scatter_tensor();
      COLLECTIVED_RETURN_IF_ERROR(fill.Input(args.inputs[0], 0, op->mutable_input()));
      COLLECTIVED_RETURN_IF_ERROR(fill.Output(args.outputs[0], 0, op->mutable_output()));
      ToProto(args.reduce_op, op->mutable_op());
      break;
    }
    case CollectiveType::kAllToAll: {
      v1::AllToAll* op = request->mutable_alltoall();
      COLLECTIVED_RETURN_IF_ERROR(fill.Inputs(args.inputs, op->mutable_inputs()));
      COLLECTIVED_RETURN_IF_ERROR(fill.Outputs(args.outputs, op->mutable_outputs()));
      break;
    }
    case CollectiveType::kAllToAllSingle: {
      v1::AllToAllSingle* op = request->mutable_alltoall_single();
      COLLECTIVED_RETURN_IF_ERROR(fill.Input(args.inputs[0], 0, op->mutable_input()));
      COLLECTIVED_RETURN_IF_ERROR(fill.Output(args.outputs[0], 0, op->mutable_output()));
      op->mutable_input_splits()->Add(args.input_splits.begin(), args.input_splits.end());
      op->mutable_output_splits()->Add(args.output_splits.begin(), args.output_splits.end());
      break;
    }
    case CollectiveType::kGather: {
      v1::Gather* op = request->mutable_gather();
      COLLECTIVED_RETURN_IF_ERROR(fill.Input(args.inputs[0], 0, op->mutable_input()));
      COLLECTIVED_RETURN_IF_ERROR(fill.Outputs(args.outputs, op->mutable_outputs()));
      op->set_root(args.root);
      break;
    }
    case CollectiveType::kScatter: {
      v1::Scatter* op = request->mutable_scatter();
      COLLECTIVED_RETURN_IF_ERROR(fill.Inputs(args.inputs, op->mutable_inputs()));
      COLLECTIVED_RETURN_IF_ERROR(fill.Output(args.outputs[0], 0, op->mutable_output()));
      op->set_root(args.root);
      break;
    }
    case CollectiveType::kBarrier: {
      request->mutable_barrier();
      break;
    }
    case CollectiveType::kSend: {
      v1::Send* op = request->mutable_send();
      COLLECTIVED_RETURN_IF_ERROR(fill.Input(args.inputs[0], 0, op->mutable_tensor()));
      op->set_dst(args.peer);
      op->set_tag(args.tag);
      break;
    }
    case CollectiveType::kRecv: {
      v1::Recv* op = request->mutable_recv();
      COLLECTIVED_RETURN_IF_ERROR(fill.Output(args.outputs[0], 0, op->mutable_tensor()));
      op->set_src(args.peer);
      op->set_tag(args.tag);
      break;
    }
  }
  return fill.CheckInlineTotals();
}

std::vector<ClientTensor> WritebackTensors(const CollectiveArgs& args) {
  return TraitsOf(args.type).in_place ? args.inputs : args.outputs;
}

Status ApplyInlineOutputs(CollectiveType type, const std::vector<ClientTensor>& writeback,
                          const v1::CollectiveResponse& response) {
  std::vector<size_t> inline_indices;
  for (size_t i = 0; i < writeback.size(); ++i) {
    if (writeback[i].is_inline()) inline_indices.push_back(i);
  }
  if (inline_indices.empty()) return Status::Ok();
  const size_t entries = static_cast<size_t>(response.outputs_size());
  // A non-root rank's reduce tensor is an input only: the sidecar may return nothing for it.
  if (entries == 0 && type == CollectiveType::kReduce) return Status::Ok();
  // The proto lists results "in the order of the op's output tensors" and leaves shm outputs
  // empty; accept both readings of that for ops that mix shm and inline outputs.
  const bool positional = entries == writeback.size();
  if (!positional && entries != inline_indices.size()) {
    return Status::Internal("the sidecar returned " + std::to_string(entries) +
                            " inline results for " + std::to_string(writeback.size()) +
                            " output tensors (" + std::to_string(inline_indices.size()) +
                            " of them inline)");
  }
  // Check every size before writing anything, so a bad response leaves caller memory alone.
  for (size_t k = 0; k < inline_indices.size(); ++k) {
    const size_t i = inline_indices[k];
    const std::string& bytes = response.outputs(static_cast<int>(positional ? i : k));
    const ClientTensor& tensor = writeback[i];
    const bool skipped_reduce_input = bytes.empty() && type == CollectiveType::kReduce;
    if (bytes.size() != tensor.bytes() && !skipped_reduce_input) {
      return Status::Internal("the sidecar returned " + std::to_string(bytes.size()) +
                              " bytes for output " + std::to_string(i) + ", expected " +
                              std::to_string(tensor.bytes()) + " (" + std::to_string(tensor.count) +
                              " x " + std::string(DTypeName(tensor.dtype)) + ")");
    }
    if (!bytes.empty() && tensor.host == nullptr) {
      return Status::Internal("the sidecar returned bytes for output " + std::to_string(i) +
                              ", which has no host memory");
    }
  }
  for (size_t k = 0; k < inline_indices.size(); ++k) {
    const size_t i = inline_indices[k];
    const std::string& bytes = response.outputs(static_cast<int>(positional ? i : k));
    if (!bytes.empty()) std::memcpy(writeback[i].host, bytes.data(), bytes.size());
  }
  return Status::Ok();
}

Status StatusFromProto(const v1::Error& error) {
  const int kind = static_cast<int>(error.kind());
  if (kind == 0) return Status::Ok();
  if (kind < 0 || kind > static_cast<int>(kLastErrorKind)) {
    return Status::Internal("the sidecar reported an error of unknown kind " +
                            std::to_string(kind) + ": " + error.message());
  }
  return Status(static_cast<ErrorKind>(kind), error.message().empty()
                                                  ? std::string("(the sidecar gave no message)")
                                                  : error.message());
}

}  // namespace client_internal

// ---------------------------------------------------------------------------------------------
// ClientWork

ClientWork::ClientWork(std::string group, CollectiveType type, uint64_t client_op_id,
                       std::vector<ClientTensor> writeback)
    : group_(std::move(group)),
      type_(type),
      client_op_id_(client_op_id),
      writeback_(std::move(writeback)),
      future_(promise_.future()) {}

Status ClientWork::Wait(std::optional<milliseconds> timeout) const {
  if (!timeout.has_value()) return future_.Wait();
  static_cast<void>(future_.Wait(*timeout));
  // The op's own failure may be a Timeout too; only a wait that ended first gets this message.
  if (IsCompleted()) return future_.status();
  return WaitTimedOut(*timeout);
}

Status ClientWork::WaitStream(void* cuda_stream, std::optional<milliseconds> timeout) const {
  if (cuda_device_ < 0) return Wait(timeout);
  std::string event;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [this] { return completing_ || !completion_event_.empty(); };
    if (!timeout.has_value()) {
      enqueued_cv_.wait(lock, ready);
    } else if (!enqueued_cv_.wait_for(lock, std::max(*timeout, milliseconds(0)), ready)) {
      return WaitTimedOut(*timeout);
    }
    // Completed: its GPU work ran (the sidecar saw its stream finish); Wait returns at once.
    if (!completing_) event = completion_event_;
  }
  if (event.empty()) return Wait(timeout);
  Status ordered = WaitForSidecarEvent(cuda_device_, cuda_stream, event);
  return ordered.ok() ? ordered : ordered.WithContext(DescribeWork(op(), client_op_id_, group_));
}

void ClientWork::MarkEnqueued(const std::string& completion_event) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completing_ || completion_event.empty()) return;
    completion_event_ = completion_event;
  }
  enqueued_cv_.notify_all();
}

Status ClientWork::WaitTimedOut(milliseconds timeout) const {
  return Status::Timeout("Timeout: " + DescribeWork(op(), client_op_id_, group_) +
                         " Timed out: it did not complete within " +
                         std::to_string(std::max<int64_t>(timeout.count(), 0)) +
                         " ms; the op keeps running until it completes or its own timeout "
                         "passes");
}

uint64_t ClientWork::sequence_number() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sequence_number_;
}

int ClientWork::source_rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return source_rank_;
}

std::chrono::microseconds ClientWork::duration() const {
  std::lock_guard<std::mutex> lock(mu_);
  return duration_;
}

bool ClientWork::CompleteFrom(const v1::CollectiveResponse& response) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completing_) return false;
    completing_ = true;
    sequence_number_ = response.sequence_number();
    if (type_ == CollectiveType::kRecv) source_rank_ = response.source_rank();
    duration_ = std::chrono::microseconds(response.duration_us());
  }
  enqueued_cv_.notify_all();
  Status status = client_internal::StatusFromProto(response.error());
  if (status.ok()) {
    status = client_internal::ApplyInlineOutputs(type_, writeback_, response);
    if (!status.ok()) status = status.WithContext(DescribeWork(op(), client_op_id_, group_));
  }
  if (status.ok()) return promise_.SetValue();
  return promise_.SetError(std::move(status));
}

bool ClientWork::Fail(Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (completing_) return false;
    completing_ = true;
  }
  enqueued_cv_.notify_all();
  return promise_.SetError(std::move(status));
}

// ---------------------------------------------------------------------------------------------
// Client

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

  // Returns InvalidArgument for a tensor on a buffer that is not (or no longer) this client's:
  // another session's buffer id means nothing to the sidecar, and a freed one is gone.
  // REQUIRES: buffers_mu held.
  Status CheckBuffersOwned(const std::string& group, const CollectiveArgs& args) const;
  void ReadLoop();
  // Registers the memory behind `fd` (not taken) with the sidecar over the fd channel,
  // connecting and binding it on first use. Returns the buffer id.
  StatusOr<uint64_t> RegisterFd(int fd, size_t bytes);
  // REQUIRES: fd_channel_mu held.
  Status ConnectFdChannel();
  // Opens the session's submission ring over the fd channel and starts its reader; on failure
  // the client keeps to the stream (ring_error says why).
  void OpenRing();
  // Takes the ring's completions until the session or the ring ends; then fails the ops that
  // were submitted through it and are still pending.
  void RingLoop();
  // Keeps a group's collectives in issue order across the ring and the stream (the sidecar
  // numbers them as they arrive and the two paths race): before the first op of one path
  // follows ops of the other, the last of those is awaited (a group's collectives complete in
  // order).
  void Fence(const std::string& group, bool via_ring, const std::shared_ptr<ClientWork>& work);
  void HandleCompletion(const v1::CollectiveResponse& completion);
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
  std::string fd_channel_token;  // one-time; empty for a TCP session

  // The session's fd channel, connected on the first registration.
  std::mutex fd_channel_mu;
  int fd_channel = -1;           // guarded by fd_channel_mu
  uint64_t next_fd_request = 1;  // guarded by fd_channel_mu

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

  std::mutex buffers_mu;
  std::map<const RegisteredBuffer*, std::unique_ptr<RegisteredBuffer>> buffers;  // buffers_mu

  std::unique_ptr<SubmissionRingClient> ring;  // set before ring_reader starts
  std::thread ring_reader;
  std::atomic<bool> ring_usable{false};
  std::string ring_error;  // guarded by mu
  // guarded by mu: the last collective of each group and whether it took the ring.
  std::map<std::string, std::pair<bool, std::shared_ptr<ClientWork>>> last_submit;
};

void Client::Impl::OpenRing() {
  int ring_fd = -1;
  Status opened;
  {
    std::lock_guard<std::mutex> lock(fd_channel_mu);
    if (fd_channel < 0) opened = ConnectFdChannel();
    if (opened.ok()) {
      FdChannelMessage request;
      request.kind = FdChannelKind::kOpenRing;
      request.request_id = next_fd_request++;
      opened = SendFdChannelMessage(fd_channel, request);
      if (opened.ok()) {
        StatusOr<FdChannelMessage> answer = ReceiveFdChannelMessage(fd_channel, &ring_fd);
        if (!answer.ok()) {
          opened = answer.status();
        } else if (answer->error_kind != 0) {
          opened = Status(static_cast<ErrorKind>(answer->error_kind), answer->payload);
        } else if (ring_fd < 0) {
          opened = Status::Internal("the sidecar opened a ring but sent no descriptor");
        }
      }
    }
  }
  std::string why;
  if (opened.ok()) {
    ring = SubmissionRingClient::Attach(ring_fd, &why);
  } else {
    why = opened.message();
  }
  if (ring_fd >= 0) close(ring_fd);
  if (!ring) {
    std::lock_guard<std::mutex> lock(mu);
    ring_error = why;
    return;
  }
  ring_usable = true;
  ring_reader = std::thread([this] { RingLoop(); });
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
    int channel;
    {
      std::lock_guard<std::mutex> lock(fd_channel_mu);
      channel = fd_channel;
    }
    pollfd watched{channel, POLLRDHUP, 0};
    if (channel < 0 || poll(&watched, 1, 0) != 0) {
      why = "the sidecar closed the session's fd channel (it went away)";
      break;
    }
  }
  std::vector<std::shared_ptr<ClientWork>> stranded;
  Status failure;
  {
    std::lock_guard<std::mutex> lock(mu);
    ring_usable = false;
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
  for (auto& work : stranded) work->Fail(failure);
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

Status Client::Impl::CheckBuffersOwned(const std::string& group, const CollectiveArgs& args) const {
  auto check = [&](const std::vector<ClientTensor>& tensors, std::string_view role) -> Status {
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].shm == nullptr || buffers.count(tensors[i].shm) != 0) continue;
      return Status::InvalidArgument(
          std::string(OpKindName(args.type)) + " on group '" + group + "': " + std::string(role) +
          " " + std::to_string(i) +
          " refers to a shared-memory buffer that this client did not allocate or has freed");
    }
    return Status::Ok();
  };
  COLLECTIVED_RETURN_IF_ERROR(
      check(args.inputs, TraitsOf(args.type).in_place ? "tensor" : "input tensor"));
  return check(args.outputs, "output tensor");
}

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
      fd_channel_token = event.opened().fd_channel().token();
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
      why = Status::Unavailable("cannot open a session with the sidecar at " + address + ": " +
                                FromGrpcStatus(final_status).message());
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
      if (!cv.wait_for(lock, kCloseGrace, [this] { return reader_done; })) {
        lock.unlock();
        attach_context.TryCancel();
      }
    }
    reader.join();
  }
  if (ring_reader.joinable()) ring_reader.join();  // it sees the session end within 100 ms
  ring.reset();
  {
    std::lock_guard<std::mutex> lock(fd_channel_mu);
    if (fd_channel >= 0) close(fd_channel);
    fd_channel = -1;
  }
  // After the session: the sidecar releases its mappings when the session ends.
  std::lock_guard<std::mutex> lock(buffers_mu);
  buffers.clear();
}

Status Client::Impl::ConnectFdChannel() {
  StatusOr<std::string> target_name = ToGrpcTarget(address);
  if (!target_name.ok() || target_name->rfind("unix:", 0) != 0 || fd_channel_token.empty()) {
    return Status::PermissionDenied(
        "session " + session_label + " to " + address +
        " cannot register memory: only a client on the sidecar's Unix socket hands memory over "
        "(as a file descriptor); over TCP send tensors inline");
  }
  const std::string path = FdChannelPath(target_name->substr(std::string("unix:").size()));
  sockaddr_un target{};
  target.sun_family = AF_UNIX;
  if (path.size() >= sizeof(target.sun_path)) {
    return Status::InvalidArgument("fd-channel path " + path + " is too long");
  }
  std::memcpy(target.sun_path, path.c_str(), path.size() + 1);
  const int socket_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (socket_fd < 0) {
    return Status::Unavailable(std::string("cannot create a socket: ") + std::strerror(errno));
  }
  const timeval limit{static_cast<time_t>(kCallDeadline.count() / 1000), 0};
  setsockopt(socket_fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof(limit));
  setsockopt(socket_fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof(limit));
  if (connect(socket_fd, reinterpret_cast<sockaddr*>(&target), sizeof(target)) != 0) {
    const int error = errno;
    close(socket_fd);
    return Status::Unavailable("cannot connect to the sidecar's fd channel " + path + ": " +
                               std::strerror(error));
  }
  FdChannelMessage bind;
  bind.kind = FdChannelKind::kBind;
  bind.request_id = next_fd_request++;
  bind.payload = fd_channel_token;
  fd_channel_token.clear();  // one-time, whatever the answer
  Status bound = SendFdChannelMessage(socket_fd, bind);
  if (bound.ok()) {
    StatusOr<FdChannelMessage> answer = ReceiveFdChannelMessage(socket_fd, nullptr);
    if (!answer.ok()) {
      bound = answer.status();
    } else if (answer->error_kind != 0) {
      bound = Status(static_cast<ErrorKind>(answer->error_kind), answer->payload);
    }
  }
  if (!bound.ok()) {
    close(socket_fd);
    return bound.WithContext("binding the fd channel " + path);
  }
  fd_channel = socket_fd;
  return Status::Ok();
}

StatusOr<uint64_t> Client::Impl::RegisterFd(int fd, size_t bytes) {
  std::lock_guard<std::mutex> lock(fd_channel_mu);
  if (fd_channel < 0) COLLECTIVED_RETURN_IF_ERROR(ConnectFdChannel());
  FdChannelMessage request;
  request.kind = FdChannelKind::kRegister;
  request.request_id = next_fd_request++;
  request.value0 = bytes;
  Status sent = SendFdChannelMessage(fd_channel, request, fd);
  StatusOr<FdChannelMessage> answer =
      sent.ok() ? ReceiveFdChannelMessage(fd_channel, nullptr) : StatusOr<FdChannelMessage>(sent);
  Status broken = !answer.ok() ? answer.status()
                  : answer->request_id != request.request_id
                      ? Status::Internal("the fd channel answered request " +
                                         std::to_string(answer->request_id) + " instead of " +
                                         std::to_string(request.request_id))
                      : Status::Ok();
  if (!broken.ok()) {
    // The sidecar went away, or answered out of order: the channel is dropped.
    close(fd_channel);
    fd_channel = -1;
    return broken;
  }
  if (answer->error_kind != 0) {
    return Status(static_cast<ErrorKind>(answer->error_kind), answer->payload);
  }
  return answer->value0;
}

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
    const char* ring_setting = std::getenv("COLLECTIVED_RING");
    if (options.use_ring && !(ring_setting != nullptr && std::string(ring_setting) == "0") &&
        !impl->fd_channel_token.empty()) {
      impl->OpenRing();
    }
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

Status Client::session_status() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->session_status;
}

StatusOr<const RegisteredBuffer*> Client::AllocateBuffer(size_t bytes) {
  COLLECTIVED_RETURN_IF_ERROR(session_status());
  StatusOr<std::unique_ptr<ShmBuffer>> shm = ShmBuffer::Create(bytes);
  if (!shm.ok()) return shm.status();
  StatusOr<uint64_t> id = impl_->RegisterFd((*shm)->fd(), bytes);
  if (!id.ok())
    return id.status().WithContext("cannot register a buffer of " + std::to_string(bytes) +
                                   " bytes");
  close((*shm)->TakeFd());  // the sidecar holds its own; the mapping keeps the memory

  auto buffer = std::make_unique<RegisteredBuffer>();
  buffer->shm = std::move(*shm);
  buffer->buffer_id = *id;
  const RegisteredBuffer* handle = buffer.get();
  std::lock_guard<std::mutex> lock(impl_->buffers_mu);
  impl_->buffers.emplace(handle, std::move(buffer));
  return handle;
}

Status Client::FreeBuffer(const RegisteredBuffer* buffer) {
  std::unique_ptr<RegisteredBuffer> owned;
  {
    std::lock_guard<std::mutex> lock(impl_->buffers_mu);
    auto it = impl_->buffers.find(buffer);
    if (it == impl_->buffers.end()) {
      return Status::InvalidArgument(
          "FreeBuffer: the buffer was not allocated by this client, or was freed already");
    }
    owned = std::move(it->second);
    impl_->buffers.erase(it);
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
  return info;
}

Status Client::DestroyGroup(const std::string& name) {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(kCallDeadline));
  v1::DestroyGroupRequest request;
  request.set_session_id(impl_->session_id);
  request.set_group(name);
  v1::DestroyGroupResponse response;
  return FromGrpcStatus(impl_->groups_stub->DestroyGroup(&context, request, &response), &context);
}

std::shared_ptr<ClientWork> Client::Submit(const std::string& group, CollectiveArgs args) {
  const uint64_t id = impl_->next_op_id.fetch_add(1);
  auto work =
      std::make_shared<ClientWork>(group, args.type, id, client_internal::WritebackTensors(args));
  v1::SessionRequest message;
  v1::CollectiveRequest* request = message.mutable_submit();
  Status built;
  {
    // Held while building, so that FreeBuffer cannot free a buffer the request is reading.
    std::lock_guard<std::mutex> lock(impl_->buffers_mu);
    built = impl_->CheckBuffersOwned(group, args);
    if (built.ok()) built = client_internal::BuildCollectiveRequest(group, args, request);
  }
  if (!built.ok()) {
    work->Fail(std::move(built));
    return work;
  }
  request->set_client_op_id(id);
  // CUDA ops hear when their GPU work is enqueued (WaitStream). An op's tensors share one
  // device (the sidecar refuses a mix), so the first CUDA tensor names it.
  for (const auto* tensors : {&args.inputs, &args.outputs}) {
    auto cuda = std::find_if(tensors->begin(), tensors->end(),
                             [](const ClientTensor& tensor) { return tensor.cuda != nullptr; });
    if (cuda == tensors->end()) continue;
    work->cuda_device_ = cuda->cuda_device;
    request->set_stream_ordered(true);
    break;
  }
  // The ring takes collectives whose request and inline results are small (a send's order is
  // per peer and tag, which a fence across paths could break: point-to-point takes the stream).
  std::string payload;
  bool via_ring = false;
  if (impl_->ring_usable && !IsPointToPoint(args.type)) {
    size_t inline_results = 0;
    for (const ClientTensor& tensor : work->writeback_) inline_results += tensor.bytes();
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
