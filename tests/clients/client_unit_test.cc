// The C++ client without a sidecar: ShmBuffer, ClientTensor, request building and inline
// write-back, error mapping and Connect's failures when no sidecar answers. The session
// machinery (Attach stream, completions, session loss, groups) is tested against a real
// collectived in tests/sidecar/client_session_test.cc.
#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <limits>
#include <set>

#include "clients/cpp/client.h"
#include "clients/cpp/shm_buffer.h"
#include "collectived/v1/collectives.pb.h"
#include "rpc/address.h"

namespace collectived {
namespace {

using std::chrono::milliseconds;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

// Entries in /dev/shm: a client must leave none there (its memory has no name).
size_t DevShmEntries() {
  size_t count = 0;
  if (DIR* dir = opendir("/dev/shm")) {
    while (dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
    closedir(dir);
  }
  return count;
}

// ---------------------------------------------------------------------------------------------
// ShmBuffer

TEST(ShmBufferTest, CreatesAZeroedSealedMemfdOfTheExactSize) {
  const size_t entries = DevShmEntries();
  auto buffer = ShmBuffer::Create(4096 + 7);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  ShmBuffer& shm = **buffer;
  EXPECT_EQ(shm.size(), 4096u + 7);
  ASSERT_NE(shm.data(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(shm.data()) % 4096, 0u);
  for (size_t i = 0; i < shm.size(); ++i) ASSERT_EQ(shm.data()[i], std::byte{0}) << i;
  EXPECT_EQ(DevShmEntries(), entries);  // no name anywhere

  ASSERT_GE(shm.fd(), 0);
  struct stat info {};
  ASSERT_EQ(fstat(shm.fd(), &info), 0);
  EXPECT_EQ(static_cast<size_t>(info.st_size), shm.size());
  // Sealed: the size cannot change, and no seal can be added or removed any more.
  const int seals = fcntl(shm.fd(), F_GET_SEALS);
  EXPECT_EQ(seals, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(ftruncate(shm.fd(), 10), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_EQ(fcntl(shm.fd(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);

  // Another mapping of the fd (what the sidecar does) sees the same bytes.
  void* other = mmap(nullptr, shm.size(), PROT_READ | PROT_WRITE, MAP_SHARED, shm.fd(), 0);
  ASSERT_NE(other, MAP_FAILED);
  static_cast<char*>(other)[4100] = 'x';
  EXPECT_EQ(shm.data()[4100], std::byte{'x'});
  shm.data()[5] = std::byte{'y'};
  EXPECT_EQ(static_cast<char*>(other)[5], 'y');
  munmap(other, shm.size());
}

TEST(ShmBufferTest, TakeFdHandsTheDescriptorOverAndKeepsTheMapping) {
  auto buffer = ShmBuffer::Create(64);
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  ShmBuffer& shm = **buffer;
  const int fd = shm.TakeFd();
  ASSERT_GE(fd, 0);
  EXPECT_EQ(shm.fd(), -1);
  EXPECT_EQ(shm.TakeFd(), -1);
  ASSERT_EQ(close(fd), 0);
  shm.data()[63] = std::byte{7};
  EXPECT_EQ(shm.data()[63], std::byte{7});
}

TEST(ShmBufferTest, TwoBuffersAreDistinctMemory) {
  auto a = ShmBuffer::Create(16);
  auto b = ShmBuffer::Create(16);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->fd(), (*b)->fd());
  EXPECT_NE((*a)->data(), (*b)->data());
  (*a)->data()[0] = std::byte{1};
  EXPECT_EQ((*b)->data()[0], std::byte{0});
}

TEST(ShmBufferTest, ZeroSizeIsInvalidArgument) {
  auto buffer = ShmBuffer::Create(0);
  ASSERT_FALSE(buffer.ok());
  EXPECT_TRUE(buffer.status().IsInvalidArgument());
  EXPECT_THAT(buffer.status().message(), HasSubstr("positive size"));
}

TEST(ShmBufferTest, AbsurdSizesFailClearlyAndLeaveNothingBehind) {
  const size_t entries = DevShmEntries();

  auto huge = ShmBuffer::Create(std::numeric_limits<size_t>::max());
  ASSERT_FALSE(huge.ok());
  EXPECT_TRUE(huge.status().IsInvalidArgument());
  EXPECT_THAT(huge.status().message(), HasSubstr("larger than any file or address space"));

  // 1 PiB: representable, but no machine's memory holds it.
  auto too_big = ShmBuffer::Create(size_t{1} << 50);
  ASSERT_FALSE(too_big.ok());
  EXPECT_EQ(too_big.status().kind(), ErrorKind::kUnavailable);
  EXPECT_THAT(too_big.status().message(),
              AllOf(HasSubstr("shared-memory buffer"), HasSubstr("1125899906842624 bytes")));
  EXPECT_EQ(DevShmEntries(), entries);
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
  EXPECT_EQ(OpKindName(CollectiveType::kAllReduce), "allreduce");
  EXPECT_EQ(OpKindName(CollectiveType::kAllGatherIntoTensor), "allgather_into_tensor");
  EXPECT_EQ(OpKindName(CollectiveType::kReduceScatterTensor), "reduce_scatter_tensor");
  EXPECT_EQ(OpKindName(CollectiveType::kAllToAllSingle), "alltoall_single");
  EXPECT_EQ(OpKindName(CollectiveType::kRecv), "recv");
  EXPECT_EQ(OpKindName(static_cast<CollectiveType>(99)), "unknown");
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
    EXPECT_TRUE(status.ok()) << OpKindName(c.type) << ": " << status.ToString();
    EXPECT_EQ(request_.op_case(), c.expected) << OpKindName(c.type);
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
  expect_invalid(both, "more than one of a shared-memory buffer, a host pointer and a CUDA");
  ClientTensor host_and_cuda = ClientTensor::Cuda(b_, 0, DType::kFloat32, 4);
  host_and_cuda.host = a_;
  expect_invalid(host_and_cuda, "more than one");
  expect_invalid(ClientTensor::Cuda(a_, -1, DType::kFloat32, 4), "without a device");

  // A zero-element inline tensor needs no memory.
  EXPECT_TRUE(Build(Args(CollectiveType::kAllReduce,
                         {ClientTensor::Inline(nullptr, DType::kFloat32, 0)}, {}))
                  .ok());
}

// Host memory passed as a CUDA tensor: without a GPU (CI) the export fails on the driver,
// with one it fails because the pointer is not device memory; a client built without CUDA says
// so. Either way the request is refused before anything is sent, naming the op and the device.
TEST_F(BuildRequestTest, ACudaTensorThatCannotBeExportedIsRefusedNamingTheDevice) {
  Status status =
      Build(Args(CollectiveType::kAllReduce, {ClientTensor::Cuda(a_, 0, DType::kFloat32, 4)}, {}));
  EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
  EXPECT_THAT(status.message(), HasSubstr("allreduce on group 'g': tensor 0 (CUDA device 0): "));
  std::cout << "CUDA export of host memory here: " << status.message() << "\n";
}

TEST(ClientTensorTest, CudaHelperFillsDeviceAndStream) {
  float data[2] = {};
  int stream_marker = 0;
  ClientTensor cuda = ClientTensor::Cuda(data, 3, DType::kFloat32, 2, &stream_marker);
  EXPECT_EQ(cuda.cuda, data);
  EXPECT_EQ(cuda.cuda_device, 3);
  EXPECT_EQ(cuda.cuda_stream, &stream_marker);
  EXPECT_EQ(cuda.host, nullptr);
  EXPECT_FALSE(cuda.is_inline());
  EXPECT_TRUE(ClientTensor::Inline(data, DType::kFloat32, 2).is_inline());
}

// A CUDA tensor among an op's outputs is written by the sidecar in place: the write-back of
// inline results skips it, as it skips shared-memory tensors.
TEST(WritebackTest, CudaOutputsAreNotWrittenBack) {
  float device_stand_in[2] = {7, 7};
  float host[2] = {};
  std::vector<ClientTensor> writeback = {ClientTensor::Cuda(device_stand_in, 0, DType::kFloat32, 2),
                                         ClientTensor::Inline(host, DType::kFloat32, 2)};
  v1::CollectiveResponse response;
  const float result[2] = {1, 2};
  response.add_outputs(std::string(reinterpret_cast<const char*>(result), sizeof(result)));
  ASSERT_TRUE(
      client_internal::ApplyInlineOutputs(CollectiveType::kAllGather, writeback, response).ok());
  EXPECT_EQ(host[0], 1);
  EXPECT_EQ(host[1], 2);
  EXPECT_EQ(device_stand_in[0], 7);
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

// One sidecar per GPU: "{local_rank}" in an address is $LOCAL_RANK; without a number there,
// the address is refused naming the variable instead of dialling a socket that does not exist.
TEST(SidecarAddressTest, LocalRankPicksThisTrainersSidecar) {
  const char* template_address = "unix:///run/collectived/gpu{local_rank}.sock";
  setenv("LOCAL_RANK", "3", 1);
  EXPECT_EQ(ResolveSidecarAddress(template_address), "unix:///run/collectived/gpu3.sock");
  setenv(kAddressEnvironmentVariable, template_address, 1);
  EXPECT_EQ(ResolveSidecarAddress(), "unix:///run/collectived/gpu3.sock");
  for (const char* not_a_number : {"", "x1", "-1"}) {
    setenv("LOCAL_RANK", not_a_number, 1);
    const std::string address = ResolveSidecarAddress();
    EXPECT_EQ(address, template_address);
    auto target = ToGrpcTarget(address);
    ASSERT_FALSE(target.ok());
    EXPECT_THAT(target.status().message(), HasSubstr("$LOCAL_RANK"));
  }
  unsetenv("LOCAL_RANK");
  unsetenv(kAddressEnvironmentVariable);
}

}  // namespace
}  // namespace collectived
