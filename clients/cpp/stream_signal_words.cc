#include "clients/cpp/stream_signal_words.h"

#include <atomic>

namespace collectived {

StreamSignalWords::StreamSignalWords(uint32_t* words, size_t count)
    : words_(words), blocks_(count / kWordsPerGroup) {
  for (size_t i = blocks_.size(); i > 0; --i) free_.push_back(i - 1);  // block 0 first
}

std::optional<StreamSignalWords::Assigned> StreamSignalWords::Assign(const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  if (disabled_) return std::nullopt;
  auto it = group_.find(group);
  if (it == group_.end()) {
    if (free_.empty()) return std::nullopt;
    it = group_.emplace(group, free_.back()).first;
    free_.pop_back();
  }
  Block& block = blocks_[it->second];
  const uint32_t value = block.next_value;
  const size_t slot = value % kWordsPerGroup;
  if (block.failed || block.busy[slot]) return std::nullopt;
  block.busy[slot] = true;
  ++block.in_flight;
  ++block.next_value;
  const size_t index = it->second * kWordsPerGroup + slot;
  return Assigned{it->second, index * sizeof(uint32_t), value, words_ + index};
}

void StreamSignalWords::Completed(const Assigned& assigned, bool succeeded) {
  std::lock_guard<std::mutex> lock(mu_);
  // Set whatever the sidecar did: its own write (on success) carries the same value.
  std::atomic_ref<uint32_t>(*assigned.word).store(assigned.value, std::memory_order_release);
  Block& block = blocks_[assigned.block];
  block.busy[assigned.value % kWordsPerGroup] = false;
  --block.in_flight;
  block.failed = block.failed || !succeeded;
  MaybeReturnLocked(assigned.block);
}

void StreamSignalWords::Forget(const std::string& group) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = group_.find(group);
  if (it == group_.end()) return;
  const size_t index = it->second;
  group_.erase(it);
  blocks_[index].forgotten = true;
  MaybeReturnLocked(index);
}

void StreamSignalWords::MaybeReturnLocked(size_t index) {
  Block& block = blocks_[index];
  // A block whose group failed never returns: a late write of an aborted stream could land in
  // it. Its 1 KiB is lost to the session (whose later groups may wait on the CPU).
  if (!block.forgotten || block.in_flight > 0 || block.failed) return;
  // The words keep their values and the next group goes on from next_value: a stream may still
  // have a wait on an old value queued, which a cleared word would never satisfy again.
  block.forgotten = false;
  free_.push_back(index);
}

void StreamSignalWords::Disable() {
  std::lock_guard<std::mutex> lock(mu_);
  disabled_ = true;
}

size_t StreamSignalWords::free_blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return free_.size();
}

}  // namespace collectived
