// OpWire: an op's message inside collectived.v1.CollectiveRequest, read and written through
// protobuf reflection by the field rules of engine/vocabulary/op_traits.h (WireFieldsOf). The
// sidecar translates, and the C++ client builds, every op with one piece of code each instead of a
// switch over the ops: a new op needs no code here, in the translation or in the request
// builders (its kind, table row, proto message, algorithm and clients' public calls it does).
//
// The descriptors are looked up once; a proto that does not follow the rules is a build defect
// (tests/rpc/op_wire_test.cc holds every rule against the descriptor) and stops the process at
// the first use with the field that is missing.
//
// Thread-safety: OpWire objects are immutable and shared.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "collectived/v1/collectives.pb.h"
#include "engine/vocabulary/op.h"

namespace collectived {

class OpWire {
 public:
  using Message = google::protobuf::Message;
  using Field = google::protobuf::FieldDescriptor;

  // The wire fields of `kind`. REQUIRES IsValidOpKind(kind).
  static const OpWire& Of(OpKind kind);
  // The kind of the op `request` carries; nullopt when it carries none.
  static std::optional<OpKind> KindOf(const v1::CollectiveRequest& request);

  OpKind kind() const { return kind_; }

  // --- reading (the sidecar) ---
  const Message& Body(const v1::CollectiveRequest& request) const;
  // The tensors of each side, in order (none for a side the op does not take).
  std::vector<const v1::Tensor*> Inputs(const Message& body) const;
  std::vector<const v1::Tensor*> Outputs(const Message& body) const;
  // The root (rooted ops), reduce op (reducing ops), peer and tag (send/recv), splits
  // (alltoall_single); 0, a default ReduceOp or empty for an op without them.
  int32_t Root(const Message& body) const;
  v1::ReduceOp ReduceOp(const Message& body) const;
  int32_t Peer(const Message& body) const;
  int64_t Tag(const Message& body) const;
  std::vector<uint64_t> InputSplits(const Message& body) const;
  std::vector<uint64_t> OutputSplits(const Message& body) const;

  // --- writing (clients) ---
  // Selects the op in `request` and returns its (empty) message.
  Message* MutableBody(v1::CollectiveRequest* request) const;
  // A new tensor of each side (the single one for a single-tensor side).
  v1::Tensor* AddInput(Message* body) const;
  v1::Tensor* AddOutput(Message* body) const;
  void SetRoot(Message* body, int32_t root) const;
  v1::ReduceOp* MutableReduceOp(Message* body) const;
  void SetPeer(Message* body, int32_t peer) const;
  void SetTag(Message* body, int64_t tag) const;
  void SetSplits(Message* body, const std::vector<uint64_t>& input_splits,
                 const std::vector<uint64_t>& output_splits) const;

 private:
  explicit OpWire(OpKind kind);

  std::vector<const v1::Tensor*> Tensors(const Message& body, const Field* field) const;
  v1::Tensor* AddTensor(Message* body, const Field* field) const;

  OpKind kind_;
  const Field* op_ = nullptr;
  const Field* inputs_ = nullptr;  // null when the op takes no inputs
  const Field* outputs_ = nullptr;
  const Field* root_ = nullptr;
  const Field* reduce_op_ = nullptr;
  const Field* peer_ = nullptr;
  const Field* tag_ = nullptr;
  const Field* input_splits_ = nullptr;
  const Field* output_splits_ = nullptr;
};

}  // namespace collectived
