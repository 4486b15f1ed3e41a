// Fuzz target: a serialized CollectiveRequest, as a client sends it, through the sidecar's
// translation (dtypes, shm ranges of the session's buffers, inline byte counts, the inline total)
// and then the engine's per-rank validation for several group shapes, and the signature and byte
// count computed for a validated request. Every tensor that survives is touched at its first
// and last byte, so a range check that lets a view past its mapping is an ASan report.
//
// With FUZZ_VERBOSE=1 in the environment each input's outcome is printed (translation, then
// validation as rank 0 of 2), to check what the seeds reach.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "collectived/v1/collectives.pb.h"
#include "engine/sidecar/session.h"
#include "engine/vocabulary/op.h"
#include "fuzz/fuzz_check.h"
#include "services/collectived/translate.h"

namespace collectived::fuzz {
namespace {

// The session the requests come from: two real shared-memory buffers, ids 1 and 2 (the seed
// corpus refers to them), one a multiple of every dtype's size and one not.
struct Fixture {
  std::shared_ptr<Session> session;
  std::vector<std::shared_ptr<ShmSegment>> segments;
};

std::shared_ptr<ShmSegment> MakeSegment(Session& session, size_t size, int index) {
  int fd = memfd_create("translate-request-fuzzer", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, static_cast<off_t>(size)) != 0) {
    std::perror("translate_request_fuzzer: creating a memfd");
    std::abort();
  }
  static const std::shared_ptr<ResourceLedger> ledger =
      ResourceLedger::Create(ResourceCeilings::Defaults(MachineLimits::OfThisProcess()), nullptr);
  StatusOr<uint64_t> id = session.RegisterBuffer(fd, size, *ledger);
  FUZZ_CHECK(id.ok(), "RegisterBuffer: %s", id.status().ToString().c_str());
  FUZZ_CHECK(*id == static_cast<uint64_t>(index) + 1, "buffer id %llu",
             static_cast<unsigned long long>(*id));
  StatusOr<std::shared_ptr<ShmSegment>> segment = session.Buffer(*id);
  FUZZ_CHECK(segment.ok(), "Buffer: %s", segment.status().ToString().c_str());
  return *segment;
}

Fixture& TheFixture() {
  static Fixture* fixture = [] {
    auto* f = new Fixture;
    f->session = std::make_shared<Session>("s1-fuzz", "s1", "fuzz", "fuzzer", getpid());
    f->segments.push_back(MakeSegment(*f->session, 4096, 0));
    f->segments.push_back(MakeSegment(*f->session, 4100, 1));
    return f;
  }();
  return *fixture;
}

// A view must lie inside one of the session's segments or be an inline buffer of its own size;
// its first and last bytes are read and written back.
void Touch(const TensorView& t) {
  FUZZ_CHECK(t.device.kind == DeviceKind::kCpu, "a CPU request produced a %s tensor",
             std::string(DeviceKindName(t.device.kind)).c_str());
  const size_t bytes = t.bytes();
  if (bytes == 0) return;
  FUZZ_CHECK(t.data != nullptr, "%zu bytes without memory", bytes);
  for (const auto& segment : TheFixture().segments) {
    StatusOr<TensorView> whole = segment->View(0, segment->size(), DType::kUInt8, segment->size());
    FUZZ_CHECK(whole.ok(), "whole segment view: %s", whole.status().ToString().c_str());
    std::byte* begin = whole->data;
    std::byte* end = begin + segment->size();
    if (t.data >= begin && t.data < end) {
      FUZZ_CHECK(bytes <= static_cast<size_t>(end - t.data),
                 "view of %zu bytes at offset %zu "
                 "runs past a segment of %zu bytes",
                 bytes, static_cast<size_t>(t.data - begin), segment->size());
      FUZZ_CHECK(static_cast<size_t>(t.data - begin) % DTypeSize(t.dtype) == 0,
                 "misaligned view at offset %zu", static_cast<size_t>(t.data - begin));
    }
  }
  volatile std::byte* p = t.data;
  p[0] = p[0];
  p[bytes - 1] = p[bytes - 1];
}

void CheckValidated(const OpRequest& r, int rank, int n) {
  for (const TensorView& t : r.inputs) Touch(t);
  for (const TensorView& t : r.outputs) Touch(t);
  if (r.kind == OpKind::kAllToAllSingle) {
    FUZZ_CHECK(r.input_splits.size() == static_cast<size_t>(n) &&
                   r.output_splits.size() == static_cast<size_t>(n),
               "alltoall_single validated with %zu/%zu splits for %d ranks", r.input_splits.size(),
               r.output_splits.size(), n);
    FUZZ_CHECK(std::accumulate(r.input_splits.begin(), r.input_splits.end(), uint64_t{0}) ==
                   r.inputs[0].count,
               "input splits do not add up to the input count");
    FUZZ_CHECK(std::accumulate(r.output_splits.begin(), r.output_splits.end(), uint64_t{0}) ==
                   r.outputs[0].count,
               "output splits do not add up to the output count");
  }
  if (IsRooted(r.kind)) FUZZ_CHECK(r.root >= 0 && r.root < n, "root %d of %d", r.root, n);
  if (IsPointToPoint(r.kind)) {
    const bool any_source = r.kind == OpKind::kRecv && r.peer == kAnySource;
    FUZZ_CHECK(any_source || (r.peer >= 0 && r.peer < n && r.peer != rank), "peer %d of %d", r.peer,
               n);
  }
  OpSignature signature = MakeSignature(r, 7);
  std::string described = DescribeSignature(signature);
  FUZZ_CHECK(!described.empty(), "empty signature description");
  (void)AlgorithmBytes(r, n);
}

}  // namespace
}  // namespace collectived::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace collectived;
  fuzz::Fixture& fixture = fuzz::TheFixture();
  v1::CollectiveRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;

  StatusOr<TranslatedRequest> translated = TranslateRequest(request, *fixture.session);
  static const bool verbose = std::getenv("FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    std::fprintf(stderr, "  translate: %s\n", translated.status().ToString().c_str());
  }
  if (!translated.ok()) {
    FUZZ_CHECK(!translated.status().message().empty(), "an error without a message");
    v1::Error error;
    FillError(translated.status(), &error);
    FUZZ_CHECK(error.kind() != v1::OK, "a failed translation mapped to OK");
    return 0;
  }
  const TranslatedRequest& t = *translated;
  FUZZ_CHECK(t.inline_output.size() == t.outputs.size(), "%zu inline flags for %zu outputs",
             t.inline_output.size(), t.outputs.size());
  for (const TensorView& view : t.request.inputs) fuzz::Touch(view);
  for (const TensorView& view : t.request.outputs) fuzz::Touch(view);

  // The group shapes a request may meet: alone, the smallest groups, the rank the request names
  // (root or peer) and both ends of each group.
  const int sizes[] = {1, 2, 3, 4, 8};
  for (int n : sizes) {
    std::vector<int> ranks = {0, n - 1};
    if (t.request.root > 0 && t.request.root < n - 1) ranks.push_back(t.request.root);
    if (n == 1) ranks.pop_back();
    for (int rank : ranks) {
      OpRequest copy = t.request;  // ValidateRequest rewrites alltoall_single splits
      Status valid = ValidateRequest(copy, request.group(), rank, n, DeviceKind::kCpu);
      if (verbose && n == 2 && rank == 0) {
        std::fprintf(stderr, "  validate (rank 0 of 2): %s\n", valid.ToString().c_str());
      }
      if (valid.ok()) {
        fuzz::CheckValidated(copy, rank, n);
      } else {
        FUZZ_CHECK(valid.IsInvalidArgument(), "validation failed with %s",
                   valid.ToString().c_str());
      }
    }
  }
  return 0;
}
