#include "rpc/op_wire.h"

#include <google/protobuf/reflection.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "engine/vocabulary/op_traits.h"

namespace collectived {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// A proto that does not follow the rules of WireFieldsOf is a build defect, not bad input.
[[noreturn]] void Mismatch(const std::string& what) {
  std::fprintf(stderr, "collectived: the wire protocol does not match the op table: %s\n",
               what.c_str());
  std::abort();
}

const FieldDescriptor* Require(const Descriptor* message, std::string_view name,
                               FieldDescriptor::CppType type, bool repeated) {
  const FieldDescriptor* field = message->FindFieldByName(std::string(name));
  if (field == nullptr || field->cpp_type() != type || field->is_repeated() != repeated) {
    Mismatch(message->full_name() + " has no " + (repeated ? "repeated " : "") + "field '" +
             std::string(name) + "' of the expected type");
  }
  return field;
}

}  // namespace

OpWire::OpWire(OpKind kind) : kind_(kind) {
  const OpTraits& traits = TraitsOf(kind);
  const OpWireFields fields = WireFieldsOf(traits);
  const Descriptor* request = v1::CollectiveRequest::descriptor();
  op_ = Require(request, fields.op, FieldDescriptor::CPPTYPE_MESSAGE, false);
  if (op_->containing_oneof() == nullptr) Mismatch("'" + std::string(fields.op) + "' is no op");
  const Descriptor* body = op_->message_type();
  auto tensors = [&](std::string_view name, bool repeated) -> const FieldDescriptor* {
    if (name.empty()) return nullptr;
    const FieldDescriptor* field = Require(body, name, FieldDescriptor::CPPTYPE_MESSAGE, repeated);
    if (field->message_type() != v1::Tensor::descriptor()) {
      Mismatch(body->full_name() + "." + std::string(name) + " is not a Tensor");
    }
    return field;
  };
  inputs_ = tensors(fields.inputs, fields.inputs_repeated);
  outputs_ = tensors(fields.outputs, fields.outputs_repeated);
  if (traits.rooted) root_ = Require(body, "root", FieldDescriptor::CPPTYPE_INT32, false);
  if (traits.reduces) {
    reduce_op_ = Require(body, "op", FieldDescriptor::CPPTYPE_MESSAGE, false);
    if (reduce_op_->message_type() != v1::ReduceOp::descriptor()) {
      Mismatch(body->full_name() + ".op is not a ReduceOp");
    }
  }
  if (!fields.peer.empty()) {
    peer_ = Require(body, fields.peer, FieldDescriptor::CPPTYPE_INT32, false);
    tag_ = Require(body, "tag", FieldDescriptor::CPPTYPE_INT64, false);
  }
  if (traits.inputs == TensorLayout::kOneSplit) {
    input_splits_ = Require(body, "input_splits", FieldDescriptor::CPPTYPE_UINT64, true);
  }
  if (traits.outputs == TensorLayout::kOneSplit) {
    output_splits_ = Require(body, "output_splits", FieldDescriptor::CPPTYPE_UINT64, true);
  }
}

const OpWire& OpWire::Of(OpKind kind) {
  static const auto* wires = [] {
    auto* all = new std::vector<OpWire>();
    for (const OpTraits& traits : kOpTraits) all->push_back(OpWire(traits.kind));
    return all;
  }();
  return (
      *wires)[static_cast<size_t>(static_cast<int32_t>(kind) - static_cast<int32_t>(kFirstOpKind))];
}

std::optional<OpKind> OpWire::KindOf(const v1::CollectiveRequest& request) {
  // By the number of the oneof's field that is set (op_case), resolved once.
  static const auto* kinds = [] {
    auto* by_number = new std::map<int, OpKind>();
    for (const OpTraits& traits : kOpTraits)
      by_number->emplace(Of(traits.kind).op_->number(), traits.kind);
    return by_number;
  }();
  auto it = kinds->find(static_cast<int>(request.op_case()));
  if (it == kinds->end()) return std::nullopt;
  return it->second;
}

const google::protobuf::Message& OpWire::Body(const v1::CollectiveRequest& request) const {
  return request.GetReflection()->GetMessage(request, op_);
}

std::vector<const v1::Tensor*> OpWire::Tensors(const Message& body, const Field* field) const {
  std::vector<const v1::Tensor*> tensors;
  if (field == nullptr) return tensors;
  const google::protobuf::Reflection* reflection = body.GetReflection();
  if (!field->is_repeated()) {
    tensors.push_back(static_cast<const v1::Tensor*>(&reflection->GetMessage(body, field)));
    return tensors;
  }
  const int size = reflection->FieldSize(body, field);
  for (int i = 0; i < size; ++i) {
    tensors.push_back(
        static_cast<const v1::Tensor*>(&reflection->GetRepeatedMessage(body, field, i)));
  }
  return tensors;
}

std::vector<const v1::Tensor*> OpWire::Inputs(const Message& body) const {
  return Tensors(body, inputs_);
}

std::vector<const v1::Tensor*> OpWire::Outputs(const Message& body) const {
  return Tensors(body, outputs_);
}

int32_t OpWire::Root(const Message& body) const {
  return root_ ? body.GetReflection()->GetInt32(body, root_) : 0;
}

v1::ReduceOp OpWire::ReduceOp(const Message& body) const {
  if (!reduce_op_) return v1::ReduceOp();
  return static_cast<const v1::ReduceOp&>(body.GetReflection()->GetMessage(body, reduce_op_));
}

int32_t OpWire::Peer(const Message& body) const {
  return peer_ ? body.GetReflection()->GetInt32(body, peer_) : 0;
}

int64_t OpWire::Tag(const Message& body) const {
  return tag_ ? body.GetReflection()->GetInt64(body, tag_) : 0;
}

namespace {

std::vector<uint64_t> Splits(const google::protobuf::Message& body, const FieldDescriptor* field) {
  std::vector<uint64_t> splits;
  if (field == nullptr) return splits;
  const auto values = body.GetReflection()->GetRepeatedFieldRef<uint64_t>(body, field);
  splits.assign(values.begin(), values.end());
  return splits;
}

}  // namespace

std::vector<uint64_t> OpWire::InputSplits(const Message& body) const {
  return Splits(body, input_splits_);
}

std::vector<uint64_t> OpWire::OutputSplits(const Message& body) const {
  return Splits(body, output_splits_);
}

google::protobuf::Message* OpWire::MutableBody(v1::CollectiveRequest* request) const {
  return request->GetReflection()->MutableMessage(request, op_);
}

v1::Tensor* OpWire::AddTensor(Message* body, const Field* field) const {
  const google::protobuf::Reflection* reflection = body->GetReflection();
  if (field->is_repeated()) return static_cast<v1::Tensor*>(reflection->AddMessage(body, field));
  return static_cast<v1::Tensor*>(reflection->MutableMessage(body, field));
}

v1::Tensor* OpWire::AddInput(Message* body) const {
  return AddTensor(body, inputs_);
}

v1::Tensor* OpWire::AddOutput(Message* body) const {
  return AddTensor(body, outputs_);
}

void OpWire::SetRoot(Message* body, int32_t root) const {
  if (root_) body->GetReflection()->SetInt32(body, root_, root);
}

v1::ReduceOp* OpWire::MutableReduceOp(Message* body) const {
  if (!reduce_op_) return nullptr;
  return static_cast<v1::ReduceOp*>(body->GetReflection()->MutableMessage(body, reduce_op_));
}

void OpWire::SetPeer(Message* body, int32_t peer) const {
  if (peer_) body->GetReflection()->SetInt32(body, peer_, peer);
}

void OpWire::SetTag(Message* body, int64_t tag) const {
  if (tag_) body->GetReflection()->SetInt64(body, tag_, tag);
}

void OpWire::SetSplits(Message* body, const std::vector<uint64_t>& input_splits,
                       const std::vector<uint64_t>& output_splits) const {
  const google::protobuf::Reflection* reflection = body->GetReflection();
  for (const auto& [field, splits] :
       {std::pair{input_splits_, &input_splits}, std::pair{output_splits_, &output_splits}}) {
    if (field == nullptr) continue;
    for (uint64_t split : *splits) reflection->AddUInt64(body, field, split);
  }
}

}  // namespace collectived
