#include "services/collectived/translate.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/reflection.h>

#include <cstring>
#include <functional>

#include "engine/op_traits.h"
#include "engine/utf8.h"
#include "rpc/limits.h"
#include "services/collectived/session_binding.h"

namespace collectived {
namespace {

// Calls fn for every v1.Tensor anywhere in `message` (whatever the op).
void ForEachTensor(const google::protobuf::Message& message,
                   const std::function<void(const v1::Tensor&)>& fn) {
  if (const auto* tensor = dynamic_cast<const v1::Tensor*>(&message)) {
    fn(*tensor);
    return;
  }
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const google::protobuf::FieldDescriptor* field : fields) {
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (field->is_repeated()) {
      for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
        ForEachTensor(reflection->GetRepeatedMessage(message, field, i), fn);
      }
    } else {
      ForEachTensor(reflection->GetMessage(message, field), fn);
    }
  }
}

// The sidecar allocates an inline tensor's bytes (an output's too, which the request gives only
// as a dtype and count): refuse, before allocating anything, a request whose inline tensors
// total more than a response could carry back. Returns the total.
StatusOr<size_t> CheckInlineBytes(const v1::CollectiveRequest& proto) {
  size_t total = 0;
  bool over = false;
  ForEachTensor(proto, [&](const v1::Tensor& t) {
    if (t.data_case() == v1::Tensor::kShm || t.data_case() == v1::Tensor::kCuda) return;
    if (!IsValidDType(static_cast<int32_t>(t.dtype()))) return;  // refused by translation
    const size_t element = std::max<size_t>(1, DTypeSize(static_cast<DType>(t.dtype())));
    if (t.count() > kMaxInlineBytes / element) {
      over = true;
      return;
    }
    total += t.count() * element;
    over |= total > kMaxInlineBytes;
  });
  if (!over) return total;
  return Status::InvalidArgument(
      "inline tensors of this request (outputs included) total more than " +
      std::to_string(kMaxInlineBytes) +
      " bytes, more than a message can carry back: use shared memory for big tensors");
}

// Where a request's shared-memory tensors come from: the calling session's buffers. The
// segments used are collected so that the answer can check them after the op.
struct TensorSource {
  const Session& session;
  std::vector<std::shared_ptr<ShmSegment>>* segments;
};

StatusOr<TensorView> TranslateTensor(const v1::Tensor& t, const TensorSource& source,
                                     std::string_view role, size_t index, bool is_output) {
  const std::string where = std::string(role) + " tensor " + std::to_string(index);
  if (!IsValidDType(static_cast<int32_t>(t.dtype())) || t.dtype() == v1::DTYPE_UNSPECIFIED) {
    return Status::InvalidArgument(where + ": unknown or unspecified dtype " +
                                   std::to_string(t.dtype()));
  }
  DType dtype = static_cast<DType>(t.dtype());
  const size_t element = DTypeSize(dtype);
  if (t.count() > (uint64_t{1} << 40) / element) {
    return Status::InvalidArgument(where + ": count " + std::to_string(t.count()) + " is absurd");
  }
  const size_t bytes = t.count() * element;
  switch (t.data_case()) {
    case v1::Tensor::kShm: {
      StatusOr<std::shared_ptr<ShmSegment>> segment = source.session.Buffer(t.shm().buffer_id());
      if (!segment.ok()) return segment.status().WithContext(where);
      StatusOr<TensorView> view =
          (*segment)->View(t.shm().offset(), t.shm().length(), dtype, t.count());
      if (!view.ok()) return view.status().WithContext(where);
      source.segments->push_back(std::move(*segment));
      return view;
    }
    case v1::Tensor::kInline:
    case v1::Tensor::DATA_NOT_SET: {
      if (t.data_case() == v1::Tensor::DATA_NOT_SET && !is_output && bytes > 0) {
        return Status::InvalidArgument(where + ": no data (give shm or inline bytes)");
      }
      const std::string& data = t.inline_();
      if (!data.empty() && data.size() != bytes) {
        return Status::InvalidArgument(where + ": " + std::to_string(data.size()) +
                                       " inline bytes for " + std::to_string(t.count()) + " x " +
                                       std::string(DTypeName(dtype)) + " (" +
                                       std::to_string(bytes) + " bytes)");
      }
      if (data.empty() && !is_output && bytes > 0) {
        return Status::InvalidArgument(where + ": inline input has no bytes");
      }
      auto storage = std::make_shared<std::vector<std::byte>>(bytes);
      if (!data.empty()) std::memcpy(storage->data(), data.data(), bytes);
      return TensorView{dtype, t.count(), storage->data(), storage, Device{}, nullptr};
    }
    case v1::Tensor::kCuda: {
      // A CUDA IPC handle is only meaningful, and only accepted, from a process on this node.
      if (source.session.binding() != kUnixBinding) {
        return Status::PermissionDenied(
            where +
            ": CUDA tensors are accepted only from clients on the "
            "sidecar's Unix socket (this session is attached over TCP)");
      }
      StatusOr<DeviceMemoryImporter*> importer = source.session.DeviceMemory();
      if (!importer.ok()) return importer.status().WithContext(where);
      const v1::CudaIpcRef& ref = t.cuda();
      DeviceTensorRef device_ref{ref.device(), ref.mem_handle(), ref.offset(), ref.length(),
                                 ref.event_handle()};
      StatusOr<TensorView> view = (*importer)->Import(device_ref, dtype, t.count());
      if (!view.ok()) return view.status().WithContext(where);
      return view;
    }
  }
  return Status::InvalidArgument(where + ": unknown tensor data");
}

Status TranslateList(const google::protobuf::RepeatedPtrField<v1::Tensor>& tensors,
                     const TensorSource& source, std::string_view role, bool is_output,
                     std::vector<TensorView>* out) {
  for (int i = 0; i < tensors.size(); ++i) {
    StatusOr<TensorView> view = TranslateTensor(tensors[i], source, role, i, is_output);
    if (!view.ok()) return view.status();
    out->push_back(std::move(*view));
  }
  return Status::Ok();
}

Status TranslateOne(const v1::Tensor& tensor, const TensorSource& source, std::string_view role,
                    bool is_output, std::vector<TensorView>* out) {
  StatusOr<TensorView> view = TranslateTensor(tensor, source, role, 0, is_output);
  if (!view.ok()) return view.status();
  out->push_back(std::move(*view));
  return Status::Ok();
}

ReduceOp TranslateReduceOp(const v1::ReduceOp& op) {
  ReduceOp result;
  result.kind = static_cast<ReduceOpKind>(op.kind());
  result.scale = op.kind() == v1::ReduceOp::PREMUL_SUM ? op.scale() : 1.0;
  return result;
}

bool IsInline(const v1::Tensor& t) {
  return t.data_case() != v1::Tensor::kShm && t.data_case() != v1::Tensor::kCuda;
}

}  // namespace

StatusOr<TranslatedRequest> TranslateRequest(const v1::CollectiveRequest& proto,
                                             const Session& session) {
  StatusOr<size_t> inline_bytes = CheckInlineBytes(proto);
  if (!inline_bytes.ok()) {
    return inline_bytes.status().WithContext("group '" + proto.group() + "'");
  }
  TranslatedRequest out;
  out.inline_bytes = *inline_bytes;
  const TensorSource source{session, &out.segments};
  OpRequest& r = out.request;
  r.timeout = std::chrono::milliseconds(proto.timeout_ms());
  // Output order for the response: in-place ops answer with their in/out tensors.
  std::vector<const v1::Tensor*> output_protos;
  auto in_place = [&](const auto& tensors) {
    for (const auto& t : tensors) output_protos.push_back(&t);
  };
  Status status;
  switch (proto.op_case()) {
    case v1::CollectiveRequest::kAllreduce:
      r.kind = OpKind::kAllReduce;
      r.reduce_op = TranslateReduceOp(proto.allreduce().op());
      status = TranslateOne(proto.allreduce().tensor(), source, "input", false, &r.inputs);
      output_protos.push_back(&proto.allreduce().tensor());
      break;
    case v1::CollectiveRequest::kAllreduceCoalesced:
      r.kind = OpKind::kAllReduceCoalesced;
      r.reduce_op = TranslateReduceOp(proto.allreduce_coalesced().op());
      status =
          TranslateList(proto.allreduce_coalesced().tensors(), source, "input", false, &r.inputs);
      in_place(proto.allreduce_coalesced().tensors());
      break;
    case v1::CollectiveRequest::kBroadcast:
      r.kind = OpKind::kBroadcast;
      r.root = proto.broadcast().root();
      // Non-root ranks may send an empty inline tensor: it only receives.
      status = TranslateOne(proto.broadcast().tensor(), source, "input", true, &r.inputs);
      output_protos.push_back(&proto.broadcast().tensor());
      break;
    case v1::CollectiveRequest::kReduce:
      r.kind = OpKind::kReduce;
      r.root = proto.reduce().root();
      r.reduce_op = TranslateReduceOp(proto.reduce().op());
      status = TranslateOne(proto.reduce().tensor(), source, "input", false, &r.inputs);
      output_protos.push_back(&proto.reduce().tensor());
      break;
    case v1::CollectiveRequest::kAllgather:
      r.kind = OpKind::kAllGather;
      status = TranslateOne(proto.allgather().input(), source, "input", false, &r.inputs);
      if (status.ok())
        status = TranslateList(proto.allgather().outputs(), source, "output", true, &r.outputs);
      in_place(proto.allgather().outputs());
      break;
    case v1::CollectiveRequest::kAllgatherIntoTensor:
      r.kind = OpKind::kAllGatherIntoTensor;
      status =
          TranslateOne(proto.allgather_into_tensor().input(), source, "input", false, &r.inputs);
      if (status.ok())
        status = TranslateOne(proto.allgather_into_tensor().output(), source, "output", true,
                              &r.outputs);
      output_protos.push_back(&proto.allgather_into_tensor().output());
      break;
    case v1::CollectiveRequest::kAllgatherCoalesced:
      r.kind = OpKind::kAllGatherCoalesced;
      status =
          TranslateList(proto.allgather_coalesced().inputs(), source, "input", false, &r.inputs);
      if (status.ok())
        status = TranslateList(proto.allgather_coalesced().outputs(), source, "output", true,
                               &r.outputs);
      in_place(proto.allgather_coalesced().outputs());
      break;
    case v1::CollectiveRequest::kReduceScatter:
      r.kind = OpKind::kReduceScatter;
      r.reduce_op = TranslateReduceOp(proto.reduce_scatter().op());
      status = TranslateList(proto.reduce_scatter().inputs(), source, "input", false, &r.inputs);
      if (status.ok())
        status = TranslateOne(proto.reduce_scatter().output(), source, "output", true, &r.outputs);
      output_protos.push_back(&proto.reduce_scatter().output());
      break;
    case v1::CollectiveRequest::kReduceScatterTensor:
      r.kind = OpKind::kReduceScatterTensor;
      r.reduce_op = TranslateReduceOp(proto.reduce_scatter_tensor().op());
      status =
          TranslateOne(proto.reduce_scatter_tensor().input(), source, "input", false, &r.inputs);
      if (status.ok())
        status = TranslateOne(proto.reduce_scatter_tensor().output(), source, "output", true,
                              &r.outputs);
      output_protos.push_back(&proto.reduce_scatter_tensor().output());
      break;
    case v1::CollectiveRequest::kAlltoall:
      r.kind = OpKind::kAllToAll;
      status = TranslateList(proto.alltoall().inputs(), source, "input", false, &r.inputs);
      if (status.ok())
        status = TranslateList(proto.alltoall().outputs(), source, "output", true, &r.outputs);
      in_place(proto.alltoall().outputs());
      break;
    case v1::CollectiveRequest::kAlltoallSingle: {
      const auto& a = proto.alltoall_single();
      r.kind = OpKind::kAllToAllSingle;
      r.input_splits.assign(a.input_splits().begin(), a.input_splits().end());
      r.output_splits.assign(a.output_splits().begin(), a.output_splits().end());
      status = TranslateOne(a.input(), source, "input", false, &r.inputs);
      if (status.ok()) status = TranslateOne(a.output(), source, "output", true, &r.outputs);
      output_protos.push_back(&a.output());
      break;
    }
    case v1::CollectiveRequest::kGather:
      r.kind = OpKind::kGather;
      r.root = proto.gather().root();
      status = TranslateOne(proto.gather().input(), source, "input", false, &r.inputs);
      if (status.ok())
        status = TranslateList(proto.gather().outputs(), source, "output", true, &r.outputs);
      in_place(proto.gather().outputs());
      break;
    case v1::CollectiveRequest::kScatter:
      r.kind = OpKind::kScatter;
      r.root = proto.scatter().root();
      status = TranslateList(proto.scatter().inputs(), source, "input", false, &r.inputs);
      if (status.ok())
        status = TranslateOne(proto.scatter().output(), source, "output", true, &r.outputs);
      output_protos.push_back(&proto.scatter().output());
      break;
    case v1::CollectiveRequest::kBarrier:
      r.kind = OpKind::kBarrier;
      break;
    case v1::CollectiveRequest::kSend:
      r.kind = OpKind::kSend;
      r.peer = proto.send().dst();
      r.tag = proto.send().tag();
      status = TranslateOne(proto.send().tensor(), source, "input", false, &r.inputs);
      break;
    case v1::CollectiveRequest::kRecv:
      r.kind = OpKind::kRecv;
      r.peer = proto.recv().src();
      r.tag = proto.recv().tag();
      status = TranslateOne(proto.recv().tensor(), source, "output", true, &r.outputs);
      output_protos.push_back(&proto.recv().tensor());
      break;
    case v1::CollectiveRequest::OP_NOT_SET:
      return Status::InvalidArgument(
          "request names no collective (set one of allreduce, broadcast, ...)");
  }
  if (!status.ok()) {
    return status.WithContext(std::string(OpKindName(r.kind)) + " on group '" + proto.group() +
                              "'");
  }
  out.outputs = TraitsOf(r.kind).in_place ? r.inputs : r.outputs;
  for (const v1::Tensor* t : output_protos) out.inline_output.push_back(IsInline(*t));
  return out;
}

v1::ErrorKind ToProtoErrorKind(ErrorKind kind) {
  return static_cast<v1::ErrorKind>(static_cast<int>(kind));
}

void FillError(const Status& status, v1::Error* error) {
  error->set_kind(ToProtoErrorKind(status.kind()));
  error->set_message(ValidUtf8(status.message()));  // a proto string: a client refuses non-UTF-8
  error->set_rank(-1);
}

void FillResponse(const TranslatedRequest& translated, const Work& work, uint64_t client_op_id,
                  v1::CollectiveResponse* response) {
  response->set_client_op_id(client_op_id);
  response->set_group(work.info().group);
  response->set_op(work.info().op);
  response->set_sequence_number(work.info().sequence_number);
  Status status = work.status();
  // A client that shrank its memory under the op voided the op's results on this rank.
  for (const auto& segment : translated.segments) {
    if (!status.ok()) break;
    status = segment->CheckIntact().WithContext(std::string(OpKindName(translated.request.kind)) +
                                                " on group '" + work.info().group + "'");
  }
  FillError(status, response->mutable_error());
  WorkTimes times = work.times();
  if (times.finished) {
    response->set_duration_us(
        std::chrono::duration_cast<std::chrono::microseconds>(*times.finished - times.created)
            .count());
  }
  if (translated.request.kind == OpKind::kRecv) {
    // The sender matched (a recv from any rank learns it then); the named source before that.
    const int sender = work.source_rank();
    response->set_source_rank(sender >= 0 ? sender : translated.request.peer);
  }
  if (!status.ok()) return;
  for (size_t i = 0; i < translated.outputs.size(); ++i) {
    const TensorView& t = translated.outputs[i];
    bool is_inline = i < translated.inline_output.size() && translated.inline_output[i];
    response->add_outputs(is_inline ? std::string(reinterpret_cast<const char*>(t.data), t.bytes())
                                    : std::string());
  }
}

}  // namespace collectived
