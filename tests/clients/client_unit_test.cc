// The C++ client without a real sidecar: ShmBuffer, ClientTensor, request building and inline
// write-back, error mapping, Connect's failures, and the session machinery (Attach stream,
// completions by client_op_id, session loss) against a small fake sidecar served in-process.
#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <span>
#include <thread>

#include "clients/cpp/client.h"
#include "clients/cpp/shm_buffer.h"
#include "collectived/v1/collectives.pb.h"
#include "collectived/v1/group.grpc.pb.h"
#include "collectived/v1/session.grpc.pb.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

bool ShmNameExists(const std::string& name) {
  struct stat info {};
  return stat(("/dev/shm" + name).c_str(), &info) == 0;
}

// Names in /dev/shm that this process created.
std::set<std::string> OwnShmNames() {
  std::set<std::string> names;
  const std::string prefix = "collectived-" + std::to_string(getpid()) + "-";
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) {
      if (std::string(entry->d_name).rfind(prefix, 0) == 0) names.insert(entry->d_name);
    }
    closedir(dir);
  }
  return names;
}

// ---------------------------------------------------------------------------------------------
// ShmBuffer

TEST(ShmBufferTest, CreatesAZeroedSharedMappingOfTheExactSize) {
  auto buffer = ShmBuffer::Create(4096 + 7);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  ShmBuffer& shm = **buffer;
  EXPECT_EQ(shm.size(), 4096u + 7);
  ASSERT_NE(shm.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(shm.data()) % 4096, 0u);
  EXPECT_THAT(shm.name(), StartsWith("/collectived-" + std::to_string(getpid()) + "-"));
  for (size_t i = 0; i < shm.size(); ++i) ASSERT_EQ(shm.data()[i], std::byte{0}) << i;

  struct stat info {};
  ASSERT_EQ(stat(("/dev/shm" + shm.name()).c_str(), &info), 0);
  EXPECT_EQ(static_cast<size_t>(info.st_size), shm.size());
  EXPECT_EQ(info.st_mode & 0777, 0600u);

  // Another mapping of the name (what the sidecar does) sees the same bytes.
  int fd = shm_open(shm.name().c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  void* other = mmap(nullptr, shm.size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(other, MAP_FAILED);
  static_cast<char*>(other)[4100] = 'x';
  EXPECT_EQ(shm.data()[4100], std::byte{'x'});
  shm.data()[5] = std::byte{'y'};
  EXPECT_EQ(static_cast<char*>(other)[5], 'y');
  munmap(other, shm.size());
}

TEST(ShmBufferTest, DestructionRemovesTheName) {
  auto buffer = ShmBuffer::Create(100);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  const std::string name = (*buffer)->name();
  EXPECT_TRUE(ShmNameExists(name));
  buffer->reset();
  EXPECT_FALSE(ShmNameExists(name));
}

TEST(ShmBufferTest, UnlinkRemovesTheNameButKeepsTheMapping) {
  auto buffer = ShmBuffer::Create(64);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  ShmBuffer& shm = **buffer;
  EXPECT_TRUE(shm.linked());
  ASSERT_TRUE(shm.Unlink().ok());
  EXPECT_FALSE(shm.linked());
  EXPECT_FALSE(ShmNameExists(shm.name()));
  shm.data()[63] = std::byte{7};
  EXPECT_EQ(shm.data()[63], std::byte{7});
  EXPECT_TRUE(shm.Unlink().ok());  // idempotent
}

TEST(ShmBufferTest, TwoBuffersGetDifferentNames) {
  auto a = ShmBuffer::Create(16);
  auto b = ShmBuffer::Create(16);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->name(), (*b)->name());
  EXPECT_NE((*a)->data(), (*b)->data());
}

TEST(ShmBufferTest, ZeroSizeIsInvalidArgument) {
  auto buffer = ShmBuffer::Create(0);
  ASSERT_FALSE(buffer.ok());
  EXPECT_TRUE(buffer.status().IsInvalidArgument());
  EXPECT_THAT(buffer.status().message(), HasSubstr("positive size"));
}

TEST(ShmBufferTest, AbsurdSizesFailClearlyAndLeaveNothingBehind) {
  const std::set<std::string> before = OwnShmNames();

  auto huge = ShmBuffer::Create(std::numeric_limits<size_t>::max());
  ASSERT_FALSE(huge.ok());
  EXPECT_TRUE(huge.status().IsInvalidArgument());
  EXPECT_THAT(huge.status().message(), HasSubstr("larger than any file or address space"));

  // 1 PiB: representable, but no /dev/shm holds it.
  auto too_big = ShmBuffer::Create(size_t{1} << 50);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().kind(), ErrorKind::kUnavailable);
  EXPECT_THAT(too_big.status().message(),
              AllOf(HasSubstr("shared-memory segment"), HasSubstr("1125899906842624 bytes")));
  EXPECT_EQ(OwnShmNames(), before);
}

// ---------------------------------------------------------------------------------------------
// ClientTensor, names, error mapping

// A RegisteredBuffer as AllocateBuffer would make it, without a sidecar.
std::unique_ptr<RegisteredBuffer> FakeRegistered(size_t bytes, uint64_t id) {
  auto shm = ShmBuffer::Create(bytes);
  EXPECT_TRUE(shm.ok()) << shm.status().ToString();
  auto buffer = std::make_unique<RegisteredBuffer>();
  buffer->shm = std::move(*shm);
  buffer->buffer_id = id;
  return buffer;
}

TEST(ClientTensorTest, HelpersFillTheRightFields) {
  auto buffer = FakeRegistered(1024, 42);
  ClientTensor shm = ClientTensor::Shm(*buffer, 64, DType::kFloat64, 8);
  EXPECT_EQ(shm.dtype, DType::kFloat64);
  EXPECT_EQ(shm.count, 8u);
  EXPECT_EQ(shm.shm, buffer.get());
  EXPECT_EQ(shm.offset, 64u);
  EXPECT_EQ(shm.host, nullptr);
  EXPECT_EQ(shm.bytes(), 64u);

  int16_t data[3] = {};
  ClientTensor host = ClientTensor::Inline(data, DType::kInt16, 3);
  EXPECT_EQ(host.dtype, DType::kInt16);
  EXPECT_EQ(host.count, 3u);
  EXPECT_EQ(host.shm, nullptr);
  EXPECT_EQ(host.host, data);
  EXPECT_EQ(host.bytes(), 6u);

  ClientTensor overflowing = ClientTensor::Inline(data, DType::kComplex128, SIZE_MAX / 2);
  EXPECT_EQ(overflowing.bytes(), SIZE_MAX);
  EXPECT_EQ(ClientTensor{}.bytes(), 0u);
}

TEST(CollectiveTypeTest, NamesAreTorchSpellings) {
  EXPECT_EQ(CollectiveTypeName(CollectiveType::kAllReduce), "allreduce");
  EXPECT_EQ(CollectiveTypeName(CollectiveType::kAllGatherIntoTensor), "allgather_into_tensor");
  EXPECT_EQ(CollectiveTypeName(CollectiveType::kReduceScatterTensor), "reduce_scatter_tensor");
  EXPECT_EQ(CollectiveTypeName(CollectiveType::kAllToAllSingle), "alltoall_single");
  EXPECT_EQ(CollectiveTypeName(CollectiveType::kRecv), "recv");
  EXPECT_EQ(CollectiveTypeName(static_cast<CollectiveType>(99)), "unknown");
}

TEST(StatusFromProtoTest, MapsEveryKindOneToOne) {
  v1::Error error;
  EXPECT_TRUE(client_internal::StatusFromProto(error).ok());
  for (int kind = 1; kind <= 8; ++kind) {
    error.set_kind(static_cast<v1::ErrorKind>(kind));
    error.set_message("boom " + std::to_string(kind));
    Status status = client_internal::StatusFromProto(error);
    EXPECT_EQ(static_cast<int>(status.kind()), kind);
    EXPECT_EQ(status.message(), "boom " + std::to_string(kind));
  }
  EXPECT_EQ(static_cast<int>(v1::DESYNC), static_cast<int>(ErrorKind::kDesync));
  EXPECT_EQ(static_cast<int>(v1::NOT_FOUND), static_cast<int>(ErrorKind::kNotFound));
  error.set_kind(static_cast<v1::ErrorKind>(99));
  Status unknown = client_internal::StatusFromProto(error);
  EXPECT_EQ(unknown.kind(), ErrorKind::kInternal);
  EXPECT_THAT(unknown.message(), HasSubstr("unknown kind 99"));
}

// ---------------------------------------------------------------------------------------------
// BuildCollectiveRequest

class BuildRequestTest : public ::testing::Test {
 protected:
  Status Build(const CollectiveArgs& args) {
    return client_internal::BuildCollectiveRequest("g", args, &request_);
  }
  static CollectiveArgs Args(CollectiveType type, std::vector<ClientTensor> inputs,
                             std::vector<ClientTensor> outputs) {
    CollectiveArgs args;
    args.type = type;
    args.inputs = std::move(inputs);
    args.outputs = std::move(outputs);
    return args;
  }

  std::unique_ptr<RegisteredBuffer> buffer_ = FakeRegistered(4096, 42);
  float a_[4] = {1, 2, 3, 4};
  float b_[4] = {};
  float c_[4] = {};
  v1::CollectiveRequest request_;
};

TEST_F(BuildRequestTest, InlineAllReduceCarriesDtypeCountBytesAndOp) {
  CollectiveArgs args =
      Args(CollectiveType::kAllReduce, {ClientTensor::Inline(a_, DType::kFloat32, 4)}, {});
  args.reduce_op = ReduceOp::PremulSum(0.5);
  args.timeout = milliseconds(1234);
  args.inputs[0].shape = {2, 2};
  ASSERT_TRUE(Build(args).ok());
  EXPECT_EQ(request_.group(), "g");
  EXPECT_EQ(request_.timeout_ms(), 1234);
  ASSERT_EQ(request_.op_case(), v1::CollectiveRequest::kAllreduce);
  const v1::Tensor& tensor = request_.allreduce().tensor();
  EXPECT_EQ(tensor.dtype(), v1::FLOAT32);
  EXPECT_EQ(tensor.count(), 4u);
  EXPECT_THAT(tensor.shape(), ::testing::ElementsAre(2, 2));
  ASSERT_EQ(tensor.data_case(), v1::Tensor::kInline);
  ASSERT_EQ(tensor.inline_().size(), sizeof(a_));
  EXPECT_EQ(std::memcmp(tensor.inline_().data(), a_, sizeof(a_)), 0);
  EXPECT_EQ(request_.allreduce().op().kind(), v1::ReduceOp::PREMUL_SUM);
  EXPECT_EQ(request_.allreduce().op().scale(), 0.5);
  // Left to Client::Submit.
  EXPECT_EQ(request_.client_op_id(), 0u);
  EXPECT_TRUE(request_.session_id().empty());
}

TEST_F(BuildRequestTest, ShmTensorCarriesBufferOffsetAndLength) {
  CollectiveArgs args =
      Args(CollectiveType::kBroadcast, {ClientTensor::Shm(*buffer_, 128, DType::kInt64, 10)}, {});
  args.root = 3;
  ASSERT_TRUE(Build(args).ok());
  ASSERT_EQ(request_.op_case(), v1::CollectiveRequest::kBroadcast);
  EXPECT_EQ(request_.broadcast().root(), 3);
  const v1::Tensor& tensor = request_.broadcast().tensor();
  EXPECT_EQ(tensor.dtype(), v1::INT64);
  EXPECT_EQ(tensor.count(), 10u);
  ASSERT_EQ(tensor.data_case(), v1::Tensor::kShm);
  EXPECT_EQ(tensor.shm().buffer_id(), 42u);
  EXPECT_EQ(tensor.shm().offset(), 128u);
  EXPECT_EQ(tensor.shm().length(), 80u);
}

TEST_F(BuildRequestTest, InlineOutputsSendNoBytesButAreMarkedInline) {
  ASSERT_TRUE(Build(Args(CollectiveType::kAllGather, {ClientTensor::Inline(a_, DType::kFloat32, 4)},
                         {ClientTensor::Inline(b_, DType::kFloat32, 4),
                          ClientTensor::Shm(*buffer_, 0, DType::kFloat32, 4)}))
                  .ok());
  ASSERT_EQ(request_.op_case(), v1::CollectiveRequest::kAllgather);
  EXPECT_EQ(request_.allgather().input().inline_().size(), sizeof(a_));
  ASSERT_EQ(request_.allgather().outputs_size(), 2);
  EXPECT_EQ(request_.allgather().outputs(0).data_case(), v1::Tensor::kInline);
  EXPECT_TRUE(request_.allgather().outputs(0).inline_().empty());
  EXPECT_EQ(request_.allgather().outputs(0).count(), 4u);
  EXPECT_EQ(request_.allgather().outputs(1).data_case(), v1::Tensor::kShm);

  CollectiveArgs recv =
      Args(CollectiveType::kRecv, {}, {ClientTensor::Inline(b_, DType::kInt32, 4)});
  recv.peer = -1;
  recv.tag = 77;
  ASSERT_TRUE(Build(recv).ok());
  ASSERT_EQ(request_.op_case(), v1::CollectiveRequest::kRecv);
  EXPECT_EQ(request_.recv().src(), -1);
  EXPECT_EQ(request_.recv().tag(), 77);
  EXPECT_EQ(request_.recv().tensor().data_case(), v1::Tensor::kInline);
  EXPECT_TRUE(request_.recv().tensor().inline_().empty());
}

TEST_F(BuildRequestTest, EveryTypeFillsItsOwnOneofField) {
  ClientTensor in = ClientTensor::Inline(a_, DType::kFloat32, 4);
  ClientTensor out = ClientTensor::Inline(b_, DType::kFloat32, 4);
  ClientTensor out2 = ClientTensor::Inline(c_, DType::kFloat32, 4);
  struct Case {
    CollectiveType type;
    std::vector<ClientTensor> inputs, outputs;
    v1::CollectiveRequest::OpCase expected;
  };
  const std::vector<Case> cases = {
      {CollectiveType::kAllReduce, {in}, {}, v1::CollectiveRequest::kAllreduce},
      {CollectiveType::kAllReduceCoalesced,
       {in, out},
       {},
       v1::CollectiveRequest::kAllreduceCoalesced},
      {CollectiveType::kBroadcast, {in}, {}, v1::CollectiveRequest::kBroadcast},
      {CollectiveType::kReduce, {in}, {}, v1::CollectiveRequest::kReduce},
      {CollectiveType::kAllGather, {in}, {out, out2}, v1::CollectiveRequest::kAllgather},
      {CollectiveType::kAllGatherIntoTensor,
       {in},
       {out},
       v1::CollectiveRequest::kAllgatherIntoTensor},
      {CollectiveType::kAllGatherCoalesced,
       {in},
       {out, out2},
       v1::CollectiveRequest::kAllgatherCoalesced},
      {CollectiveType::kReduceScatter, {in, out}, {out2}, v1::CollectiveRequest::kReduceScatter},
      {CollectiveType::kReduceScatterTensor,
       {in},
       {out},
       v1::CollectiveRequest::kReduceScatterTensor},
      {CollectiveType::kAllToAll, {in, out}, {out2, out2}, v1::CollectiveRequest::kAlltoall},
      {CollectiveType::kAllToAllSingle, {in}, {out}, v1::CollectiveRequest::kAlltoallSingle},
      {CollectiveType::kGather, {in}, {}, v1::CollectiveRequest::kGather},
      {CollectiveType::kScatter, {}, {out}, v1::CollectiveRequest::kScatter},
      {CollectiveType::kBarrier, {}, {}, v1::CollectiveRequest::kBarrier},
      {CollectiveType::kSend, {in}, {}, v1::CollectiveRequest::kSend},
      {CollectiveType::kRecv, {}, {out}, v1::CollectiveRequest::kRecv},
  };
  ASSERT_EQ(cases.size(), 16u);
  for (const Case& c : cases) {
    Status status = Build(Args(c.type, c.inputs, c.outputs));
    EXPECT_TRUE(status.ok()) << CollectiveTypeName(c.type) << ": " << status.ToString();
    EXPECT_EQ(request_.op_case(), c.expected) << CollectiveTypeName(c.type);
  }
}

TEST_F(BuildRequestTest, RootsPeersTagsSplitsAndReduceOps) {
  CollectiveArgs a2a =
      Args(CollectiveType::kAllToAllSingle, {ClientTensor::Inline(a_, DType::kFloat32, 4)},
           {ClientTensor::Inline(b_, DType::kFloat32, 4)});
  a2a.input_splits = {1, 3};
  a2a.output_splits = {2, 2};
  ASSERT_TRUE(Build(a2a).ok());
  EXPECT_THAT(request_.alltoall_single().input_splits(), ::testing::ElementsAre(1, 3));
  EXPECT_THAT(request_.alltoall_single().output_splits(), ::testing::ElementsAre(2, 2));

  CollectiveArgs send =
      Args(CollectiveType::kSend, {ClientTensor::Inline(a_, DType::kFloat32, 4)}, {});
  send.peer = 2;
  send.tag = -5;
  ASSERT_TRUE(Build(send).ok());
  EXPECT_EQ(request_.send().dst(), 2);
  EXPECT_EQ(request_.send().tag(), -5);
  EXPECT_EQ(request_.send().tensor().inline_().size(), sizeof(a_));

  CollectiveArgs gather =
      Args(CollectiveType::kGather, {ClientTensor::Inline(a_, DType::kFloat32, 4)}, {});
  gather.root = 1;
  ASSERT_TRUE(Build(gather).ok());
  EXPECT_EQ(request_.gather().root(), 1);
  EXPECT_EQ(request_.gather().outputs_size(), 0);

  CollectiveArgs rs =
      Args(CollectiveType::kReduceScatterTensor, {ClientTensor::Inline(a_, DType::kFloat32, 4)},
           {ClientTensor::Inline(b_, DType::kFloat32, 2)});
  rs.reduce_op = ReduceOp::Bxor();
  ASSERT_TRUE(Build(rs).ok());
  EXPECT_EQ(request_.reduce_scatter_tensor().op().kind(), v1::ReduceOp::BXOR);
  EXPECT_EQ(request_.reduce_scatter_tensor().output().count(), 2u);
}

TEST_F(BuildRequestTest, RejectsMalformedTensorsWithClearMessages) {
  auto expect_invalid = [&](ClientTensor tensor, const std::string& needle) {
    Status status = Build(Args(CollectiveType::kAllReduce, {std::move(tensor)}, {}));
    EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("allreduce on group 'g': tensor 0"));
    EXPECT_THAT(status.message(), HasSubstr(needle));
  };
  expect_invalid(ClientTensor::Shm(*buffer_, 4096 - 8, DType::kFloat32, 4), "outside");
  expect_invalid(ClientTensor::Shm(*buffer_, 5000, DType::kFloat32, 1), "outside");
  expect_invalid(ClientTensor::Shm(*buffer_, SIZE_MAX - 2, DType::kFloat32, 1), "outside");
  expect_invalid(ClientTensor::Shm(*buffer_, 2, DType::kFloat32, 4), "not aligned");
  expect_invalid(ClientTensor::Inline(nullptr, DType::kFloat32, 4), "has no memory");
  expect_invalid(ClientTensor::Inline(a_, DType::kUnspecified, 4), "has no dtype");
  expect_invalid(ClientTensor::Inline(a_, DType::kFloat64, SIZE_MAX / 4), "overflow");
  ClientTensor both = ClientTensor::Shm(*buffer_, 0, DType::kFloat32, 4);
  both.host = a_;
  expect_invalid(both, "both a shared-memory buffer and a host pointer");

  // A zero-element inline tensor needs no memory.
  EXPECT_TRUE(Build(Args(CollectiveType::kAllReduce,
                         {ClientTensor::Inline(nullptr, DType::kFloat32, 0)}, {}))
                  .ok());
}

TEST_F(BuildRequestTest, RejectsWrongTensorCountsAndTimeouts) {
  ClientTensor t = ClientTensor::Inline(a_, DType::kFloat32, 4);
  Status two = Build(Args(CollectiveType::kAllReduce, {t, t}, {}));
  EXPECT_TRUE(two.IsInvalidArgument());
  EXPECT_THAT(two.message(), HasSubstr("expected 1 tensor(s), got 2"));
  Status no_output = Build(Args(CollectiveType::kAllGatherIntoTensor, {t}, {}));
  EXPECT_THAT(no_output.message(), HasSubstr("expected 1 output tensor(s), got 0"));
  Status empty = Build(Args(CollectiveType::kAllReduceCoalesced, {}, {}));
  EXPECT_THAT(empty.message(), HasSubstr("at least one tensor"));
  Status barrier = Build(Args(CollectiveType::kBarrier, {t}, {}));
  EXPECT_TRUE(barrier.IsInvalidArgument());

  CollectiveArgs negative = Args(CollectiveType::kBarrier, {}, {});
  negative.timeout = milliseconds(-1);
  Status timeout = Build(negative);
  EXPECT_TRUE(timeout.IsInvalidArgument());
  EXPECT_THAT(timeout.message(), HasSubstr("negative timeout"));
}

TEST_F(BuildRequestTest, RejectsInlineTensorsOverTheMessageLimitWithoutReadingThem) {
  // The pointer is never read: the size check comes first.
  void* bogus = reinterpret_cast<void*>(uintptr_t{0x10});
  Status big_input =
      Build(Args(CollectiveType::kAllReduce,
                 {ClientTensor::Inline(bogus, DType::kUInt8, kMaxInlineBytes + 1)}, {}));
  EXPECT_TRUE(big_input.IsInvalidArgument());
  EXPECT_THAT(big_input.message(), AllOf(HasSubstr("message limit"), HasSubstr("AllocateBuffer")));

  const size_t half = kMaxInlineBytes / 2 + 1;
  Status big_outputs =
      Build(Args(CollectiveType::kAllGather, {ClientTensor::Inline(a_, DType::kUInt8, 1)},
                 {ClientTensor::Inline(bogus, DType::kUInt8, half),
                  ClientTensor::Inline(bogus, DType::kUInt8, half)}));
  EXPECT_TRUE(big_outputs.IsInvalidArgument());
  EXPECT_THAT(big_outputs.message(), HasSubstr("inline outputs"));

  // The same sizes in shared memory are fine.
  auto big = FakeRegistered(2 * half, 7);
  EXPECT_TRUE(Build(Args(CollectiveType::kAllGather, {ClientTensor::Inline(a_, DType::kUInt8, 1)},
                         {ClientTensor::Shm(*big, 0, DType::kUInt8, half),
                          ClientTensor::Shm(*big, half, DType::kUInt8, half)}))
                  .ok());
}

// ---------------------------------------------------------------------------------------------
// Write-back of inline results

TEST(WritebackTest, InPlaceOpsWriteBackTheirInputsOthersTheirOutputs) {
  float x[2] = {}, y[2] = {};
  CollectiveArgs args;
  args.type = CollectiveType::kReduce;
  args.inputs = {ClientTensor::Inline(x, DType::kFloat32, 2)};
  ASSERT_EQ(client_internal::WritebackTensors(args).size(), 1u);
  EXPECT_EQ(client_internal::WritebackTensors(args)[0].host, x);
  args.type = CollectiveType::kAllGatherIntoTensor;
  args.outputs = {ClientTensor::Inline(y, DType::kFloat32, 2)};
  ASSERT_EQ(client_internal::WritebackTensors(args).size(), 1u);
  EXPECT_EQ(client_internal::WritebackTensors(args)[0].host, y);
  args.type = CollectiveType::kSend;
  args.outputs.clear();
  EXPECT_TRUE(client_internal::WritebackTensors(args).empty());
}

TEST(WritebackTest, CopiesResultsIntoHostMemoryAndChecksSizes) {
  int32_t first[2] = {}, second[3] = {};
  std::vector<ClientTensor> outputs = {ClientTensor::Inline(first, DType::kInt32, 2),
                                       ClientTensor::Inline(second, DType::kInt32, 3)};
  v1::CollectiveResponse response;
  const int32_t r0[2] = {1, 2}, r1[3] = {3, 4, 5};
  response.add_outputs(std::string(reinterpret_cast<const char*>(r0), sizeof(r0)));
  response.add_outputs(std::string(reinterpret_cast<const char*>(r1), sizeof(r1)));
  ASSERT_TRUE(
      client_internal::ApplyInlineOutputs(CollectiveType::kAllGather, outputs, response).ok());
  EXPECT_EQ(first[1], 2);
  EXPECT_EQ(second[2], 5);

  // A wrong size fails and writes nothing, not even the outputs that were right.
  std::memset(first, 0, sizeof(first));
  response.set_outputs(1, "short");
  Status bad = client_internal::ApplyInlineOutputs(CollectiveType::kAllGather, outputs, response);
  EXPECT_EQ(bad.kind(), ErrorKind::kInternal);
  EXPECT_THAT(bad.message(), HasSubstr("returned 5 bytes for output 1, expected 12 (3 x int32)"));
  EXPECT_EQ(first[0], 0);

  response.clear_outputs();
  Status none = client_internal::ApplyInlineOutputs(CollectiveType::kAllGather, outputs, response);
  EXPECT_THAT(none.message(), HasSubstr("0 inline results for 2 output tensors"));
}

TEST(WritebackTest, AcceptsPositionalOrCompactResultsWhenShmAndInlineMix) {
  auto buffer = FakeRegistered(64, 1);
  int8_t host[4] = {};
  std::vector<ClientTensor> outputs = {ClientTensor::Shm(*buffer, 0, DType::kInt8, 4),
                                       ClientTensor::Inline(host, DType::kInt8, 4)};
  v1::CollectiveResponse positional;
  positional.add_outputs("");
  positional.add_outputs("abcd");
  ASSERT_TRUE(
      client_internal::ApplyInlineOutputs(CollectiveType::kAllToAll, outputs, positional).ok());
  EXPECT_EQ(std::memcmp(host, "abcd", 4), 0);

  v1::CollectiveResponse compact;
  compact.add_outputs("wxyz");
  ASSERT_TRUE(
      client_internal::ApplyInlineOutputs(CollectiveType::kAllToAll, outputs, compact).ok());
  EXPECT_EQ(std::memcmp(host, "wxyz", 4), 0);
}

TEST(WritebackTest, NonRootReduceMayGetNothingBack) {
  float x[2] = {7, 8};
  std::vector<ClientTensor> tensors = {ClientTensor::Inline(x, DType::kFloat32, 2)};
  v1::CollectiveResponse response;
  EXPECT_TRUE(client_internal::ApplyInlineOutputs(CollectiveType::kReduce, tensors, response).ok());
  EXPECT_EQ(x[0], 7);
  Status allreduce =
      client_internal::ApplyInlineOutputs(CollectiveType::kAllReduce, tensors, response);
  EXPECT_EQ(allreduce.kind(), ErrorKind::kInternal);
}

// ---------------------------------------------------------------------------------------------
// Connect without a sidecar

std::string TempSocketPath(const std::string& tag) {
  return "/tmp/collectived-client-test-" + std::to_string(getpid()) + "-" + tag + ".sock";
}

TEST(ConnectTest, MissingSocketFailsFastWithUnavailable) {
  const std::string address = "unix://" + TempSocketPath("missing");
  const auto start = Clock::now();
  auto client = Client::Connect(address, "test");
  const auto elapsed = Clock::now() - start;
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().kind(), ErrorKind::kUnavailable);
  EXPECT_THAT(client.status().message(),
              AllOf(HasSubstr(address), HasSubstr("No such file or directory"),
                    HasSubstr("is collectived running?")));
  EXPECT_LT(elapsed, std::chrono::seconds(5));
}

TEST(ConnectTest, SocketWithoutListenerFailsFast) {
  const std::string path = TempSocketPath("deaf");
  unlink(path.c_str());
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);  // bound, not listening
  const auto start = Clock::now();
  auto client = Client::Connect("unix://" + path);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  close(fd);
  unlink(path.c_str());
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().kind(), ErrorKind::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr("cannot connect to the sidecar"));
}

TEST(ConnectTest, WaitingForAMissingSidecarEndsAtTheConnectTimeout) {
  ClientOptions options;
  options.address = "unix://" + TempSocketPath("later");
  options.connect_timeout = milliseconds(300);
  options.wait_for_sidecar = true;
  const auto start = Clock::now();
  auto client = Client::Connect(options);
  const auto elapsed = Clock::now() - start;
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().kind(), ErrorKind::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr("within 300 ms"));
  EXPECT_GE(elapsed, milliseconds(250));
  EXPECT_LT(elapsed, std::chrono::seconds(5));
}

TEST(ConnectTest, MalformedAddressIsInvalidArgument) {
  auto client = Client::Connect("unix://relative/path.sock");
  ASSERT_FALSE(client.ok());
  EXPECT_TRUE(client.status().IsInvalidArgument());
}

// ---------------------------------------------------------------------------------------------
// A fake sidecar: enough of Session and Groups to drive the client. Its behaviour is chosen by
// the group name of each op:
//   "g"        allreduce doubles float32 (inline or shm), allgather copies the input into every
//              output, recv fills bytes 0x5a from rank 3, everything else succeeds;
//   "hang"     never completes;
//   "fail"     fails with DESYNC;
//   "badsize"  returns one byte too few for the first output;
//   "die"      ends the Attach stream with UNAVAILABLE;
//   "closing"  sends a `closing` event (ABORTED), then ends the stream.
class FakeSession final : public v1::Session::Service {
 public:
  std::atomic<bool> send_opened{true};
  std::atomic<int> sessions{0};

  grpc::Status Attach(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::SessionEvent, v1::SessionRequest>* stream) override {
    v1::SessionRequest request;
    if (!stream->Read(&request) || !request.has_open()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "open first");
    }
    last_client_name = request.open().client_name();
    last_pid = request.open().pid();
    const std::string session = "session-" + std::to_string(++sessions);
    if (send_opened) {
      v1::SessionEvent opened;
      opened.mutable_opened()->set_session_id(session);
      opened.mutable_opened()->set_sidecar_id("fake");
      opened.mutable_opened()->set_version("0.0-test");
      stream->Write(opened);
    }
    while (stream->Read(&request)) {
      if (request.has_ping()) {
        v1::SessionEvent pong;
        pong.set_pong(request.ping());
        stream->Write(pong);
        continue;
      }
      if (!request.has_submit()) continue;
      const v1::CollectiveRequest& op = request.submit();
      if (op.session_id() != session) {
        return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "wrong session id");
      }
      const std::string& group = op.group();
      if (group == "hang") continue;
      if (group == "die")
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake sidecar going away");
      if (group == "closing") {
        v1::SessionEvent closing;
        closing.mutable_closing()->set_kind(v1::ABORTED);
        closing.mutable_closing()->set_message("the sidecar is shutting down");
        stream->Write(closing);
        return grpc::Status::OK;
      }
      v1::SessionEvent event;
      v1::CollectiveResponse* response = event.mutable_completion();
      response->set_client_op_id(op.client_op_id());
      response->set_group(group);
      response->set_sequence_number(++sequence_);
      response->set_duration_us(42);
      if (group == "fail") {
        response->mutable_error()->set_kind(v1::DESYNC);
        response->mutable_error()->set_message("ranks 0 and 1 issued different ops");
      } else {
        Execute(op, response);
        if (group == "badsize" && response->outputs_size() > 0)
          response->mutable_outputs(0)->pop_back();
      }
      if (!stream->Write(event)) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status RegisterBuffer(grpc::ServerContext*, const v1::RegisterBufferRequest* request,
                              v1::RegisterBufferResponse* response) override {
    int fd = shm_open(request->shm_name().c_str(), O_RDWR, 0);
    if (fd < 0) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such segment");
    struct stat info {};
    fstat(fd, &info);
    void* data = mmap(nullptr, info.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (data == MAP_FAILED) return grpc::Status(grpc::StatusCode::INTERNAL, "mmap");
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t id = ++next_buffer_;
    buffers_[id] = {static_cast<std::byte*>(data), static_cast<size_t>(info.st_size)};
    response->set_buffer_id(id);
    response->set_mapped_size(info.st_size);
    return grpc::Status::OK;
  }

  grpc::Status UnregisterBuffer(grpc::ServerContext*, const v1::UnregisterBufferRequest* request,
                                v1::UnregisterBufferResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buffers_.find(request->buffer_id());
    if (it == buffers_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown buffer");
    munmap(it->second.first, it->second.second);
    buffers_.erase(it);
    ++unregistered;
    return grpc::Status::OK;
  }

  ~FakeSession() override {
    for (auto& [id, mapping] : buffers_) munmap(mapping.first, mapping.second);
  }

  std::string last_client_name;
  int64_t last_pid = 0;
  std::atomic<int> unregistered{0};

 private:
  std::byte* Memory(const v1::Tensor& tensor) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = buffers_.find(tensor.shm().buffer_id());
    return it == buffers_.end() ? nullptr : it->second.first + tensor.shm().offset();
  }

  void Execute(const v1::CollectiveRequest& op, v1::CollectiveResponse* response) {
    switch (op.op_case()) {
      case v1::CollectiveRequest::kAllreduce: {
        response->set_op("allreduce");
        const v1::Tensor& tensor = op.allreduce().tensor();
        std::vector<float> values(tensor.count());
        if (tensor.has_shm()) {
          auto* data = reinterpret_cast<float*>(Memory(tensor));
          for (auto& v : std::span(data, tensor.count())) v *= 2;
        } else {
          std::memcpy(values.data(), tensor.inline_().data(), tensor.inline_().size());
          for (float& v : values) v *= 2;
          response->add_outputs(
              std::string(reinterpret_cast<char*>(values.data()), values.size() * sizeof(float)));
        }
        break;
      }
      case v1::CollectiveRequest::kAllgather:
        response->set_op("allgather");
        for (int i = 0; i < op.allgather().outputs_size(); ++i) {
          response->add_outputs(op.allgather().input().inline_());
        }
        break;
      case v1::CollectiveRequest::kRecv: {
        response->set_op("recv");
        response->set_sequence_number(0);
        response->set_source_rank(3);
        const v1::Tensor& tensor = op.recv().tensor();
        response->add_outputs(
            std::string(tensor.count() * DTypeSize(static_cast<DType>(tensor.dtype())), '\x5a'));
        break;
      }
      default:
        break;
    }
  }

  std::mutex mu_;
  uint64_t next_buffer_ = 0;
  std::map<uint64_t, std::pair<std::byte*, size_t>> buffers_;
  uint64_t sequence_ = 0;  // touched by one Attach handler at a time in these tests
};

class FakeGroups final : public v1::Groups::Service {
 public:
  grpc::Status CreateGroup(grpc::ServerContext*, const v1::CreateGroupRequest* request,
                           v1::CreateGroupResponse* response) override {
    if (request->name() == "late") {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          "Timeout: ranks [1] never arrived at group 'late'");
    }
    std::vector<int> members(request->members().begin(), request->members().end());
    if (members.empty()) {
      for (int r = 0; r < request->world_size(); ++r) members.push_back(r);
    }
    std::sort(members.begin(), members.end());
    response->set_group(request->name());
    response->set_group_size(static_cast<int>(members.size()));
    response->set_group_rank(static_cast<int>(
        std::find(members.begin(), members.end(), request->rank()) - members.begin()));
    for (int m : members) response->add_members(m);
    response->add_local_group_ranks(response->group_rank());
    response->set_num_sidecars(static_cast<int>(members.size()));
    return grpc::Status::OK;
  }

  grpc::Status DestroyGroup(grpc::ServerContext* context, const v1::DestroyGroupRequest* request,
                            v1::DestroyGroupResponse*) override {
    if (request->group() != "g") {
      context->AddTrailingMetadata("collectived-error-kind", "not_found");
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown group '" + request->group() + "'");
    }
    return grpc::Status::OK;
  }
};

class FakeSidecarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TempSocketPath("fake");
    address_ = "unix://" + path_;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + path_, grpc::InsecureServerCredentials());
    builder.SetMaxReceiveMessageSize(64 << 20);
    builder.RegisterService(&session_);
    builder.RegisterService(&groups_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  void TearDown() override {
    server_->Shutdown(std::chrono::system_clock::now() + milliseconds(200));
    server_->Wait();
    unlink(path_.c_str());
  }

  std::unique_ptr<Client> Connect() {
    auto client = Client::Connect(address_, "unit test");
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::move(*client) : nullptr;
  }

  std::string path_;
  std::string address_;
  FakeSession session_;
  FakeGroups groups_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(FakeSidecarTest, ConnectOpensASession) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->session_id(), "session-1");
  EXPECT_EQ(client->sidecar_id(), "fake");
  EXPECT_EQ(client->sidecar_version(), "0.0-test");
  EXPECT_EQ(client->address(), address_);
  EXPECT_TRUE(client->session_status().ok());
  EXPECT_EQ(session_.last_client_name, "unit test");
  EXPECT_EQ(session_.last_pid, getpid());
  EXPECT_TRUE(client->Ping(milliseconds(5000)).ok());
}

TEST_F(FakeSidecarTest, ConnectGivesUpWhenSessionOpenedNeverComes) {
  session_.send_opened = false;
  ClientOptions options;
  options.address = address_;
  options.connect_timeout = milliseconds(300);
  const auto start = Clock::now();
  auto client = Client::Connect(options);
  ASSERT_FALSE(client.ok());
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(client.status().kind(), ErrorKind::kUnavailable);
  EXPECT_THAT(client.status().message(), HasSubstr("did not open a session within 300 ms"));
}

TEST_F(FakeSidecarTest, InlineResultsAreWrittenBackBeforeCompletion) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  float values[3] = {1, 2, 3};
  auto work = client->AllReduce("g", ClientTensor::Inline(values, DType::kFloat32, 3));
  ASSERT_TRUE(work->Wait(milliseconds(5000)).ok()) << work->status().ToString();
  EXPECT_EQ(values[0], 2);
  EXPECT_EQ(values[2], 6);
  EXPECT_GT(work->sequence_number(), 0u);
  EXPECT_EQ(work->duration(), std::chrono::microseconds(42));
  EXPECT_EQ(work->op(), "allreduce");

  int32_t in = 7, out[2] = {};
  auto gathered = client->AllGather("g", ClientTensor::Inline(&in, DType::kInt32, 1),
                                    {ClientTensor::Inline(&out[0], DType::kInt32, 1),
                                     ClientTensor::Inline(&out[1], DType::kInt32, 1)});
  ASSERT_TRUE(gathered->Wait().ok()) << gathered->status().ToString();
  EXPECT_EQ(out[0], 7);
  EXPECT_EQ(out[1], 7);

  uint8_t received[5] = {};
  auto recv = client->Recv("g", ClientTensor::Inline(received, DType::kUInt8, 5), -1, 9);
  ASSERT_TRUE(recv->Wait().ok()) << recv->status().ToString();
  EXPECT_EQ(recv->source_rank(), 3);
  EXPECT_EQ(received[4], 0x5a);

  EXPECT_TRUE(client->Barrier("g")->Wait().ok());
}

TEST_F(FakeSidecarTest, SharedMemoryBuffersAreWorkedOnInPlace) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto buffer = client->AllocateBuffer(1024);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  const RegisteredBuffer* registered = *buffer;
  EXPECT_EQ(registered->buffer_id, 1u);
  // The sidecar has mapped it: the name is gone, so a crash leaks nothing.
  EXPECT_FALSE(ShmNameExists(registered->shm->name()));
  auto* floats = reinterpret_cast<float*>(registered->data());
  floats[4] = 1.5f;
  floats[5] = -2.0f;
  auto work = client->AllReduce("g", ClientTensor::Shm(*registered, 16, DType::kFloat32, 2));
  ASSERT_TRUE(work->Wait(milliseconds(5000)).ok()) << work->status().ToString();
  EXPECT_EQ(floats[4], 3.0f);
  EXPECT_EQ(floats[5], -4.0f);

  EXPECT_TRUE(client->FreeBuffer(registered).ok());
  EXPECT_EQ(session_.unregistered, 1);
  Status twice = client->FreeBuffer(registered);
  EXPECT_TRUE(twice.IsInvalidArgument()) << twice.ToString();
}

TEST_F(FakeSidecarTest, TensorsOnForeignOrFreedBuffersAreRefused) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto buffer = client->AllocateBuffer(64);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  ClientTensor stale = ClientTensor::Shm(**buffer, 0, DType::kFloat32, 4);
  ASSERT_TRUE(client->FreeBuffer(*buffer).ok());
  // `stale` points at freed memory: the client must not even read it.
  Status freed = client->AllReduce("g", stale)->Wait();
  EXPECT_TRUE(freed.IsInvalidArgument());
  EXPECT_THAT(freed.message(), HasSubstr("tensor 0 refers to a shared-memory buffer that this "
                                         "client did not allocate or has freed"));

  auto foreign = FakeRegistered(64, 1);
  float x[4] = {};
  Status other = client
                     ->AllGatherIntoTensor("g", ClientTensor::Inline(x, DType::kFloat32, 1),
                                           ClientTensor::Shm(*foreign, 0, DType::kFloat32, 1))
                     ->Wait();
  EXPECT_THAT(other.message(), HasSubstr("output tensor 0 refers to a shared-memory buffer"));
}

TEST_F(FakeSidecarTest, ClientSideValidationFailsTheWorkAtOnce) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto work = client->AllReduce("g", ClientTensor::Inline(nullptr, DType::kFloat32, 4));
  EXPECT_TRUE(work->IsCompleted());
  EXPECT_TRUE(work->status().IsInvalidArgument());
  EXPECT_THAT(work->Wait().message(), HasSubstr("allreduce on group 'g': tensor 0 has no memory"));
  // The session is unaffected.
  float x = 1;
  EXPECT_TRUE(client->AllReduce("g", ClientTensor::Inline(&x, DType::kFloat32, 1))->Wait().ok());
}

TEST_F(FakeSidecarTest, SidecarErrorsKeepTheirKind) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  Status desync = client->Barrier("fail")->Wait(milliseconds(5000));
  EXPECT_EQ(desync.kind(), ErrorKind::kDesync);
  EXPECT_EQ(desync.message(), "ranks 0 and 1 issued different ops");

  float x[2] = {5, 6};
  Status short_result =
      client->AllReduce("badsize", ClientTensor::Inline(x, DType::kFloat32, 2))->Wait();
  EXPECT_EQ(short_result.kind(), ErrorKind::kInternal);
  EXPECT_THAT(short_result.message(),
              AllOf(HasSubstr("allreduce (client op"), HasSubstr("on group 'badsize'"),
                    HasSubstr("returned 7 bytes for output 0")));
  EXPECT_EQ(x[0], 5);  // untouched
}

TEST_F(FakeSidecarTest, WaitWithATimeoutLeavesTheOpRunning) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto work = client->Barrier("hang");
  const auto start = Clock::now();
  Status status = work->Wait(milliseconds(100));
  EXPECT_GE(Clock::now() - start, milliseconds(90));
  EXPECT_TRUE(status.IsTimeout());
  EXPECT_THAT(status.message(), AllOf(StartsWith("Timeout: barrier (client op "),
                                      HasSubstr("on group 'hang' did not complete within 100 ms")));
  EXPECT_FALSE(work->IsCompleted());
  EXPECT_TRUE(work->status().ok());
}

TEST_F(FakeSidecarTest, ALostSessionFailsPendingAndLaterOps) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto pending = client->Barrier("hang");
  std::atomic<bool> called{false};
  pending->AddCallback([&](const Status& status) { called = !status.ok(); });
  auto trigger = client->Barrier("die");
  Status lost = pending->Wait(milliseconds(5000));
  EXPECT_EQ(lost.kind(), ErrorKind::kUnavailable);
  EXPECT_THAT(lost.message(), AllOf(HasSubstr("session to " + address_ + " lost"),
                                    HasSubstr("fake sidecar going away")));
  // Callbacks run just after waiters are woken, on the reader thread.
  for (int i = 0; i < 1000 && !called; ++i) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_TRUE(called);
  EXPECT_EQ(trigger->Wait(milliseconds(5000)).kind(), ErrorKind::kUnavailable);
  EXPECT_EQ(client->session_status().kind(), ErrorKind::kUnavailable);

  // Later ops and pings fail at once with the same reason.
  auto later = client->Barrier("g");
  EXPECT_TRUE(later->IsCompleted());
  EXPECT_THAT(later->status().message(), HasSubstr("lost"));
  EXPECT_EQ(client->Ping(milliseconds(1000)).kind(), ErrorKind::kUnavailable);
  EXPECT_EQ(client->AllocateBuffer(64).status().kind(), ErrorKind::kUnavailable);
}

TEST_F(FakeSidecarTest, AClosingEventGivesTheSidecarsReason) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto pending = client->Barrier("hang");
  auto trigger = client->Barrier("closing");
  Status status = pending->Wait(milliseconds(5000));
  EXPECT_EQ(status.kind(), ErrorKind::kAborted);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("closed by the sidecar"), HasSubstr("the sidecar is shutting down")));
}

TEST_F(FakeSidecarTest, DestroyingTheClientAbortsPendingWorks) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto pending = client->Barrier("hang");
  const auto start = Clock::now();
  client.reset();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4));
  ASSERT_TRUE(pending->IsCompleted());
  EXPECT_EQ(pending->status().kind(), ErrorKind::kAborted);
  EXPECT_THAT(pending->status().message(), HasSubstr("client closed its session"));
}

TEST_F(FakeSidecarTest, OpsFromManyThreadsAllComplete) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  constexpr int kThreads = 4;
  constexpr int kOps = 100;
  std::atomic<int> good{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        float x = static_cast<float>(t * 1000 + i);
        if (client->AllReduce("g", ClientTensor::Inline(&x, DType::kFloat32, 1))->Wait().ok() &&
            x == 2.0f * static_cast<float>(t * 1000 + i)) {
          ++good;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(good, kThreads * kOps);
}

TEST_F(FakeSidecarTest, GroupsAreCreatedAndDestroyed) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  GroupOptions options;
  options.name = "sub";
  options.rank = 5;
  options.world_size = 8;
  options.members = {7, 5, 1};
  auto info = client->CreateGroup(options);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->name, "sub");
  EXPECT_EQ(info->group_rank, 1);
  EXPECT_EQ(info->group_size, 3);
  EXPECT_THAT(info->members, ::testing::ElementsAre(1, 5, 7));
  EXPECT_EQ(info->sequence_number, 0u);

  options.name = "late";
  auto late = client->CreateGroup(options);
  ASSERT_FALSE(late.ok());
  EXPECT_TRUE(late.status().IsTimeout());
  EXPECT_THAT(late.status().message(), HasSubstr("ranks [1] never arrived"));

  options.name = "";
  EXPECT_TRUE(client->CreateGroup(options).status().IsInvalidArgument());

  EXPECT_TRUE(client->DestroyGroup("g").ok());
  Status missing = client->DestroyGroup("nope");
  EXPECT_TRUE(missing.IsNotFound()) << missing.ToString();
}

}  // namespace
}  // namespace collectived
