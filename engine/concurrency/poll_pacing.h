// PollPacing: how a thread that must poll for what it waits for (a CUDA event, which wakes
// nobody) paces its queries. It spins, yielding, while something happened recently (a burst of
// ops is seen at once); after that it sleeps in proportion to how long the waits in progress
// have lasted, so that a completion seen late costs a bounded share of its op (about
// 1/fraction) and a long wait costs little CPU.
//
// Thread-safety: none; the poller and whoever reports activity share it under their lock.
#pragma once

#include <chrono>

namespace collectived {

class PollPacing {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Micros = std::chrono::microseconds;

  struct Options {
    Micros spin{300};           // after activity: yield and query again
    Micros shortest_sleep{5};   // then at least this between queries
    Micros longest_sleep{100};  // and at most this
    int fraction = 16;          // of how long the newest wait in progress has lasted
  };

  PollPacing() : PollPacing(Options{}) {}
  explicit PollPacing(Options options) : options_(options) {}

  // Something happened at `now` (a completion seen, a new wait begun): spin for a while.
  void Activity(TimePoint now);

  // How long to sleep at `now` before the next query, when the most recent of the waits in
  // progress began at `newest_wait_start`; zero: yield and query again.
  Micros NextSleep(TimePoint now, TimePoint newest_wait_start) const;

  // Whether `now` is within the spin after the last activity: a poller with nothing to wait
  // for stays awake (yielding) until then, so that the next wait, often an op issued right
  // after the last one completed, is queried at once instead of after a wake-up.
  bool Spinning(TimePoint now) const { return now < spin_until_; }

  // Lets this thread's short sleeps end on time. Linux adds up to a thread's timer slack
  // (50 us by default) to every sleep, more than the sleeps themselves; the poller asks for
  // 1 us. Best effort: without it sleeps are only longer.
  static void FineTimerSlackForThisThread();

 private:
  const Options options_;
  TimePoint spin_until_{};
};

}  // namespace collectived
