#include "services/collectived/translate.h"

#include <cstring>

#include "engine/vocabulary/op_traits.h"
#include "engine/vocabulary/utf8.h"
#include "rpc/limits.h"
#include "rpc/op_wire.h"
#include "services/collectived/session_binding.h"

namespace collectived {
namespace {

// The sidecar allocates an inline tensor's bytes (an output's too, which the request gives only
// as a dtype and count): refuse, before allocating anything, a request whose inline tensors
// total more than a response could carry back. Returns the total.
StatusOr<size_t> CheckInlineBytes(const std::vector<const v1::Tensor*>& inputs,
                                  const std::vector<const v1::Tensor*>& outputs) {
  size_t total = 0;
  bool over = false;
  for (const auto* side : {&inputs, &outputs}) {
    for (const v1::Tensor* t : *side) {
      if (t->data_case() == v1::Tensor::kShm || t->data_case() == v1::Tensor::kCuda ||
          t->data_case() == v1::Tensor::kCudaVmm) {
        continue;
      }
      if (!IsValidDType(static_cast<int32_t>(t->dtype()))) continue;  // refused by translation
      const size_t element = std::max<size_t>(1, DTypeSize(static_cast<DType>(t->dtype())));
      if (t->count() > kMaxInlineBytes / element) {
        over = true;
        continue;
      }
      total += t->count() * element;
      over |= total > kMaxInlineBytes;
    }
  }
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

// A device tensor (CUDA IPC or VMM memory): accepted only from this node's Unix socket (its
// handles mean nothing elsewhere), then opened by the session's importer.
StatusOr<TensorView> ImportDeviceTensor(const TensorSource& source, const std::string& where,
                                        const StatusOr<DeviceTensorRef>& ref, DType dtype,
                                        uint64_t count) {
  if (!IsUnixBinding(source.session.binding())) {
    return Status::PermissionDenied(where +
                                    ": CUDA tensors are accepted only from clients on the "
                                    "sidecar's Unix socket (this session is attached over TCP)");
  }
  if (!ref.ok()) return ref.status().WithContext(where);
  StatusOr<DeviceMemoryImporter*> importer = source.session.DeviceMemory();
  if (!importer.ok()) return importer.status().WithContext(where);
  StatusOr<TensorView> view = (*importer)->Import(*ref, dtype, count);
  if (!view.ok()) return view.status().WithContext(where);
  return view;
}

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
      const v1::CudaIpcRef& ref = t.cuda();
      return ImportDeviceTensor(
          source, where,
          DeviceTensorRef{
              ref.device(), ref.mem_handle(), ref.offset(), ref.length(), ref.event_handle(), {}},
          dtype, t.count());
    }
    case v1::Tensor::kCudaVmm:
      return ImportDeviceTensor(source, where, TranslateCudaVmmRef(t.cuda_vmm()), dtype, t.count());
  }
  return Status::InvalidArgument(where + ": unknown tensor data");
}

Status TranslateTensors(const std::vector<const v1::Tensor*>& tensors, const TensorSource& source,
                        std::string_view role, bool is_output, std::vector<TensorView>* out) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    StatusOr<TensorView> view = TranslateTensor(*tensors[i], source, role, i, is_output);
    if (!view.ok()) return view.status();
    out->push_back(std::move(*view));
  }
  return Status::Ok();
}

ReduceOp TranslateReduceOp(const v1::ReduceOp& op) {
  ReduceOp result;
  result.kind = static_cast<ReduceOpKind>(op.kind());
  result.scale = op.kind() == v1::ReduceOp::PREMUL_SUM ? op.scale() : 1.0;
  return result;
}

bool IsInline(const v1::Tensor& t) {
  return t.data_case() != v1::Tensor::kShm && t.data_case() != v1::Tensor::kCuda &&
         t.data_case() != v1::Tensor::kCudaVmm;
}

}  // namespace

StatusOr<DeviceTensorRef> TranslateCudaVmmRef(const v1::CudaVmmRef& ref) {
  const int ids = ref.registration_ids_size();
  if (ids == 0) {
    return Status::InvalidArgument(
        "CUDA VMM tensor without registration ids (name the physical "
        "allocations it spans, registered on the fd channel)");
  }
  if (static_cast<size_t>(ids) > kMaxVmmAllocationsPerTensor) {
    return Status::InvalidArgument("CUDA VMM tensor spans " + std::to_string(ids) +
                                   " allocations; at most " +
                                   std::to_string(kMaxVmmAllocationsPerTensor) + " are accepted");
  }
  if (ref.device() < 0) {
    return Status::InvalidArgument("CUDA VMM tensor on negative device " +
                                   std::to_string(ref.device()));
  }
  if (ref.offset() > UINT64_MAX - ref.length()) {
    return Status::InvalidArgument("CUDA VMM tensor's offset " + std::to_string(ref.offset()) +
                                   " + length " + std::to_string(ref.length()) + " overflows");
  }
  DeviceTensorRef out;
  out.device = ref.device();
  out.offset = ref.offset();
  out.length = ref.length();
  out.event_handle = ref.event_handle();
  out.vmm_registrations.assign(ref.registration_ids().begin(), ref.registration_ids().end());
  return out;
}

namespace {

StatusOr<StreamSignal> TranslateStreamSignal(const v1::StreamSignal& proto, const Session& session,
                                             const OpTraits& traits) {
  if (traits.point_to_point) {
    return Status::InvalidArgument(
        "a stream signal is for collectives (a send or recv completes on its own)");
  }
  return session.Signal(proto.buffer_id(), proto.offset(), proto.value());
}

}  // namespace

StatusOr<TranslatedRequest> TranslateRequest(const v1::CollectiveRequest& proto,
                                             const Session& session) {
  // Every op is read by the rules of the op table (engine/vocabulary/op_traits.h, rpc/op_wire.h).
  const std::optional<OpKind> kind = OpWire::KindOf(proto);
  if (!kind) {
    return Status::InvalidArgument(
        "request names no collective (set one of allreduce, broadcast, ...)");
  }
  const OpTraits& traits = TraitsOf(*kind);
  const OpWire& wire = OpWire::Of(*kind);
  const google::protobuf::Message& body = wire.Body(proto);
  const std::vector<const v1::Tensor*> inputs = wire.Inputs(body);
  const std::vector<const v1::Tensor*> outputs = wire.Outputs(body);
  StatusOr<size_t> inline_bytes = CheckInlineBytes(inputs, outputs);
  if (!inline_bytes.ok()) {
    return inline_bytes.status().WithContext("group '" + proto.group() + "'");
  }
  TranslatedRequest out;
  out.inline_bytes = *inline_bytes;
  const TensorSource source{session, &out.segments};
  OpRequest& r = out.request;
  r.timeout = std::chrono::milliseconds(proto.timeout_ms());
  r.kind = *kind;
  if (traits.reduces) r.reduce_op = TranslateReduceOp(wire.ReduceOp(body));
  if (traits.rooted) r.root = wire.Root(body);
  if (traits.point_to_point) {
    r.peer = wire.Peer(body);
    r.tag = wire.Tag(body);
  }
  r.input_splits = wire.InputSplits(body);
  r.output_splits = wire.OutputSplits(body);
  // An input that only receives on some ranks (broadcast's, off the root) may come empty.
  const bool inputs_only_receive = traits.in_place && traits.rooted && !traits.reduces;
  Status status = TranslateTensors(inputs, source, "input", inputs_only_receive, &r.inputs);
  if (status.ok()) status = TranslateTensors(outputs, source, "output", true, &r.outputs);
  // Output order for the response: in-place ops answer with their in/out tensors.
  const std::vector<const v1::Tensor*>& output_protos = traits.in_place ? inputs : outputs;
  if (!status.ok()) {
    return status.WithContext(std::string(OpKindName(r.kind)) + " on group '" + proto.group() +
                              "'");
  }
  if (proto.has_stream_signal()) {
    StatusOr<StreamSignal> signal = TranslateStreamSignal(proto.stream_signal(), session, traits);
    if (!signal.ok()) {
      return signal.status().WithContext(std::string(OpKindName(r.kind)) + " on group '" +
                                         proto.group() + "'");
    }
    r.stream_signal = std::move(*signal);
  }
  out.outputs = traits.in_place ? r.inputs : r.outputs;
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
  const Work::EpochStamp stamp = work.epoch_stamp();
  // A shrinking group's op queued while its membership changed got its number only then.
  response->set_sequence_number(stamp.sequence_number != 0 ? stamp.sequence_number
                                                           : work.info().sequence_number);
  response->set_epoch(stamp.epoch);
  response->set_epoch_first_sequence_number(stamp.epoch_first_sequence_number);
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
