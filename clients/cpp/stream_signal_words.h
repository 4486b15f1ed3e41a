// StreamSignalWords: the words through which a session's CUDA collectives tell the trainer's
// streams they are done (CollectiveRequest.stream_signal), so that Work.wait() on a stream
// enqueues a wait on a word (cuStreamWaitValue32) instead of waiting on the CPU for the
// sidecar's response that names an event.
//
// The words lie in one buffer shared with the sidecar, a block of kWordsPerGroup words per
// group. A group's ops take values 1, 2, 3, ... in issue order, op v the word v % kWordsPerGroup;
// a waiter waits for its word to reach v (cyclically). The sidecar writes the word when the op
// succeeded (on its stream after the op's work) and when its group failed or refused it (before
// the completion); the client writes it when the op completes, whatever the outcome, so that no
// stream waits forever on an op that failed (also one the sidecar never had). A word is given to
// a new op only once its previous op completed successfully (whose write then has run), and a
// group that saw a failure takes no more words (an aborted stream may still write late): its ops
// wait on the CPU. A block returns once its group is forgotten with nothing in flight; the next
// group of the block goes on from the values it reached (a word only ever moves forward, so a
// wait still queued on an old value stays satisfied).
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace collectived {

class StreamSignalWords {
 public:
  static constexpr size_t kWordsPerGroup = 256;

  // Over `count` words at `words` (a multiple of kWordsPerGroup, zeroed; the caller's memory,
  // valid as long as this object). Values start at 1.
  StreamSignalWords(uint32_t* words, size_t count);

  struct Assigned {
    size_t block = 0;
    uint64_t offset = 0;  // of the word in the buffer, in bytes
    uint32_t value = 0;
    uint32_t* word = nullptr;
  };
  // The word and value of `group`'s next op, or nullopt when it gets none (no block free, the
  // group failed before, the op kWordsPerGroup earlier is still out, or Disable was called).
  std::optional<Assigned> Assign(const std::string& group);
  // An op that was Assigned completed (`succeeded` or not): its word is set to its value.
  void Completed(const Assigned& assigned, bool succeeded);
  // The group is destroyed: its block returns once none of its ops is out. A group of the same
  // name created later gets a block of its own.
  void Forget(const std::string& group);

  // No op gets a word from now on (the driver refused to wait on one).
  void Disable();

  // Blocks not in use (for tests).
  size_t free_blocks() const;

 private:
  struct Block {
    uint32_t next_value = 1;
    size_t in_flight = 0;
    std::vector<bool> busy = std::vector<bool>(kWordsPerGroup);
    bool failed = false;     // a failure was seen: no more words
    bool forgotten = false;  // its group is gone: returns to free_ once in_flight is 0
  };
  void MaybeReturnLocked(size_t index);

  uint32_t* const words_;
  mutable std::mutex mu_;
  std::vector<Block> blocks_;            // guarded by mu_
  std::vector<size_t> free_;             // guarded by mu_
  std::map<std::string, size_t> group_;  // guarded by mu_: live groups' blocks
  bool disabled_ = false;                // guarded by mu_
};

}  // namespace collectived
