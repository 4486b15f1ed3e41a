// Fuzz target: ShmSegment::View, the range and alignment check between a client's (offset,
// length, dtype, count) and a real mapping. Input: segment choice, dtype, then offset, length
// and count as 64-bit values (each either raw or a small value near the segment's edges, so
// both overflow and off-by-one ranges are reached). An accepted view must lie inside the
// mapping, be aligned and match the requested size; its first and last bytes are touched, so a
// range that escapes the mapping is an ASan (or SEGV) report.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/memory/shm_segment.h"
#include "engine/vocabulary/dtype.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"

namespace collectived::fuzz {
namespace {

// Segments of awkward sizes: one byte, odd, a page, a page plus a few bytes.
const std::vector<std::shared_ptr<ShmSegment>>& Segments() {
  static auto* segments = [] {
    auto* out = new std::vector<std::shared_ptr<ShmSegment>>;
    const size_t sizes[] = {1, 7, 4096, 4100};
    for (size_t i = 0; i < std::size(sizes); ++i) {
      // Even ones sealed against shrinking, odd ones not (guarded and size-checked on use).
      int fd = memfd_create("shm-view-fuzzer", MFD_CLOEXEC | MFD_ALLOW_SEALING);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(sizes[i])) != 0 ||
          (i % 2 == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) != 0)) {
        std::perror("shm_view_fuzzer: creating a memfd");
        std::abort();
      }
      StatusOr<std::shared_ptr<ShmSegment>> segment =
          ShmSegment::Adopt(fd, sizes[i], "buffer " + std::to_string(i));
      FUZZ_CHECK(segment.ok(), "Adopt: %s", segment.status().ToString().c_str());
      out->push_back(*segment);
    }
    return out;
  }();
  return *segments;
}

// A raw 64-bit value, or one close to 0 or to `edge` (below or above it).
uint64_t Value(FuzzInput& in, size_t edge) {
  switch (in.U8() % 4) {
    case 0:
      return in.U64();
    case 1:
      return in.U8();
    case 2:
      return edge - in.U8() % 16;
    default:
      return edge + in.U8() % 16;
  }
}

}  // namespace
}  // namespace collectived::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace collectived;
  fuzz::FuzzInput in(data, size);
  const auto& segments = fuzz::Segments();
  ShmSegment& segment = *segments[in.U8() % segments.size()];
  // Every dtype value, the unspecified one and a few past the last.
  const auto dtype = static_cast<DType>(in.U8() % (static_cast<int>(DType::kComplex128) + 3));
  const size_t offset = fuzz::Value(in, segment.size());
  const size_t length = fuzz::Value(in, segment.size());
  const size_t count = fuzz::Value(in, segment.size());

  StatusOr<TensorView> view = segment.View(offset, length, dtype, count);
  if (!view.ok()) {
    FUZZ_CHECK(view.status().IsInvalidArgument(), "%s", view.status().ToString().c_str());
    return 0;
  }
  FUZZ_CHECK(IsValidDType(static_cast<int32_t>(dtype)), "accepted dtype %d",
             static_cast<int>(dtype));
  const size_t element = DTypeSize(dtype);
  FUZZ_CHECK(view->dtype == dtype && view->count == count, "view does not echo the request");
  FUZZ_CHECK(view->bytes() == length, "view of %zu bytes for a length of %zu", view->bytes(),
             length);
  FUZZ_CHECK(offset % element == 0, "offset %zu accepted for a %zu-byte dtype", offset, element);
  FUZZ_CHECK(offset <= segment.size() && length <= segment.size() - offset,
             "range [%zu, +%zu) accepted in a segment of %zu bytes", offset, length,
             segment.size());
  FUZZ_CHECK(view->owner != nullptr, "a view that does not keep its mapping alive");
  if (length > 0) {
    volatile std::byte* p = view->data;
    p[0] = p[0];
    p[length - 1] = p[length - 1];
  }
  return 0;
}
