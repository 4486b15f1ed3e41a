// Scale benchmark: one group of R ranks over S simulated sidecars, in one process.
//
// Each simulated sidecar is a real GroupRegistry of its own (its own sidecar id); every rank is a
// thread calling Join, then running small allreduces, as a trainer's requests do in a sidecar.
// All of them meet in ONE store:
//   memory  every registry uses one in-process MemoryStore directly;
//   grpc    the store is served by a StoreService on a loopback TCP port; the registry of
//           sidecar 0 hosts it (uses the MemoryStore directly), every other registry reaches it
//           through its own RemoteStore, as real sidecars meet in the store of one of them.
// The sidecars connect through one of two transports:
//   sockets     the real SidecarTransportFactory: Gloo's TCP mesh and the group's control mesh,
//               on 127.0.0.1 (each connection's two ends are in this process);
//   in-process  the in-process fabric (no sockets): the store's and the agreement's costs alone,
//               for sizes whose meshes this process could not open.
// For each size it prints the group's formation time (median of the rounds), the store calls,
// keys and bytes per rank, the connections per sidecar (descriptors of sockets this process
// opened for the group, counted from /proc/self/fd, over S) and the latency of a 4-byte
// allreduce of every rank (p50/p99 over --agreement-ops ops), from the last rank's submission to
// the last rank's completion: the agreement of R arrivals and the combine of almost no data,
// without the wait for rank threads that the scheduler has not run yet. The last line is, for the
// largest size run:
//   scale: R ranks over S sidecars formed in T s; agreement p50 U us; max connections per sidecar C
// --lose-rank instead makes the group shrink (docs/fault-tolerance.md) and loses its last rank:
// the time until every survivor completed, among the survivors, the op that waited for it;
// --lose-sidecar makes it shrink and kills its last sidecar as --kill-one does: the same time.
// Asserts nothing.
//
// Usage: scale_bench [--sidecars 16,64,256,1024] [--ranks-per-sidecar 16] [--rounds 3]
//                    [--store memory|grpc] [--transport in-process|sockets]
//                    [--agreement-ops 50] [--timeout-s 300]
//                    [--kill-one | --lose-rank | --lose-sidecar]
//                    [--runtime-per-sidecar] [--link-latency-ms 0] [--kernel-futex-hash]
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/rendezvous/group_registry.h"
#include "engine/group/transport/in_process/in_process_fabric.h"
#include "engine/store/counting_store.h"
#include "engine/store/memory_store.h"
#include "engine/vocabulary/logging.h"
#include "rpc/limits.h"
#include "rpc/remote_store.h"
#include "services/collectived/store_service.h"

namespace collectived {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// The store all sidecars meet in, and the view each sidecar has of it (counted).
class SharedStore {
 public:
  SharedStore(bool grpc, int sidecars) : memory_(std::make_shared<MemoryStore>()) {
    if (grpc) {
      // Plaintext loopback: every simulated sidecar is a peer (as --trust-plaintext-peers).
      StoreAccessPolicy policy;
      policy.trust_plaintext_peers = true;
      service_ = std::make_unique<StoreService>(memory_, policy, metrics_);
      grpc::ServerBuilder builder;
      builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
      builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
      builder.SetMaxSendMessageSize(kMaxMessageBytes);
      builder.RegisterService(service_.get());
      server_ = builder.BuildAndStart();
      if (!server_ || port_ == 0) {
        std::fprintf(stderr, "cannot start the store service on 127.0.0.1\n");
        std::exit(1);
      }
    }
    for (int s = 0; s < sidecars; ++s) {
      std::shared_ptr<Store> view = memory_;
      if (grpc && s > 0) {
        StatusOr<std::shared_ptr<RemoteStore>> remote =
            RemoteStore::Connect("127.0.0.1:" + std::to_string(port_));
        if (!remote.ok()) {
          std::fprintf(stderr, "%s\n", remote.status().ToString().c_str());
          std::exit(1);
        }
        (void)(*remote)->Check({"warm-up"});  // connect before anything is counted or timed
        view = *remote;
      }
      views_.push_back(std::make_shared<CountingStore>(view));
    }
  }

  ~SharedStore() {
    views_.clear();
    if (service_) service_->Shutdown("benchmark over");
    if (server_) {
      server_->Shutdown(std::chrono::system_clock::now() + milliseconds(500));
      server_->Wait();
    }
  }

  const std::shared_ptr<CountingStore>& view(int sidecar) const { return views_[sidecar]; }
  CountingStore::Counts counts() const {
    CountingStore::Counts total;
    for (const auto& v : views_) {
      const CountingStore::Counts c = v->counts();
      total.calls += c.calls;
      total.keys += c.keys;
      total.bytes_in += c.bytes_in;
      total.bytes_out += c.bytes_out;
    }
    return total;
  }

 private:
  std::shared_ptr<MemoryStore> memory_;
  Metrics metrics_;
  std::unique_ptr<StoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::vector<std::shared_ptr<CountingStore>> views_;
};

// Descriptors of sockets this process holds now.
int OpenSockets() {
  int sockets = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    struct stat info {};
    const std::string path = std::string("/proc/self/fd/") + entry->d_name;
    if (entry->d_name[0] != '.' && stat(path.c_str(), &info) == 0 && S_ISSOCK(info.st_mode)) {
      ++sockets;
    }
  }
  closedir(dir);
  return sockets;
}

// Linux 6.16 and later give each process a private futex hash of its own, sized by its CPUs (at
// least 16 buckets on this 2-core machine), not by its threads: with 16,384 rank threads each
// waiting on its own condition variable, every wake-up walked a bucket of about a thousand
// waiters under one spinlock. Real ranks are processes of their own, on nodes of their own, so
// this process sizes its hash by its threads. Returns the buckets in effect, or -1 where the
// kernel has no private futex hash (the global one then serves, as before 6.16).
constexpr int kPrFutexHash = 78;  // PR_FUTEX_HASH, not in older <linux/prctl.h>
constexpr int kPrFutexHashSetSlots = 1;
constexpr int kPrFutexHashGetSlots = 2;

int SizeFutexHash(int threads) {
  int slots = 16;
  while (slots < threads && slots < (1 << 17)) slots *= 2;
  (void)prctl(kPrFutexHash, kPrFutexHashSetSlots, slots, 0, 0);
  return prctl(kPrFutexHash, kPrFutexHashGetSlots, 0, 0, 0);
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t at = std::min(values.size() - 1, static_cast<size_t>(p * values.size()));
  return values[at];
}

struct RoundResult {
  double seconds = 0;
  int failures = 0;
  std::string first_error;
  CountingStore::Counts counts;
  int sockets = 0;                // descriptors of sockets opened by forming the group
  int sockets_after_data = 0;     // and after an allreduce through the data backend
  std::vector<double> op_micros;  // per allreduce: last submission to the last completion
  // Per allreduce: the last rank's arrival anywhere to the last sidecar's end of the agreement
  // (its data phase began), from the sidecars' flight records: the protocol's own latency,
  // without the wake-up of thousands of rank threads.
  std::vector<double> agreement_micros;
  // --kill-one: from the kill to the last surviving rank's failure, and whether every survivor's
  // error named the killed sidecar.
  double loss_seconds = -1;
  double first_loss_seconds = -1;     // to the first survivor's failure
  double sidecars_loss_seconds = -1;  // to the last sidecar's failing of its ranks' ops
  int loss_survivors = 0;
  int loss_unnamed = 0;
  std::string loss_example;
  // --lose-rank: from the loss of the last rank to the first and the last survivor's completion
  // of the op that waited for it, and how many of those ops failed (with an example).
  double resume_seconds = -1;
  double first_resume_seconds = -1;
  int resume_failures = 0;
  std::string resume_example;
};

// `value` becomes at least `at_least`.
void AtomicMax(std::atomic<int64_t>& value, int64_t at_least) {
  for (int64_t seen = value; at_least > seen && !value.compare_exchange_weak(seen, at_least);) {
  }
}

// An allreduce of `count` floats 1.0 (it owns its memory). One float rides the agreement; 1,024
// are too many for that and go through the data backend (Gloo's ring between sidecars).
OpRequest FloatAllReduce(size_t count = 1) {
  auto owner = std::shared_ptr<float[]>(new float[count]);
  std::fill(owner.get(), owner.get() + count, 1.0f);
  OpRequest op;
  op.kind = OpKind::kAllReduce;
  op.inputs = {TensorView{DType::kFloat32, count, reinterpret_cast<std::byte*>(owner.get()),
                          std::shared_ptr<void>(owner, owner.get()), Device{}, nullptr}};
  return op;
}

// One round: every rank joins group `name` from its own thread, runs `ops` 4-byte allreduces
// (carried by the agreement), with `count_data_connections` one 4 KiB allreduce through the data
// backend after which the sockets are counted again (the in-process backend moves data through
// a full mesh of mailboxes: too much at 1,024 sidecars), then leaves.
RoundResult RunRound(const std::string& name, int ranks, int sidecars,
                     std::vector<std::unique_ptr<GroupRegistry>>& registries, SharedStore& store,
                     int ops, milliseconds timeout,
                     const std::function<void(const std::string&, int)>& kill_one,
                     bool count_data_connections, bool lose_rank, bool lose_sidecar) {
  const bool shrink = lose_rank || lose_sidecar;
  const CountingStore::Counts before = store.counts();
  const int sockets_before = OpenSockets();
  std::mutex mutex;
  std::condition_variable cv;
  bool go = false;
  int ready = 0;
  int formed = 0;        // ranks whose Join returned
  bool counted = false;  // the sockets of the formed group were counted
  int data_done = 0;     // ranks whose data allreduce completed
  std::vector<StatusOr<Membership>> results(ranks, Status::Unavailable("not run"));
  // Allreduce k starts when the last rank submits it and ends when the last one completes.
  std::vector<std::atomic<int64_t>> last_submit(ops);
  std::vector<std::atomic<int64_t>> last_done(ops);
  for (int k = 0; k < ops; ++k) {
    last_submit[k] = 0;
    last_done[k] = 0;
  }
  auto now_ns = [] { return Clock::now().time_since_epoch().count(); };
  RoundResult result;
  // --kill-one: the survivors' last allreduce waits for the last sidecar's ranks, which never
  // issue it; the sidecar is killed once every survivor waits.
  const int doomed = sidecars - 1;
  int waiting_for_kill = 0;
  std::atomic<int64_t> killed_at{0}, last_failure{0}, first_failure{INT64_MAX};
  std::atomic<int64_t> last_failed_by_sidecar{0};  // when a sidecar completed the op, failed
  std::atomic<int> unnamed{0};
  std::string example;  // guarded by mutex
  // A survivor that has reported parks until every one has: 16,368 threads exiting while the
  // others are still being woken is the simulation's cost, not the sidecars'. A place per
  // sidecar: thousands of waiters on one condition variable share one kernel futex bucket.
  struct Parking {
    std::mutex mutex;
    std::condition_variable cv;
    bool dismissed = false;
  };
  std::vector<Parking> parking(sidecars);
  std::atomic<int> reported{0};
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  const int per_sidecar = (ranks + sidecars - 1) / sidecars;
  auto sidecar_of = [&](int rank) { return std::min(rank / per_sidecar, sidecars - 1); };
  std::atomic<int64_t> formed_at{0};
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      JoinRequest request;
      request.name = name;
      request.rank = r;
      request.world_size = ranks;
      request.store = store.view(sidecar_of(r));
      request.timeout = timeout;
      request.job_token = "bench";
      if (shrink) request.fault_tolerance = FaultTolerance{FaultToleranceMode::kShrink, 1};
      {
        std::unique_lock<std::mutex> lock(mutex);
        // Only the last one wakes the main thread: a wake-up per rank woke every waiting rank
        // each time (R^2 wake-ups at 16,384 ranks), still draining once the clock started.
        if (++ready == ranks) cv.notify_all();
        cv.wait(lock, [&] { return go; });
      }
      results[r] = registries[sidecar_of(r)]->Join(request);
      {
        // Everyone starts the ops together, once the group is formed everywhere and its
        // sockets are counted.
        std::unique_lock<std::mutex> lock(mutex);
        if (++formed == ranks) {
          formed_at = now_ns();
          result.sockets = OpenSockets() - sockets_before;
          counted = true;
          cv.notify_all();
        }
        cv.wait(lock, [&] { return counted; });
      }
      if (!results[r].ok()) return;
      Group& group = *results[r]->group;
      const int group_rank = results[r]->group_rank;
      GroupRegistry& registry = *registries[sidecar_of(r)];
      // A shrinking group's ops go through the registry, which routes them across its epochs.
      auto submit = [&](OpRequest op) {
        return shrink ? registry.Submit(name, group_rank, std::move(op))
                      : group.Submit(group_rank, std::move(op));
      };
      for (int k = 0; k < ops; ++k) {
        AtomicMax(last_submit[k], now_ns());
        std::shared_ptr<Work> work = submit(FloatAllReduce());
        if (!work->Wait(timeout).ok()) return;
        AtomicMax(last_done[k], now_ns());
      }
      if (count_data_connections) {
        // One allreduce through the data backend: the connections its algorithm needs open.
        std::shared_ptr<Work> work = group.Submit(group_rank, FloatAllReduce(1024));
        if (!work->Wait(timeout).ok()) return;
        std::unique_lock<std::mutex> lock(mutex);
        if (++data_done == ranks) {
          result.sockets_after_data = OpenSockets() - sockets_before;
          cv.notify_all();
        }
        cv.wait(lock, [&] { return data_done == ranks; });
      }
      if (lose_rank || lose_sidecar) {
        // The rank to be lost, or the sidecar's, issue nothing more.
        if (lose_rank ? r == ranks - 1 : sidecar_of(r) == doomed) return;
        std::shared_ptr<Work> work = submit(FloatAllReduce());
        {
          std::lock_guard<std::mutex> lock(mutex);
          ++waiting_for_kill;
          cv.notify_all();
        }
        const Status resumed = work->Wait(timeout);
        const int64_t done_at = now_ns();
        if (lose_sidecar) ++reported;
        AtomicMax(last_failure, done_at);
        for (int64_t seen = first_failure;
             done_at < seen && !first_failure.compare_exchange_weak(seen, done_at);) {
        }
        if (!resumed.ok() && unnamed.fetch_add(1) == 0) {
          std::lock_guard<std::mutex> lock(mutex);
          example = resumed.ToString();
        }
        return;
      }
      if (!kill_one || sidecar_of(r) == doomed) return;
      std::shared_ptr<Work> work = group.Submit(group_rank, FloatAllReduce());
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++waiting_for_kill;
        cv.notify_all();
      }
      const Status lost = work->Wait(timeout);
      const int64_t failed_at = now_ns();
      if (std::optional<Clock::time_point> finished = work->times().finished) {
        AtomicMax(last_failed_by_sidecar, finished->time_since_epoch().count());
      }
      AtomicMax(last_failure, failed_at);
      for (int64_t seen = first_failure;
           failed_at < seen && !first_failure.compare_exchange_weak(seen, failed_at);) {
      }
      // Named: the error says which sidecar was lost, not only the list of every peer.
      const std::string named = "lost sidecar sidecar-" + std::to_string(doomed) + " ";
      const bool unnamed_here = lost.ok() || lost.message().find(named) == std::string::npos;
      const int unnamed_before = unnamed_here ? unnamed.fetch_add(1) : -1;
      if (unnamed_before == 0 || (!unnamed_here && r == 0)) {
        std::lock_guard<std::mutex> lock(mutex);
        if (example.empty() || unnamed_here) example = lost.ToString();
      }
      ++reported;
      Parking& place = parking[sidecar_of(r)];
      std::unique_lock<std::mutex> parked(place.mutex);
      place.cv.wait_for(parked, timeout, [&] { return place.dismissed; });
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return ready == ranks; });
    go = true;
  }
  const int64_t start = now_ns();
  cv.notify_all();
  if (lose_rank) {
    const int lost = ranks - 1;
    std::unique_lock<std::mutex> lock(mutex);
    if (cv.wait_for(lock, timeout, [&] { return waiting_for_kill == ranks - 1; })) {
      lock.unlock();
      std::this_thread::sleep_for(milliseconds(50));  // the survivors' ops reach their sidecars
      killed_at = now_ns();
      // What a trainer's death is to its sidecar: its session ends, its rank leaves.
      GroupRegistry& registry = *registries[sidecar_of(lost)];
      (void)registry.LoseRank(name, lost, Status::PeerLost("rank lost: its session ended"));
      (void)registry.Leave(name, lost);
    }
  }
  if (kill_one) {
    for (int r = 0; r < ranks; ++r) result.loss_survivors += sidecar_of(r) == doomed ? 0 : 1;
    std::unique_lock<std::mutex> lock(mutex);
    if (cv.wait_for(lock, timeout, [&] { return waiting_for_kill == result.loss_survivors; })) {
      lock.unlock();
      std::this_thread::sleep_for(milliseconds(50));  // the survivors' ops reach their sidecars
      killed_at = now_ns();
      // Dead: its connections break and it writes nothing more to the store (no roll-call
      // answer, no published failure), as a SIGKILLed sidecar.
      store.view(doomed)->SeverWrites();
      kill_one(name, doomed);
      const auto deadline = Clock::now() + timeout;
      while (reported < result.loss_survivors && Clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(10));
      }
    }
    for (Parking& place : parking) {
      {
        std::lock_guard<std::mutex> parked(place.mutex);
        place.dismissed = true;
      }
      place.cv.notify_all();
    }
  }
  for (auto& thread : threads) thread.join();
  if (shrink && killed_at > 0) {
    result.resume_seconds = (last_failure.load() - killed_at.load()) / 1e9;
    result.first_resume_seconds = (first_failure.load() - killed_at.load()) / 1e9;
    result.resume_failures = unnamed;
    result.resume_example = example;
  } else if (killed_at > 0) {
    result.loss_seconds = (last_failure.load() - killed_at.load()) / 1e9;
    result.first_loss_seconds = (first_failure.load() - killed_at.load()) / 1e9;
    result.sidecars_loss_seconds = (last_failed_by_sidecar.load() - killed_at.load()) / 1e9;
    result.loss_unnamed = unnamed;
    result.loss_example = example;
  }
  result.seconds = (formed_at.load() - start) / 1e9;
  const CountingStore::Counts after = store.counts();
  result.counts = {after.calls - before.calls, after.keys - before.keys,
                   after.bytes_in - before.bytes_in, after.bytes_out - before.bytes_out};
  for (int k = 0; k < ops; ++k) {
    if (last_done[k] > 0 && last_submit[k] > 0) {
      result.op_micros.push_back((last_done[k] - last_submit[k]) / 1e3);
    }
  }
  std::map<uint64_t, int64_t> agreed_after;  // by sequence number: the slowest sidecar's
  for (int r = 0; r < ranks; ++r) {
    if (!results[r].ok() || (r > 0 && sidecar_of(r - 1) == sidecar_of(r))) continue;
    for (const OpRecord& record : results[r]->group->FlightRecords(ops + 8)) {
      if (record.kind != OpKind::kAllReduce || record.data_started_us < 0 ||
          record.sequence_number == 0) {
        continue;
      }
      // Arrivals are relative to the first anywhere; `issued` is this sidecar's first.
      int64_t first_local = INT64_MAX, last_anywhere = -1;
      for (const auto& [rank, arrival] : record.known_arrivals_us) {
        if (arrival < 0) continue;
        last_anywhere = std::max(last_anywhere, arrival);
        if (sidecar_of(static_cast<int>(rank)) == sidecar_of(r))
          first_local = std::min(first_local, arrival);
      }
      if (last_anywhere < 0 || first_local == INT64_MAX) continue;
      const int64_t agreed = record.data_started_us + first_local - last_anywhere;
      int64_t& slowest = agreed_after[record.sequence_number];
      slowest = std::max(slowest, agreed);
    }
  }
  for (const auto& [sequence, micros] : agreed_after) {
    result.agreement_micros.push_back(static_cast<double>(micros));
  }
  for (int r = 0; r < ranks; ++r) {
    if (!results[r].ok()) {
      if (result.failures++ == 0) result.first_error = results[r].status().ToString();
      continue;
    }
    (void)registries[sidecar_of(r)]->Leave(name, results[r]->group_rank);
  }
  return result;
}

std::vector<int> ParseInts(const char* text) {
  std::vector<int> values;
  for (const char* at = text; *at;) {
    char* end = nullptr;
    long value = std::strtol(at, &end, 10);
    if (end == at || value <= 0) {
      std::fprintf(stderr, "bad number list '%s'\n", text);
      std::exit(2);
    }
    values.push_back(static_cast<int>(value));
    at = *end == ',' ? end + 1 : end;
  }
  return values;
}

constexpr char kUsage[] =
    "usage: scale_bench [--sidecars 16,64,256,1024] [--ranks-per-sidecar 16] [--rounds 3]\n"
    "                   [--store memory|grpc] [--transport in-process|sockets]\n"
    "                   [--agreement-ops 50] [--timeout-s 300]\n"
    "                   [--kill-one | --lose-rank | --lose-sidecar]\n"
    "                   [--runtime-per-sidecar] [--link-latency-ms 0] [--kernel-futex-hash]\n"
    "  --runtime-per-sidecar: each simulated sidecar gets an executor, timer and reactor of its\n"
    "  own (one executor thread), as real sidecars do, instead of one shared by all\n"
    "  --kill-one: after the allreduces, the last sidecar is killed while\n"
    "  every other rank waits in an allreduce its ranks never issue; prints how long until the\n"
    "  last survivor failed and whether every survivor's error named the lost sidecar\n"
    "  --lose-rank: the group shrinks (fault tolerance); after the allreduces the last rank is\n"
    "  lost (its session ends) while every other rank waits in an allreduce it never issues;\n"
    "  prints how long until the survivors completed that op among themselves\n"
    "  --lose-sidecar: the group shrinks; after the allreduces the last sidecar is killed as\n"
    "  with --kill-one; prints how long until the survivors completed that op among themselves\n"
    "  --link-latency-ms (in-process transport): every message between sidecars spends this long\n"
    "  on the wire, so that the agreement's latency shows its depth (its hops) rather than this\n"
    "  machine's CPU, which runs every simulated sidecar's share of it\n"
    "  --kernel-futex-hash: keep the kernel's private futex hash of this process (Linux 6.16+: 16\n"
    "  buckets on 2 cores, whatever the threads) instead of one sized by the rank threads\n";

int Main(int argc, char** argv) {
  std::vector<int> sidecar_counts = {16, 64, 256, 1024};
  int ranks_per_sidecar = 16;
  int rounds = 3;
  int ops = 50;
  int timeout_s = 300;
  std::string store_mode = "memory";
  std::string transport = "in-process";
  bool kill_one = false;
  bool lose_rank = false;
  bool lose_sidecar = false;
  bool runtime_per_sidecar = false;
  bool kernel_futex_hash = false;
  int link_latency_ms = 0;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::printf("%s", kUsage);
      return 0;
    }
    if (flag == "--kill-one") {
      kill_one = true;
      continue;
    }
    if (flag == "--lose-rank") {
      lose_rank = true;
      continue;
    }
    if (flag == "--lose-sidecar") {
      lose_sidecar = true;
      kill_one = true;
      continue;
    }
    if (flag == "--runtime-per-sidecar") {
      runtime_per_sidecar = true;
      continue;
    }
    if (flag == "--kernel-futex-hash") {
      kernel_futex_hash = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flag %s needs a value\n%s", flag.c_str(), kUsage);
      return 2;
    }
    const char* value = argv[++i];
    if (flag == "--sidecars") {
      sidecar_counts = ParseInts(value);
    } else if (flag == "--ranks-per-sidecar") {
      ranks_per_sidecar = std::max(1, std::atoi(value));
    } else if (flag == "--rounds") {
      rounds = std::max(1, std::atoi(value));
    } else if (flag == "--agreement-ops") {
      ops = std::max(0, std::atoi(value));
    } else if (flag == "--link-latency-ms") {
      link_latency_ms = std::max(0, std::atoi(value));
    } else if (flag == "--timeout-s") {
      timeout_s = std::max(1, std::atoi(value));
    } else if (flag == "--store") {
      store_mode = value;
    } else if (flag == "--transport") {
      transport = value;
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
  }
  if (store_mode != "memory" && store_mode != "grpc") {
    std::fprintf(stderr, "unknown store '%s' (memory or grpc)\n", store_mode.c_str());
    return 2;
  }
  if (transport != "in-process" && transport != "sockets") {
    std::fprintf(stderr, "unknown transport '%s' (in-process or sockets)\n", transport.c_str());
    return 2;
  }
  if (link_latency_ms > 0 && transport != "in-process") {
    std::fprintf(stderr, "--link-latency-ms needs --transport in-process\n");
    return 2;
  }
  // Over sockets, Gloo's calls (connecting pairs on first use included) block an executor thread
  // per simulated sidecar until its peers make the same call: one executor shared by hundreds of
  // sidecars runs out of threads to lend, as no real sidecar would. Each gets its own.
  if (transport == "sockets") runtime_per_sidecar = true;
  // Thousands of rank threads and sockets: take every descriptor the hard limit allows.
  rlimit files{};
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &files);
  }
  SetLogLevel(LogLevel::kWarning);  // one "joined group" line per rank would drown the table
  const int most_ranks =
      *std::max_element(sidecar_counts.begin(), sidecar_counts.end()) * ranks_per_sidecar;
  // The kernel makes a private hash once the process starts threads: none here yet.
  const std::string futex_hash = kernel_futex_hash ? "the kernel's default" : [&] {
    const int buckets = SizeFutexHash(2 * most_ranks);
    return buckets > 0 ? std::to_string(buckets) + " buckets" : "the kernel's global one";
  }();
  std::printf(
      "one group: R ranks (a thread each) over S simulated sidecars (a GroupRegistry each), "
      "store %s, transport %s, median of %d rounds; futex hash: %s\n",
      store_mode.c_str(), transport.c_str(), rounds, futex_hash.c_str());
  std::printf("%6s %8s %10s %10s %10s %12s %12s %8s %6s %10s %10s %10s %10s %7s\n", "ranks",
              "sidecars", "form (s)", "calls/rk", "keys/rk", "B in/rk", "B out/rk", "conn/sc",
              "+data", "agree p50", "p99 (us)", "op p50", "p99 (us)", "failed");
  std::string last_line;
  std::shared_ptr<Runtime> runtime = *Runtime::Create();  // shared by every simulated sidecar
  for (int sidecars : sidecar_counts) {
    const int ranks = sidecars * ranks_per_sidecar;
    SharedStore store(store_mode == "grpc", sidecars);
    std::shared_ptr<InProcessFabric> fabric;
    if (transport == "in-process") {
      fabric = InProcessFabric::Create();
      fabric->SetLinkLatency(milliseconds(link_latency_ms));
    }
    std::vector<std::unique_ptr<GroupRegistry>> registries;
    for (int s = 0; s < sidecars; ++s) {
      GroupRegistryOptions options;
      options.sidecar_id = "sidecar-" + std::to_string(s);
      options.advertise_host = "127.0.0.1";
      options.runtime = runtime;
      if (runtime_per_sidecar) {
        // As real sidecars: an executor (one thread, lending more while blocked) of its own.
        RuntimeOptions own;
        own.executor.threads = 1;
        own.executor.max_blocking_threads = 8;
        options.runtime = *Runtime::Create(own);
      }
      options.transports = fabric;  // null: the real SidecarTransportFactory
      registries.push_back(std::make_unique<GroupRegistry>(std::move(options)));
    }
    std::vector<double> seconds;
    std::vector<double> micros;
    std::vector<double> agreement;
    int failures = 0;
    RoundResult last;
    for (int round = 0; round < rounds; ++round) {
      // In-process, the fabric cuts the sidecar off; over sockets its group fails where it
      // stands and closes its connections (its store view already takes no writes, so it
      // publishes nothing and answers no roll call), which is what its peers see of a SIGKILL.
      std::function<void(const std::string&, int)> kill;
      if (kill_one && fabric) {
        kill = [&fabric](const std::string& group, int node) {
          (void)fabric->KillNode(group, node);
        };
      } else if (kill_one) {
        kill = [&registries](const std::string& group, int node) {
          (void)registries[node]->FailGroup(group, Status::Aborted("sidecar killed"));
        };
      }
      last = RunRound("scale-" + std::to_string(round), ranks, sidecars, registries, store, ops,
                      std::chrono::seconds(timeout_s), kill,
                      /*count_data_connections=*/transport == "sockets", lose_rank, lose_sidecar);
      if (last.resume_seconds >= 0) {
        const std::string lost =
            lose_sidecar ? "sidecar-" + std::to_string(sidecars - 1) + " killed"
                         : "rank " + std::to_string(ranks - 1) + " lost (its session ended)";
        std::printf(
            "  %d sidecars, round %d: %s from a shrinking group; the first of %d survivors "
            "completed the op that waited for it %.3f s later, the last %.3f s later; %d of "
            "those ops failed%s%s\n",
            sidecars, round, lost.c_str(), lose_sidecar ? last.loss_survivors : ranks - 1,
            last.first_resume_seconds, last.resume_seconds, last.resume_failures,
            last.resume_example.empty() ? "" : ", e.g. ",
            last.resume_example.substr(0, 300).c_str());
      }
      if (last.loss_seconds >= 0) {
        std::printf(
            "  %d sidecars, round %d: sidecar-%d killed; the first of %d surviving ranks "
            "failed %.3f s later, the last %.3f s later (the last sidecar failed its ranks' ops "
            "%.3f s after the kill); %d errors did not name it; e.g. %s\n",
            sidecars, round, sidecars - 1, last.loss_survivors, last.first_loss_seconds,
            last.loss_seconds, last.sidecars_loss_seconds, last.loss_unnamed,
            last.loss_example.substr(0, 300).c_str());
      }
      if (last.failures > 0) {
        std::fprintf(stderr, "  %d sidecars, round %d: %d ranks failed, first: %s\n", sidecars,
                     round, last.failures, last.first_error.c_str());
      }
      seconds.push_back(last.seconds);
      micros.insert(micros.end(), last.op_micros.begin(), last.op_micros.end());
      agreement.insert(agreement.end(), last.agreement_micros.begin(), last.agreement_micros.end());
      failures += last.failures;
    }
    const double per_rank = ranks;
    const double form = Percentile(seconds, 0.5);
    const double p50 = Percentile(agreement, 0.5);
    const double connections = static_cast<double>(last.sockets) / sidecars;
    const double with_data = static_cast<double>(last.sockets_after_data) / sidecars;
    char with_data_text[16] = "-";  // measured over sockets only
    if (transport == "sockets") {
      std::snprintf(with_data_text, sizeof(with_data_text), "%.1f", with_data);
    }
    std::printf(
        "%6d %8d %10.3f %10.2f %10.2f %12.1f %12.1f %8.1f %6s %10.0f %10.0f %10.0f %10.0f %7d\n",
        ranks, sidecars, form, last.counts.calls / per_rank, last.counts.keys / per_rank,
        last.counts.bytes_in / per_rank, last.counts.bytes_out / per_rank, connections,
        with_data_text, p50, Percentile(agreement, 0.99), Percentile(micros, 0.5),
        Percentile(micros, 0.99), failures);
    std::fflush(stdout);
    char line[256];
    std::snprintf(line, sizeof(line),
                  "scale: %d ranks over %d sidecars formed in %.3f s; agreement p50 %.0f us; max "
                  "connections per sidecar %.0f",
                  ranks, sidecars, form, p50, std::max(connections, with_data));
    last_line = line;
    registries.clear();
  }
  std::printf("%s\n", last_line.c_str());
  return 0;
}

}  // namespace
}  // namespace collectived

int main(int argc, char** argv) {
  return collectived::Main(argc, argv);
}
