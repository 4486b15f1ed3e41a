#include "engine/cuda/stream_completions.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "engine/concurrency/clock.h"
#include "engine/concurrency/poll_pacing.h"
#include "engine/cuda/cuda_errors.h"

namespace collectived {

namespace {

// The poller paces itself against a real device, for every group of the process: it reads the
// real clock (Clock::Real()), as its sleeps are real.
using std::chrono::microseconds;

constexpr microseconds kHealthInterval{1000};

}  // namespace

struct StreamCompletions::State {
  struct Entry {
    int device;
    cudaStream_t stream;
    cudaEvent_t event;
    Health health;
    Done done;
    Clock::TimePoint watched;
    Clock::TimePoint last_health;
    bool pooled;  // the event is the poller's (free_events), not the caller's
  };

  // Order each stream's recordings (Watch) with their entries: a lock per stream (striped), not
  // one for all, as a record may block while its stream's queue is full. Taken before mutex.
  std::array<std::mutex, 64> recording;
  std::mutex& RecordingOf(cudaStream_t stream) {
    return recording[std::hash<const void*>()(stream) % recording.size()];
  }
  mutable std::mutex mutex;
  std::condition_variable wake;
  std::deque<Entry> pending;
  std::map<int, std::vector<cudaEvent_t>> free_events;  // by device
  PollPacing pacing;    // activity: a completion seen or a new watch
  bool asleep = false;  // the poller waits on `wake` (guarded by mutex)

  // Adds a watch for the poller, waking it if it sleeps.
  void Queue(int device, cudaStream_t stream, cudaEvent_t event, Health health, Done done,
             bool pooled) {
    bool sleeping;
    {
      std::lock_guard<std::mutex> lock(mutex);
      const Clock::TimePoint now = Clock::Real().Now();
      pending.push_back(
          Entry{device, stream, event, std::move(health), std::move(done), now, now, pooled});
      pacing.Activity(now);
      sleeping = asleep;
    }
    if (sleeping) wake.notify_one();
  }

  void Run() {
    PollPacing::FineTimerSlackForThisThread();
    // The device current on this thread: a CUDA call on a thread with none makes device 0's
    // context, which a sidecar serving another GPU must not hold (memory on a GPU not its own).
    int current_device = -1;
    auto use_device = [&current_device](int device) {
      if (device == current_device) return;
      if (cudaSetDevice(device) == cudaSuccess) {
        current_device = device;
      } else {
        cudaGetLastError();
      }
    };
    std::vector<Entry> batch;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mutex);
        while (pending.empty()) {
          // Awake through the spin after the last activity (see PollPacing::Spinning): a watch
          // made meanwhile is queried without a wake-up, and without a notify from Watch.
          if (pacing.Spinning(Clock::Real().Now())) {
            lock.unlock();
            std::this_thread::yield();
            lock.lock();
            continue;
          }
          asleep = true;
          wake.wait(lock, [&] { return !pending.empty(); });
          asleep = false;
        }
        // Query outside the lock: entries are only appended meanwhile, never removed.
        batch.assign(std::make_move_iterator(pending.begin()),
                     std::make_move_iterator(pending.end()));
        pending.clear();
      }
      std::vector<std::pair<Entry, Status>> finished;
      microseconds sleep{0};
      std::vector<Entry> waiting;
      std::set<cudaStream_t> blocked;  // streams whose oldest remaining watch is still waiting
      Clock::TimePoint newest_wait{};  // the latest start of the watches queried and waiting
      const Clock::TimePoint now = Clock::Real().Now();
      for (Entry& entry : batch) {
        // Behind a watch that has not completed, the later ones of its stream have not either.
        if (blocked.count(entry.stream) != 0) {
          waiting.push_back(std::move(entry));
          continue;
        }
        use_device(entry.device);
        const cudaError_t state = cudaEventQuery(entry.event);
        if (state == cudaSuccess) {
          finished.emplace_back(std::move(entry), Status::Ok());
          continue;
        }
        if (state != cudaErrorNotReady) {
          finished.emplace_back(std::move(entry),
                                CudaStatus(state, "the stream's completion (cudaEventQuery)"));
          continue;
        }
        if (entry.health && now - entry.last_health >= kHealthInterval) {
          entry.last_health = now;
          if (Status healthy = entry.health(); !healthy.ok()) {
            finished.emplace_back(std::move(entry), std::move(healthy));
            continue;
          }
        }
        blocked.insert(entry.stream);
        newest_wait = std::max(newest_wait, entry.watched);
        waiting.push_back(std::move(entry));
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        // New watches arrived behind the ones still waiting: keep the order.
        pending.insert(pending.begin(), std::make_move_iterator(waiting.begin()),
                       std::make_move_iterator(waiting.end()));
        for (auto& [entry, status] : finished) {
          if (!entry.pooled) continue;
          if (status.ok()) {
            free_events[entry.device].push_back(entry.event);
          } else {
            use_device(entry.device);
            cudaEventDestroy(entry.event);  // may still be pending: released once it completes
          }
        }
        const Clock::TimePoint later = Clock::Real().Now();
        if (!finished.empty()) pacing.Activity(later);
        sleep = pacing.NextSleep(later, newest_wait);
      }
      for (auto& [entry, status] : finished) entry.done(status);
      if (sleep.count() == 0) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(sleep);
      }
    }
  }
};

StreamCompletions::StreamCompletions() : state_(new State) {
  std::thread([state = state_] { state->Run(); }).detach();
}

StreamCompletions& StreamCompletions::Instance() {
  static StreamCompletions* instance = new StreamCompletions();
  return *instance;
}

Status StreamCompletions::Watch(int device, cudaStream_t stream, Health health, Done done) {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    std::vector<cudaEvent_t>& free = state_->free_events[device];
    if (!free.empty()) {
      event = free.back();
      free.pop_back();
    }
  }
  if (event == nullptr) {
    const cudaError_t created = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (created != cudaSuccess) {
      return CudaStatus(created, "cudaEventCreateWithFlags (an op's completion)");
    }
  }
  {
    // Recorded and queued under one lock, so that two threads watching one stream queue their
    // watches in the order of their recordings (the poller queries only the oldest of each
    // stream). Not the poller's lock: a record may block while the stream's queue is full.
    std::lock_guard<std::mutex> in_order(state_->RecordingOf(stream));
    const cudaError_t recorded = cudaEventRecord(event, stream);
    if (recorded != cudaSuccess) {
      cudaEventDestroy(event);
      return CudaStatus(recorded, "cudaEventRecord (an op's completion)");
    }
    state_->Queue(device, stream, event, std::move(health), std::move(done), /*pooled=*/true);
  }
  return Status::Ok();
}

void StreamCompletions::WatchRecorded(int device, cudaStream_t stream, cudaEvent_t event,
                                      Health health, Done done) {
  // The event was recorded before this call: no recording to order with the entry.
  state_->Queue(device, stream, event, std::move(health), std::move(done), /*pooled=*/false);
}

}  // namespace collectived
