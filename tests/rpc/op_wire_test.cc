// The op table (engine/vocabulary/op_traits.h) and the wire protocol
// (proto/collectived/v1/collectives.proto) say the same: every op of the table has its message in
// CollectiveRequest's `op` oneof with the fields WireFieldsOf names, every op of the proto has its
// row, and no message carries a field the rules do not name (a field the sidecar and the clients
// would silently ignore).
#include "rpc/op_wire.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "engine/vocabulary/op_traits.h"

namespace collectived {
namespace {

using google::protobuf::FieldDescriptor;

TEST(OpWireTest, EveryOpOfTheProtoHasItsRowAndEveryRowItsMessage) {
  const google::protobuf::OneofDescriptor* ops =
      v1::CollectiveRequest::descriptor()->FindOneofByName("op");
  ASSERT_NE(ops, nullptr);
  std::set<std::string> table;
  for (const OpTraits& traits : kOpTraits) table.insert(std::string(traits.name));
  std::set<std::string> proto;
  for (int i = 0; i < ops->field_count(); ++i) proto.insert(ops->field(i)->name());
  EXPECT_EQ(table, proto);
  for (const OpTraits& traits : kOpTraits) EXPECT_EQ(OpWire::Of(traits.kind).kind(), traits.kind);
}

TEST(OpWireTest, NoMessageCarriesAFieldTheRulesDoNotName) {
  for (const OpTraits& traits : kOpTraits) {
    const OpWireFields fields = WireFieldsOf(traits);
    std::set<std::string> named;
    for (std::string_view name : {fields.inputs, fields.outputs, fields.peer}) {
      if (!name.empty()) named.insert(std::string(name));
    }
    if (traits.rooted) named.insert("root");
    if (traits.reduces) named.insert("op");
    if (traits.point_to_point) named.insert("tag");
    if (traits.inputs == TensorLayout::kOneSplit) named.insert("input_splits");
    if (traits.outputs == TensorLayout::kOneSplit) named.insert("output_splits");
    const FieldDescriptor* op =
        v1::CollectiveRequest::descriptor()->FindFieldByName(std::string(traits.name));
    ASSERT_NE(op, nullptr) << traits.name;
    std::set<std::string> present;
    for (int i = 0; i < op->message_type()->field_count(); ++i) {
      present.insert(op->message_type()->field(i)->name());
    }
    EXPECT_EQ(present, named) << traits.name;
  }
}

// Writes an op by the rules and reads it back: kind, tensors per side, root, reduce op, peer,
// tag and splits all survive, through the message's bytes.
TEST(OpWireTest, EveryOpWrittenByTheRulesReadsBackTheSame) {
  for (const OpTraits& traits : kOpTraits) {
    const OpWire& wire = OpWire::Of(traits.kind);
    v1::CollectiveRequest request;
    google::protobuf::Message* body = wire.MutableBody(&request);
    const int inputs = traits.inputs == TensorLayout::kNone  ? 0
                       : IsSingleTensorLayout(traits.inputs) ? 1
                                                             : 3;
    const int outputs = traits.outputs == TensorLayout::kNone  ? 0
                        : IsSingleTensorLayout(traits.outputs) ? 1
                                                               : 3;
    for (int i = 0; i < inputs; ++i) wire.AddInput(body)->set_count(10 + i);
    for (int i = 0; i < outputs; ++i) wire.AddOutput(body)->set_count(20 + i);
    if (traits.reduces) wire.MutableReduceOp(body)->set_kind(v1::ReduceOp::MAX);
    wire.SetRoot(body, 2);
    wire.SetPeer(body, 3);
    wire.SetTag(body, 77);
    wire.SetSplits(body, {1, 2}, {3, 4});

    v1::CollectiveRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(request.SerializeAsString()));
    ASSERT_EQ(OpWire::KindOf(parsed), traits.kind) << traits.name;
    const google::protobuf::Message& read = wire.Body(parsed);
    const auto in = wire.Inputs(read);
    const auto out = wire.Outputs(read);
    ASSERT_EQ(in.size(), static_cast<size_t>(inputs)) << traits.name;
    ASSERT_EQ(out.size(), static_cast<size_t>(outputs)) << traits.name;
    for (int i = 0; i < inputs; ++i) EXPECT_EQ(in[i]->count(), static_cast<uint64_t>(10 + i));
    for (int i = 0; i < outputs; ++i) EXPECT_EQ(out[i]->count(), static_cast<uint64_t>(20 + i));
    EXPECT_EQ(wire.Root(read), traits.rooted ? 2 : 0) << traits.name;
    EXPECT_EQ(wire.ReduceOp(read).kind(), traits.reduces ? v1::ReduceOp::MAX : v1::ReduceOp::SUM);
    EXPECT_EQ(wire.Peer(read), traits.point_to_point ? 3 : 0) << traits.name;
    EXPECT_EQ(wire.Tag(read), traits.point_to_point ? 77 : 0) << traits.name;
    const bool split = traits.inputs == TensorLayout::kOneSplit;
    EXPECT_EQ(wire.InputSplits(read),
              split ? std::vector<uint64_t>({1, 2}) : std::vector<uint64_t>());
    EXPECT_EQ(wire.OutputSplits(read),
              split ? std::vector<uint64_t>({3, 4}) : std::vector<uint64_t>());
  }
  EXPECT_FALSE(OpWire::KindOf(v1::CollectiveRequest()).has_value());
}

}  // namespace
}  // namespace collectived
