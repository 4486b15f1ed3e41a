// Requests from CollectiveArgs: the tensors a client names (shared memory, inline bytes, CUDA)
// written into collectived.v1.CollectiveRequest by the rules of the op table (rpc/op_wire.h), the
// results of inline outputs copied back, and the errors of the wire turned into Statuses.
#include <limits>

#include "clients/cpp/client_impl.h"
#include "clients/cpp/cuda_tensor_export.h"
#include "engine/vocabulary/op_traits.h"
#include "rpc/limits.h"
#include "rpc/op_wire.h"

namespace collectived {
namespace client_detail {

std::string DescribeWork(std::string_view op, uint64_t client_op_id, const std::string& group) {
  return std::string(op) + " (client op " + std::to_string(client_op_id) + ") on group '" + group +
         "'";
}

}  // namespace client_detail

namespace {

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
  TensorFiller(std::string where, CudaVmmRegistrar* vmm, OpReadyLeases* leases)
      : where_(std::move(where)), vmm_(vmm), leases_(leases) {}

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
      ReadyEventLease* lease =
          leases_ != nullptr ? leases_->For(tensor.cuda_device, tensor.cuda_stream) : nullptr;
      StatusOr<ExportedCudaTensor> exported =
          ExportCudaTensor(tensor.cuda, bytes, tensor.cuda_device, tensor.cuda_stream, vmm_, lease);
      if (!exported.ok()) {
        return Status::InvalidArgument(what + " (CUDA device " +
                                       std::to_string(tensor.cuda_device) +
                                       "): " + exported.status().message());
      }
      if (!exported->vmm_registrations.empty()) {
        v1::CudaVmmRef* ref = out->mutable_cuda_vmm();
        for (uint64_t id : exported->vmm_registrations) ref->add_registration_ids(id);
        ref->set_offset(exported->offset);
        ref->set_length(exported->length);
        ref->set_device(exported->device);
        ref->set_event_handle(exported->event_handle);
        return Status::Ok();
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
  CudaVmmRegistrar* const vmm_;  // not owned; may be null
  OpReadyLeases* const leases_;  // not owned; null: ready events not leased
  size_t sent_ = 0;
  size_t received_ = 0;
};

// How many tensors of `layout` an op takes, where the client can tell without knowing the group
// size; -1 = any number (the sidecar checks it).
int FixedTensorCount(TensorLayout layout) {
  if (layout == TensorLayout::kNone) return 0;
  return IsSingleTensorLayout(layout) ? 1 : -1;
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

}  // namespace

// ---------------------------------------------------------------------------------------------
// ClientTensor

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
                              v1::CollectiveRequest* request, CudaVmmRegistrar* vmm,
                              OpReadyLeases* leases) {
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
  // The number of tensors the type's layout fixes (engine/vocabulary/op_traits.h); the sidecar
  // checks the rest, which depends on the group size.
  const OpTraits& traits = TraitsOf(args.type);
  COLLECTIVED_RETURN_IF_ERROR(ExpectTensors(where, args, FixedTensorCount(traits.inputs),
                                            FixedTensorCount(traits.outputs)));
  if (traits.inputs == TensorLayout::kList) {
    COLLECTIVED_RETURN_IF_ERROR(NeedAtLeastOne(where, args.inputs));
  }
  // Every op is written by the rules of the op table (rpc/op_wire.h): in-place tensors send
  // their bytes and get the result back, inputs send theirs, outputs only get the result.
  TensorFiller fill(where, vmm, leases);
  const OpWire& wire = OpWire::Of(args.type);
  google::protobuf::Message* body = wire.MutableBody(request);
  for (size_t i = 0; i < args.inputs.size(); ++i) {
    v1::Tensor* tensor = wire.AddInput(body);
    COLLECTIVED_RETURN_IF_ERROR(traits.in_place ? fill.InPlace(args.inputs[i], i, tensor)
                                                : fill.Input(args.inputs[i], i, tensor));
  }
  for (size_t i = 0; i < args.outputs.size(); ++i) {
    COLLECTIVED_RETURN_IF_ERROR(fill.Output(args.outputs[i], i, wire.AddOutput(body)));
  }
  if (traits.reduces) ToProto(args.reduce_op, wire.MutableReduceOp(body));
  if (traits.rooted) wire.SetRoot(body, args.root);
  if (traits.point_to_point) {
    wire.SetPeer(body, args.peer);
    wire.SetTag(body, args.tag);
  }
  wire.SetSplits(body, args.input_splits, args.output_splits);
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

}  // namespace collectived
