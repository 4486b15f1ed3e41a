// Validation on the three topologies: every error a request can meet before data moves (on the
// rank's own sidecar) or when ranks disagree (DESYNC, found by the sidecars together), with its
// kind and the key parts of its message. Test names: "SidecarValidation/<Topology>.<Test>".
//
// Server-side checks that the C++ client would catch first (a buffer of another session, a
// range outside the segment) are also driven with raw Collectives.Submit requests.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "collectived/v1/collectives.grpc.pb.h"
#include "rpc/grpc_status.h"
#include "tests/sidecar/cluster_test.h"

namespace collectived::sidecar_test {
namespace {

using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;
using Clock = std::chrono::steady_clock;

template <typename T>
class SidecarValidation : public ClusterTest<T> {
 protected:
  // Every rank of `works` fails with `kind`; returns the statuses.
  std::vector<Status> ExpectAllFail(const std::vector<std::shared_ptr<ClientWork>>& works,
                                    ErrorKind kind, const std::string& what) {
    std::vector<Status> statuses = WaitAll(works, milliseconds(10000));
    for (size_t g = 0; g < statuses.size(); ++g) {
      EXPECT_EQ(statuses[g].kind(), kind)
          << what << " on group rank " << g << ": " << statuses[g].ToString();
    }
    return statuses;
  }

  // A work that must have failed at once (validation before any exchange).
  Status ExpectRefusedAtOnce(const std::shared_ptr<ClientWork>& work) {
    return work->Wait(milliseconds(3000));
  }

  // An allreduce on every rank that must succeed with sequence number `sequence`: the group
  // still works and the refused ops took no number.
  void ExpectGroupWorks(const TestGroup& group, uint64_t sequence) {
    std::vector<Arena> arenas = group.Arenas();
    std::vector<ClientTensor> tensors;
    std::vector<std::vector<Value>> inputs;
    for (int g = 0; g < group.size(); ++g) {
      inputs.push_back(GenerateTensor(DType::kInt64, sequence, g, 3));
      tensors.push_back(arenas[g].Make(DType::kInt64, inputs[g], true));
    }
    auto works =
        group.Issue([&](int g) { return group.client(g).AllReduce(group.name(), tensors[g]); });
    if (!ExpectAllOk(works, "allreduce after the errors")) return;
    for (int g = 0; g < group.size(); ++g) {
      EXPECT_EQ(works[g]->sequence_number(), sequence) << "group rank " << g;
      ExpectValues(tensors[g], ReduceReference(DType::kInt64, ReduceOp::Sum(), inputs),
                   "allreduce after the errors");
    }
  }

  // Sends `request` (its session and group filled in) through Collectives.Submit on the
  // sidecar of global rank `rank`, as that rank's session.
  Status RawSubmit(int rank, v1::CollectiveRequest request) {
    Client& client = this->cluster().client(rank);
    request.set_session_id(client.session_id());
    request.set_client_op_id((uint64_t{1} << 40) + static_cast<uint64_t>(++raw_ops_));
    // Through the session's own connection: any other is refused before validation.
    auto stub = v1::Collectives::NewStub(client.channel());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::SubmitResponse response;
    grpc::Status status = stub->Submit(&context, request, &response);
    return FromGrpcStatus(status, &context);
  }

  int raw_ops_ = 0;
};

TYPED_TEST_SUITE(SidecarValidation, TopologyTypes, TopologyNames);

TYPED_TEST(SidecarValidation, UnknownGroup) {
  Cluster& cluster = this->cluster();
  for (int rank = 0; rank < cluster.world_size(); ++rank) {
    float x = 1;
    Status status = this->ExpectRefusedAtOnce(cluster.client(rank).AllReduce(
        "no-such-group", ClientTensor::Inline(&x, DType::kFloat32, 1)));
    // common.proto lists "unknown group" under INVALID_ARGUMENT, status.h under NOT_FOUND.
    EXPECT_THAT(status.kind(), AnyOf(ErrorKind::kInvalidArgument, ErrorKind::kNotFound))
        << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("unknown group 'no-such-group'"));
    Status destroy = cluster.client(rank).DestroyGroup("no-such-group");
    EXPECT_TRUE(destroy.IsNotFound()) << destroy.ToString();
    EXPECT_THAT(destroy.message(), HasSubstr("'no-such-group'"));
  }
}

TYPED_TEST(SidecarValidation, SessionNotInTheGroup) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("members");
  // Another session on the sidecar of rank 0 (and of every rank): it never joined.
  for (int s = 0; s < this->topology().sidecars; ++s) {
    auto stranger = Client::Connect(cluster.sidecar(s).unix_address(), "stranger");
    ASSERT_TRUE(stranger.ok()) << stranger.status().ToString();
    float x = 1;
    Status status = this->ExpectRefusedAtOnce(
        (*stranger)->AllReduce(group.name(), ClientTensor::Inline(&x, DType::kFloat32, 1)));
    EXPECT_EQ(status.kind(), ErrorKind::kInvalidArgument) << status.ToString();
    EXPECT_THAT(status.message(), AllOf(HasSubstr("session " + (*stranger)->session_label() +
                                                  " is not part of group '" + group.name() + "'"),
                                        Not(HasSubstr((*stranger)->session_id()))));
    Status destroy = (*stranger)->DestroyGroup(group.name());
    EXPECT_TRUE(destroy.IsNotFound()) << destroy.ToString();
  }
  this->ExpectGroupWorks(group, 1);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

TYPED_TEST(SidecarValidation, InvalidRootOnEveryRootedOp) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("root");
  const int n = group.size();
  for (int root : {n, -1, 7}) {
    for (int g = 0; g < n; ++g) {
      SCOPED_TRACE("root " + std::to_string(root) + ", group rank " + std::to_string(g));
      float x[4] = {1, 2, 3, 4};
      float out[4][4] = {};
      std::vector<ClientTensor> list;
      for (auto& o : out) list.push_back(ClientTensor::Inline(o, DType::kFloat32, 4));
      const std::vector<std::pair<std::string, std::shared_ptr<ClientWork>>> works = {
          {"broadcast", group.client(g).Broadcast(
                            group.name(), ClientTensor::Inline(x, DType::kFloat32, 4), root)},
          {"reduce",
           group.client(g).Reduce(group.name(), ClientTensor::Inline(x, DType::kFloat32, 4), root)},
          {"gather", group.client(g).Gather(group.name(),
                                            ClientTensor::Inline(x, DType::kFloat32, 4), {}, root)},
          {"scatter", group.client(g).Scatter(group.name(), {},
                                              ClientTensor::Inline(x, DType::kFloat32, 4), root)},
      };
      for (const auto& [op, work] : works) {
        Status status = this->ExpectRefusedAtOnce(work);
        EXPECT_TRUE(status.IsInvalidArgument()) << op << ": " << status.ToString();
        EXPECT_THAT(status.message(), AllOf(HasSubstr(op + " on group '" + group.name() + "'"),
                                            HasSubstr("(rank " + std::to_string(g) + ")"),
                                            HasSubstr("invalid root rank " + std::to_string(root) +
                                                      " (group size " + std::to_string(n) + ")")))
            << op;
      }
      EXPECT_EQ(x[0], 1);
    }
  }
  this->ExpectGroupWorks(group, 1);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

// Ranks 0 and 2 reduce float32, ranks 1 and 3 int64: DESYNC on every rank, naming both sets of
// ranks and what each issued. The desync takes the sequence number on every rank and the group
// goes on.
TYPED_TEST(SidecarValidation, MismatchedDtypesAcrossRanksAreADesync) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("dtypes");
  const int n = group.size();
  std::vector<Arena> arenas = group.Arenas();
  std::vector<ClientTensor> tensors;
  std::vector<std::vector<std::byte>> before;
  for (int g = 0; g < n; ++g) {
    DType dtype = g % 2 == 0 ? DType::kFloat32 : DType::kInt64;
    tensors.push_back(arenas[g].Make(dtype, GenerateTensor(dtype, 3, g, 4), true));
    before.push_back(Arena::Bytes(tensors[g]));
  }
  auto statuses = this->ExpectAllFail(
      group.Issue([&](int g) { return group.client(g).AllReduce(group.name(), tensors[g]); }),
      ErrorKind::kDesync, "allreduce with mixed dtypes");
  for (int g = 0; g < n; ++g) {
    EXPECT_THAT(statuses[g].message(),
                AllOf(HasSubstr("group '" + group.name() + "'"), HasSubstr("sequence number 1"),
                      HasSubstr("ranks [0, 2] issued allreduce(float32, count=4, SUM)"),
                      HasSubstr("ranks [1, 3] issued allreduce(int64, count=4, SUM)")))
        << "group rank " << g;
    // No data moved.
    EXPECT_EQ(Arena::Bytes(tensors[g]), before[g]) << "group rank " << g;
  }
  this->ExpectGroupWorks(group, 2);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

// Different ops, reduce ops, roots, PREMUL_SUM factors and counts at the same sequence number.
TYPED_TEST(SidecarValidation, DifferentOpsOrArgumentsAtTheSameSequenceNumberAreADesync) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("desync");
  const int n = group.size();
  std::vector<std::vector<float>> data(n, std::vector<float>(8, 1.0f));
  auto tensor = [&](int g, size_t count = 4) {
    return ClientTensor::Inline(data[g].data(), DType::kFloat32, count);
  };
  struct Case {
    std::string what;
    std::function<std::shared_ptr<ClientWork>(int)> submit;
    std::vector<std::string> needles;
  };
  const std::string last = std::to_string(n - 1);
  const std::string others = n == 4 ? "[0, 1, 2]" : "?";
  const std::vector<Case> cases = {
      {"allreduce vs broadcast",
       [&](int g) {
         return g == n - 1 ? group.client(g).Broadcast(group.name(), tensor(g), 0)
                           : group.client(g).AllReduce(group.name(), tensor(g));
       },
       {"ranks " + others + " issued allreduce(float32, count=4, SUM)",
        "ranks [" + last + "] issued broadcast(float32, count=4, root=0)"}},
      {"SUM vs MAX",
       [&](int g) {
         return group.client(g).AllReduce(group.name(), tensor(g),
                                          g == 1 ? ReduceOp::Max() : ReduceOp::Sum());
       },
       {"ranks [1] issued allreduce(float32, count=4, MAX)", "SUM)"}},
      {"different roots",
       [&](int g) { return group.client(g).Reduce(group.name(), tensor(g), g == 2 ? 1 : 0); },
       {"ranks [2] issued reduce(float32, count=4, root=1, SUM)", "root=0"}},
      {"different PREMUL_SUM factors",
       [&](int g) {
         return group.client(g).AllReduce(group.name(), tensor(g),
                                          ReduceOp::PremulSum(g == 0 ? 2.0 : 0.5));
       },
       {"ranks [0] issued allreduce(float32, count=4, PREMUL_SUM(2", "PREMUL_SUM(0.5"}},
      {"different counts",
       [&](int g) { return group.client(g).AllReduce(group.name(), tensor(g, g == 1 ? 5 : 4)); },
       {"ranks [1] issued allreduce(float32, count=5, SUM)", "count=4"}},
      {"different numbers of coalesced tensors",
       [&](int g) {
         std::vector<ClientTensor> tensors = {tensor(g, 2)};
         if (g == 3) {
           tensors.push_back(ClientTensor::Inline(data[g].data() + 4, DType::kFloat32, 2));
         }
         return group.client(g).AllReduceCoalesced(group.name(), tensors);
       },
       {"ranks [3] issued allreduce_coalesced(float32, count=4, tensors=2, SUM)", "tensors=1"}},
  };
  uint64_t sequence = 0;
  for (const Case& c : cases) {
    ++sequence;
    auto statuses = this->ExpectAllFail(group.Issue(c.submit), ErrorKind::kDesync, c.what);
    for (int g = 0; g < n; ++g) {
      EXPECT_THAT(statuses[g].message(), HasSubstr("sequence number " + std::to_string(sequence) +
                                                   " of group '" + group.name() + "'"))
          << c.what;
      for (const std::string& needle : c.needles) {
        EXPECT_THAT(statuses[g].message(), HasSubstr(needle)) << c.what << ", group rank " << g;
      }
    }
  }
  this->ExpectGroupWorks(group, sequence + 1);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

TYPED_TEST(SidecarValidation, AllToAllSingleWithInconsistentSplits) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("splits");
  const int n = group.size();
  std::vector<std::vector<float>> in(n, std::vector<float>(4, 1.0f)), out(n, in[0]);
  // Each rank's splits add up; across ranks they disagree: rank 0 sends 2 elements to rank 1,
  // which expects 1 from rank 0.
  auto statuses =
      this->ExpectAllFail(group.Issue([&](int g) {
        std::vector<uint64_t> input_splits = {1, 1, 1, 1};
        if (g == 0) input_splits = {1, 2, 0, 1};
        return group.client(g).AllToAllSingle(
            group.name(), ClientTensor::Inline(in[g].data(), DType::kFloat32, 4),
            ClientTensor::Inline(out[g].data(), DType::kFloat32, 4), input_splits, {});
      }),
                          ErrorKind::kDesync, "alltoall_single with inconsistent splits");
  for (int g = 0; g < n; ++g) {
    EXPECT_THAT(statuses[g].message(),
                AllOf(HasSubstr("alltoall_single (seq 1) on group '" + group.name() + "'"),
                      HasSubstr("rank 0 sends 2 elements to rank 1 but rank 1 expects 1 from "
                                "rank 0")))
        << "group rank " << g;
    EXPECT_EQ(out[g][0], 1.0f) << "group rank " << g;
  }
  // Splits that do not add up to the tensor are refused at once on the rank that gave them.
  Status local = this->ExpectRefusedAtOnce(group.client(2).AllToAllSingle(
      group.name(), ClientTensor::Inline(in[2].data(), DType::kFloat32, 4),
      ClientTensor::Inline(out[2].data(), DType::kFloat32, 4), {1, 1, 1, 2}, {}));
  EXPECT_TRUE(local.IsInvalidArgument()) << local.ToString();
  EXPECT_THAT(local.message(),
              AllOf(HasSubstr("alltoall_single on group '" + group.name() + "' (rank 2)"),
                    HasSubstr("input split sizes add up to 5 elements but the tensor has 4")));
  Status count = this->ExpectRefusedAtOnce(group.client(1).AllToAllSingle(
      group.name(), ClientTensor::Inline(in[1].data(), DType::kFloat32, 4),
      ClientTensor::Inline(out[1].data(), DType::kFloat32, 4), {1, 1, 2}, {}));
  EXPECT_THAT(count.message(), HasSubstr("input split sizes have 3 entries, expected 4"));
  Status unequal = this->ExpectRefusedAtOnce(group.client(1).AllToAllSingle(
      group.name(), ClientTensor::Inline(in[1].data(), DType::kFloat32, 3),
      ClientTensor::Inline(out[1].data(), DType::kFloat32, 4)));
  EXPECT_THAT(unequal.message(), HasSubstr("input of 3 elements cannot be split equally among 4"));
  this->ExpectGroupWorks(group, 2);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

TYPED_TEST(SidecarValidation, SendToSelfAndPeersOutOfRange) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("p2p");
  const int n = group.size();
  float x[2] = {1, 2};
  ClientTensor t = ClientTensor::Inline(x, DType::kFloat32, 2);
  for (int g = 0; g < n; ++g) {
    Status send = this->ExpectRefusedAtOnce(group.client(g).Send(group.name(), t, g, 1));
    EXPECT_TRUE(send.IsInvalidArgument()) << send.ToString();
    EXPECT_THAT(send.message(),
                AllOf(HasSubstr("send"), HasSubstr("'" + group.name() + "'"),
                      HasSubstr("invalid destination rank " + std::to_string(g) +
                                ": should not be the same as the rank of the caller")));
    Status recv = this->ExpectRefusedAtOnce(group.client(g).Recv(group.name(), t, g, 1));
    EXPECT_TRUE(recv.IsInvalidArgument()) << recv.ToString();
    EXPECT_THAT(recv.message(), HasSubstr("invalid source rank " + std::to_string(g) +
                                          ": should not be the same as the rank of the caller"));
  }
  Status beyond = this->ExpectRefusedAtOnce(group.client(0).Send(group.name(), t, n, 1));
  EXPECT_THAT(beyond.message(), HasSubstr("invalid destination rank " + std::to_string(n) +
                                          " (group size " + std::to_string(n) + ")"));
  Status negative = this->ExpectRefusedAtOnce(group.client(0).Recv(group.name(), t, -2, 1));
  EXPECT_THAT(negative.message(), HasSubstr("invalid source rank -2"));
  // A recv from any rank is validated like any other: a tensor outside its segment is refused.
  const RegisteredBuffer& buffer = cluster.buffer(0);
  Status any = this->ExpectRefusedAtOnce(group.client(0).Recv(
      group.name(), ClientTensor::Shm(buffer, buffer.size(), DType::kFloat32, 4),
      Client::kAnySource, 1));
  EXPECT_TRUE(any.IsInvalidArgument()) << any.ToString();
  EXPECT_THAT(any.message(), AllOf(HasSubstr("outside"), HasSubstr(group.name())));
  CheckSendRecv(group, DType::kInt64, TensorKind::kShm, 9);
  CheckAnySourceRecv(group, DType::kInt64, TensorKind::kMixed, 10);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

// A send and a recv of different sizes: the recv fails naming both sizes (between ranks of one
// sidecar the send fails too; across sidecars the send's bytes are received and dropped), and
// the next message of the pair still arrives.
TYPED_TEST(SidecarValidation, SendRecvOfDifferentSizes) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("p2p-size");
  float big[4] = {1, 2, 3, 4}, small[2] = {0, 0};
  auto recv =
      group.client(1).Recv(group.name(), ClientTensor::Inline(small, DType::kFloat32, 2), 0, 3);
  auto send =
      group.client(0).Send(group.name(), ClientTensor::Inline(big, DType::kFloat32, 4), 1, 3);
  Status received = recv->Wait(milliseconds(10000));
  EXPECT_TRUE(received.IsInvalidArgument()) << received.ToString();
  EXPECT_THAT(received.message(),
              AllOf(HasSubstr("the send has 16 bytes but the matching recv expects 8"),
                    HasSubstr(group.name())));
  Status sent = send->Wait(milliseconds(10000));
  EXPECT_TRUE(sent.ok() || sent.IsInvalidArgument()) << sent.ToString();
  float next[2] = {5, 6}, got[2] = {0, 0};
  auto recv_next =
      group.client(1).Recv(group.name(), ClientTensor::Inline(got, DType::kFloat32, 2), 0, 3);
  auto send_next =
      group.client(0).Send(group.name(), ClientTensor::Inline(next, DType::kFloat32, 2), 1, 3);
  EXPECT_TRUE(send_next->Wait(milliseconds(10000)).ok()) << send_next->status().ToString();
  EXPECT_TRUE(recv_next->Wait(milliseconds(10000)).ok()) << recv_next->status().ToString();
  EXPECT_EQ(got[0], 5);
  EXPECT_EQ(got[1], 6);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

// Shared-memory ranges outside the segment: refused by the client before sending, and by the
// sidecar for a request that skips the client's checks.
TYPED_TEST(SidecarValidation, OutOfRangeSharedMemoryRanges) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("range");
  const RegisteredBuffer& buffer = cluster.buffer(0);
  const size_t size = buffer.size();
  for (size_t offset : {size - 8, size, size + 4096, size_t{1} << 62}) {
    Status status = this->ExpectRefusedAtOnce(group.client(0).AllReduce(
        group.name(), ClientTensor::Shm(buffer, offset, DType::kFloat32, 4)));
    EXPECT_TRUE(status.IsInvalidArgument()) << status.ToString();
    EXPECT_THAT(status.message(), HasSubstr("outside")) << "offset " << offset;
  }
  // The same through the wire, past the client.
  auto raw = [&](uint64_t offset, uint64_t length, uint64_t count) {
    CollectiveArgs args;
    args.type = CollectiveType::kAllReduce;
    args.inputs = {ClientTensor::Shm(buffer, 0, DType::kFloat32, 4)};
    v1::CollectiveRequest request;
    Status built = client_internal::BuildCollectiveRequest(group.name(), args, &request);
    EXPECT_TRUE(built.ok()) << built.ToString();
    v1::ShmRef* shm = request.mutable_allreduce()->mutable_tensor()->mutable_shm();
    shm->set_offset(offset);
    shm->set_length(length);
    request.mutable_allreduce()->mutable_tensor()->set_count(count);
    return this->RawSubmit(0, request);
  };
  struct Case {
    uint64_t offset, length, count;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {size - 8, 16, 4, "is outside buffer "},
      {size, 16, 4, "is outside buffer "},
      {uint64_t{1} << 63, 16, 4, "is outside buffer "},
      {~uint64_t{0} - 7, 16, 4, "is outside buffer "},
      {0, size + 4, (size + 4) / 4, "does not match"},
      {0, 12, 4, "length 12 bytes does not match 4 x float32"},
      {2, 16, 4, "is not aligned"},
  };
  for (const Case& c : cases) {
    Status status = raw(c.offset, c.length, c.count);
    EXPECT_TRUE(status.IsInvalidArgument())
        << "offset " << c.offset << " length " << c.length << ": " << status.ToString();
    EXPECT_THAT(status.message(), AllOf(HasSubstr(c.needle), HasSubstr(group.name())))
        << "offset " << c.offset << " length " << c.length;
  }
  EXPECT_TRUE(cluster.sidecar_of(0).Healthy(milliseconds(2000)));
  this->ExpectGroupWorks(group, 1);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

// A session can only use its own buffers.
TYPED_TEST(SidecarValidation, BufferOfAnotherSession) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("foreign");
  // The client refuses a RegisteredBuffer that another client allocated.
  Status client_side = this->ExpectRefusedAtOnce(group.client(0).AllReduce(
      group.name(), ClientTensor::Shm(cluster.buffer(1), 0, DType::kFloat32, 4)));
  EXPECT_TRUE(client_side.IsInvalidArgument()) << client_side.ToString();
  EXPECT_THAT(client_side.message(),
              HasSubstr("tensor 0 refers to a shared-memory buffer that this client did not "
                        "allocate or has freed"));
  // The sidecar refuses a buffer id that only another session registered (ids are per
  // session: rank 1 registers more buffers than rank 0 has).
  std::vector<const RegisteredBuffer*> extra;
  for (int i = 0; i < 3; ++i) {
    auto buffer = cluster.client(1).AllocateBuffer(4096);
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    std::memset((*buffer)->data(), 0x11, 4096);
    extra.push_back(*buffer);
  }
  const uint64_t foreign_id = extra.back()->buffer_id;
  ASSERT_GT(foreign_id, cluster.buffer(0).buffer_id);
  CollectiveArgs args;
  args.type = CollectiveType::kBroadcast;
  args.root = 0;
  args.inputs = {ClientTensor::Shm(cluster.buffer(0), 0, DType::kFloat32, 16)};
  v1::CollectiveRequest request;
  ASSERT_TRUE(client_internal::BuildCollectiveRequest(group.name(), args, &request).ok());
  request.mutable_broadcast()->mutable_tensor()->mutable_shm()->set_buffer_id(foreign_id);
  Status status = this->RawSubmit(0, request);
  EXPECT_TRUE(status.IsNotFound() || status.IsInvalidArgument()) << status.ToString();
  EXPECT_THAT(status.message(), AllOf(HasSubstr("buffer " + std::to_string(foreign_id) +
                                                " is not registered by "
                                                "session " +
                                                cluster.client(0).session_label()),
                                      HasSubstr("a session can only use its own buffers")));
  for (const RegisteredBuffer* buffer : extra) {
    for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(buffer->data()[i], std::byte{0x11}) << i;
    EXPECT_TRUE(cluster.client(1).FreeBuffer(buffer).ok());
  }
  this->ExpectGroupWorks(group, 1);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

// Every (ReduceOp, dtype) pair torch refuses, on every reducing collective, is refused on every
// rank before any data moves; the refusals take no sequence number.
TYPED_TEST(SidecarValidation, InvalidOpDtypePairs) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("pairs");
  const int n = group.size();
  int checked = 0;
  for (DType dtype : MatrixDTypes()) {
    for (const ReduceOp& op : InapplicableOps(dtype)) {
      for (CollectiveType type : {CollectiveType::kAllReduce, CollectiveType::kAllReduceCoalesced,
                                  CollectiveType::kReduce, CollectiveType::kReduceScatter,
                                  CollectiveType::kReduceScatterTensor}) {
        const std::string what = std::string(OpKindName(type)) + " with " + OpName(op) + " on " +
                                 std::string(DTypeName(dtype));
        std::vector<Arena> arenas = group.Arenas();
        std::vector<std::vector<ClientTensor>> inputs(n), outputs(n);
        std::vector<std::vector<std::vector<std::byte>>> before(n);
        for (int g = 0; g < n; ++g) {
          const size_t count = type == CollectiveType::kReduceScatterTensor ? 4 * n : 4;
          const size_t tensors = type == CollectiveType::kReduceScatter ? n : 1;
          for (size_t t = 0; t < tensors; ++t) {
            inputs[g].push_back(arenas[g].Make(dtype, GenerateTensor(dtype, t, g, count), true));
            before[g].push_back(Arena::Bytes(inputs[g].back()));
          }
          if (type == CollectiveType::kReduceScatter ||
              type == CollectiveType::kReduceScatterTensor) {
            outputs[g].push_back(arenas[g].Make(dtype, 4, true, {}));
          }
        }
        auto works = group.Issue([&](int g) {
          CollectiveArgs args;
          args.type = type;
          args.inputs = inputs[g];
          args.outputs = outputs[g];
          args.reduce_op = op;
          return group.client(g).Submit(group.name(), args);
        });
        for (int g = 0; g < n; ++g) {
          Status status = this->ExpectRefusedAtOnce(works[g]);
          EXPECT_TRUE(status.IsInvalidArgument()) << what << ": " << status.ToString();
          EXPECT_THAT(
              status.message(),
              AllOf(HasSubstr("ReduceOp " + OpName(op) + " is not supported for dtype " +
                              std::string(DTypeName(dtype))),
                    HasSubstr(std::string(OpKindName(type)) + " on group '" + group.name() + "'")))
              << what;
          for (size_t t = 0; t < inputs[g].size(); ++t) {
            EXPECT_EQ(Arena::Bytes(inputs[g][t]), before[g][t]) << what << ": data moved";
          }
        }
        ++checked;
      }
    }
  }
  // float32/16/bf16: BAND BOR BXOR; complex64: MIN MAX BAND BOR BXOR; int64: PREMUL_SUM;
  // bool: AVG PREMUL_SUM; each on five collectives.
  EXPECT_EQ(checked, (3 * 3 + 5 + 1 + 2) * 5);
  this->ExpectGroupWorks(group, 1);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

// Tensors that do not fit the op or the group.
TYPED_TEST(SidecarValidation, WrongTensorShapes) {
  Cluster& cluster = this->cluster();
  TestGroup group = this->NewGroup("shapes");
  const int n = group.size();
  std::vector<float> a(64, 1.0f), b(64, 0.0f);
  auto t = [](std::vector<float>& v, size_t offset, size_t count) {
    return ClientTensor::Inline(v.data() + offset, DType::kFloat32, count);
  };
  std::vector<ClientTensor> three = {t(b, 0, 4), t(b, 4, 4), t(b, 8, 4)};
  struct Case {
    std::string what;
    std::shared_ptr<ClientWork> work;
    std::string needle;
  };
  std::vector<ClientTensor> outputs_of_5 = {t(b, 0, 4), t(b, 4, 4), t(b, 8, 5), t(b, 16, 4)};
  const std::vector<Case> cases = {
      {"allgather with too few outputs", group.client(0).AllGather(group.name(), t(a, 0, 4), three),
       "expected " + std::to_string(n) + " output tensors (one per rank of the group), got 3"},
      {"allgather with a wrong-sized output",
       group.client(0).AllGather(group.name(), t(a, 0, 4), outputs_of_5),
       "output tensor 2 has 5 elements, expected 4"},
      {"allgather_into_tensor with a wrong output",
       group.client(0).AllGatherIntoTensor(group.name(), t(a, 0, 4), t(b, 0, 10)),
       "has 10 elements, expected " + std::to_string(4 * n)},
      {"reduce_scatter_tensor with a wrong input",
       group.client(0).ReduceScatterTensor(group.name(), t(a, 0, 7), t(b, 0, 2)),
       "has 7 elements, expected " + std::to_string(2 * n)},
      {"scatter with inputs on a non-root rank",
       group.client(1).Scatter(group.name(), three, t(b, 0, 4), 0), "where none are expected"},
      {"gather with outputs on a non-root rank",
       group.client(1).Gather(group.name(), t(a, 0, 4), three, 0), "where none are expected"},
      {"alltoall with too few inputs", group.client(0).AllToAll(group.name(), three, three),
       "expected " + std::to_string(n) + " input tensors"},
      {"allreduce_coalesced with mixed dtypes",
       group.client(0).AllReduceCoalesced(
           group.name(), {t(a, 0, 2), ClientTensor::Inline(b.data(), DType::kInt32, 2)}),
       "tensors with different dtypes: float32 and int32"},
  };
  for (const Case& c : cases) {
    Status status = this->ExpectRefusedAtOnce(c.work);
    EXPECT_TRUE(status.IsInvalidArgument()) << c.what << ": " << status.ToString();
    EXPECT_THAT(status.message(), AllOf(HasSubstr(c.needle), HasSubstr(group.name()))) << c.what;
  }
  this->ExpectGroupWorks(group, 1);
  EXPECT_TRUE(cluster.DestroyGroup(group.name()).ok());
}

}  // namespace
}  // namespace collectived::sidecar_test
