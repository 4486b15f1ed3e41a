#include "engine/vocabulary/stream_signal.h"

#include <atomic>
#include <string>

namespace collectived {

StatusOr<StreamSignal> MakeStreamSignal(std::shared_ptr<ShmSegment> segment, uint64_t offset,
                                        uint32_t value) {
  const std::string where = "stream signal in " + segment->what();
  if (!segment->sealed()) {
    return Status::InvalidArgument(where +
                                   ": the buffer is not sealed against shrinking (a "
                                   "signal word needs a memfd with F_SEAL_SHRINK)");
  }
  if (segment->size() > kMaxStreamSignalBufferBytes) {
    return Status::InvalidArgument(where + ": the buffer has " + std::to_string(segment->size()) +
                                   " bytes; a signal buffer has at most " +
                                   std::to_string(kMaxStreamSignalBufferBytes) +
                                   " (the sidecar pins it)");
  }
  if (offset % sizeof(uint32_t) != 0) {
    return Status::InvalidArgument(where + ": offset " + std::to_string(offset) +
                                   " is not a multiple of 4");
  }
  if (segment->size() < sizeof(uint32_t) || offset > segment->size() - sizeof(uint32_t)) {
    return Status::InvalidArgument(where + ": offset " + std::to_string(offset) +
                                   " is outside the buffer's " + std::to_string(segment->size()) +
                                   " bytes");
  }
  return StreamSignal{std::move(segment), static_cast<size_t>(offset), value};
}

void StoreSignal(const StreamSignal& signal) {
  std::atomic_ref<uint32_t>(*signal.word()).store(signal.value, std::memory_order_release);
}

}  // namespace collectived
