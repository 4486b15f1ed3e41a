// Lifeline: lets callbacks that refer to an object (a store watch's completion, a group's hook, a
// queued task) use it only while it lives. Each holds the lifeline by shared_ptr, not the object;
// the object's destructor calls Retire, which refuses every later entry and waits for the ones
// inside, so a callback either runs with the object whole or does not run at all.
//
// Thread-safety: every method may be called from any thread; Retire must not be called from
// inside an entry (it would wait for itself).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace collectived {

class Lifeline {
 public:
  // Holds the object alive until the matching Exit. False, and nothing to exit, once Retire
  // began.
  bool Enter();
  void Exit();

  // Runs `fn` inside an entry; false, without running it, once Retire began.
  template <typename Fn>
  bool RunIfAlive(Fn&& fn) {
    if (!Enter()) return false;
    struct Exiter {
      Lifeline* line;
      ~Exiter() { line->Exit(); }
    } exiter{this};
    fn();
    return true;
  }

  // Refuses every later Enter, then blocks until every entry exited.
  void Retire();
  bool retired() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable left_;
  size_t inside_ = 0;     // guarded by mutex_
  bool retired_ = false;  // guarded by mutex_
};

}  // namespace collectived
