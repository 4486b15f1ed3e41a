// Rendezvous scale benchmark: how long R ranks spread over S sidecars take to form one group.
//
// Each simulated sidecar is a real GroupRegistry of its own (its own sidecar id, the real
// SidecarTransportFactory, so a real Gloo TCP mesh on 127.0.0.1 among the sidecars); every rank
// is a thread calling Join, as a trainer's request does in a sidecar. All of them meet in ONE
// store, in one of two modes:
//   memory  every registry uses one in-process MemoryStore directly;
//   grpc    the store is served by a StoreService on a loopback TCP port; the registry of
//           sidecar 0 hosts it (uses the MemoryStore directly), every other registry reaches it
//           through its own RemoteStore, as real sidecars meet in the store of one of them.
// Every round creates a new incarnation of the group and destroys it afterwards. The time of a
// round runs from releasing the (already started) rank threads to the last Join returning.
// Prints a table; asserts nothing.
//
// Usage: rendezvous_scale [--ranks 256,1024] [--sidecars 1,4,16] [--rounds 3]
//                         [--store memory,grpc] [--timeout-s 120]
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/group/group_registry.h"
#include "engine/logging.h"
#include "engine/store/memory_store.h"
#include "rpc/limits.h"
#include "rpc/remote_store.h"
#include "services/collectived/store_service.h"

namespace collectived {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Forwards every call to another store and counts the calls (for a RemoteStore, the requests
// sent) and the keys they name.
class CountingStore final : public Store {
 public:
  explicit CountingStore(std::shared_ptr<Store> inner) : inner_(std::move(inner)) {}

  int64_t calls() const { return calls_.load(); }
  int64_t keys() const { return keys_.load(); }
  void Reset() {
    calls_ = 0;
    keys_ = 0;
  }

 protected:
  Status DoSet(const std::string& key, std::string value) override {
    Count(1);
    return inner_->Set(key, std::move(value));
  }
  StatusOr<std::string> DoGet(const std::string& key, milliseconds timeout) override {
    Count(1);
    return inner_->Get(key, timeout);
  }
  StatusOr<int64_t> DoAdd(const std::string& key, int64_t delta) override {
    Count(1);
    return inner_->Add(key, delta);
  }
  StatusOr<std::string> DoCompareSet(const std::string& key, const std::string& expected,
                                     std::string desired) override {
    Count(1);
    return inner_->CompareSet(key, expected, std::move(desired));
  }
  Status DoWait(const std::vector<std::string>& keys, milliseconds timeout) override {
    Count(keys.size());
    return inner_->Wait(keys, timeout);
  }
  StatusOr<bool> DoCheck(const std::vector<std::string>& keys) override {
    Count(keys.size());
    return inner_->Check(keys);
  }
  StatusOr<bool> DoDeleteKey(const std::string& key) override {
    Count(1);
    return inner_->DeleteKey(key);
  }
  StatusOr<int64_t> DoDeletePrefix(const std::string& prefix) override {
    Count(1);
    return inner_->DeletePrefix(prefix);
  }
  StatusOr<int64_t> DoNumKeys() override {
    Count(0);
    return inner_->NumKeys();
  }
  StatusOr<std::vector<std::string>> DoMultiGet(const std::vector<std::string>& keys,
                                                milliseconds timeout) override {
    Count(keys.size());
    return inner_->MultiGet(keys, timeout);
  }
  Status DoMultiSet(const std::vector<std::string>& keys,
                    std::vector<std::string> values) override {
    Count(keys.size());
    return inner_->MultiSet(keys, std::move(values));
  }
  Status DoAppend(const std::string& key, std::string_view value) override {
    Count(1);
    return inner_->Append(key, value);
  }
  WaitId DoWaitAsync(std::vector<std::string> keys, milliseconds timeout,
                     WaitCallback done) override {
    Count(keys.size());
    return inner_->WaitAsync(std::move(keys), timeout, std::move(done));
  }
  bool DoCancelWait(WaitId id) override { return inner_->CancelWait(id); }

 private:
  void Count(size_t keys) {
    calls_.fetch_add(1, std::memory_order_relaxed);
    keys_.fetch_add(static_cast<int64_t>(keys), std::memory_order_relaxed);
  }

  const std::shared_ptr<Store> inner_;
  std::atomic<int64_t> calls_{0};
  std::atomic<int64_t> keys_{0};
};

// The store all sidecars meet in, and the view each sidecar has of it.
class SharedStore {
 public:
  SharedStore(bool grpc, int sidecars) : memory_(std::make_shared<MemoryStore>()) {
    if (grpc) {
      service_ = std::make_unique<StoreService>(memory_, StoreAccessPolicy{}, metrics_);
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
        (void)(*remote)->Check({"warm-up"});  // connect before anything is timed
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
  int64_t calls() const {
    int64_t total = 0;
    for (const auto& v : views_) total += v->calls();
    return total;
  }
  int64_t keys() const {
    int64_t total = 0;
    for (const auto& v : views_) total += v->keys();
    return total;
  }
  // Calls through RemoteStores only (the gRPC requests).
  int64_t remote_calls(bool grpc) const {
    if (!grpc) return 0;
    int64_t total = 0;
    for (size_t s = 1; s < views_.size(); ++s) total += views_[s]->calls();
    return total;
  }
  void Reset() {
    for (const auto& v : views_) v->Reset();
  }

 private:
  std::shared_ptr<MemoryStore> memory_;
  Metrics metrics_;
  std::unique_ptr<StoreService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::vector<std::shared_ptr<CountingStore>> views_;
};

struct RoundResult {
  double seconds = 0;
  int failures = 0;
  std::string first_error;
  int64_t calls = 0;
  int64_t keys = 0;
  int64_t remote_calls = 0;
};

// One round: every rank joins group `name` from its thread, then every rank leaves.
RoundResult RunRound(const std::string& name, int ranks, int sidecars,
                     std::vector<std::unique_ptr<GroupRegistry>>& registries, SharedStore& store,
                     bool grpc, milliseconds timeout) {
  store.Reset();
  std::mutex mutex;
  std::condition_variable go_cv;
  bool go = false;
  std::atomic<int> ready{0};
  std::vector<StatusOr<Membership>> results(ranks, Status::Unavailable("not run"));
  std::vector<std::thread> threads;
  threads.reserve(ranks);
  const int per_sidecar = (ranks + sidecars - 1) / sidecars;
  auto sidecar_of = [&](int rank) { return std::min(rank / per_sidecar, sidecars - 1); };
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      JoinRequest request;
      request.name = name;
      request.rank = r;
      request.world_size = ranks;
      request.store = store.view(sidecar_of(r));
      request.timeout = timeout;
      request.job_token = "bench";
      {
        std::unique_lock<std::mutex> lock(mutex);
        ready.fetch_add(1);
        go_cv.notify_all();
        go_cv.wait(lock, [&] { return go; });
      }
      results[r] = registries[sidecar_of(r)]->Join(request);
    });
  }
  {
    std::unique_lock<std::mutex> lock(mutex);
    go_cv.wait(lock, [&] { return ready.load() == ranks; });
    go = true;
  }
  const auto start = Clock::now();
  go_cv.notify_all();
  for (auto& thread : threads) thread.join();
  RoundResult result;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  result.calls = store.calls();
  result.keys = store.keys();
  result.remote_calls = store.remote_calls(grpc);
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

std::vector<std::string> ParseWords(const char* text) {
  std::vector<std::string> words;
  std::string word;
  for (const char* at = text;; ++at) {
    if (*at == ',' || *at == '\0') {
      if (!word.empty()) words.push_back(word);
      word.clear();
      if (*at == '\0') break;
    } else {
      word += *at;
    }
  }
  return words;
}

int Main(int argc, char** argv) {
  std::vector<int> rank_counts = {256, 1024};
  std::vector<int> sidecar_counts = {1, 4, 16};
  std::vector<std::string> modes = {"memory", "grpc"};
  int rounds = 3;
  int timeout_s = 120;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "flag %s needs a value\n", flag.c_str());
      return 2;
    }
    const char* value = argv[++i];
    if (flag == "--ranks") {
      rank_counts = ParseInts(value);
    } else if (flag == "--sidecars") {
      sidecar_counts = ParseInts(value);
    } else if (flag == "--rounds") {
      rounds = std::max(1, std::atoi(value));
    } else if (flag == "--store") {
      modes = ParseWords(value);
    } else if (flag == "--timeout-s") {
      timeout_s = std::max(1, std::atoi(value));
    } else {
      std::fprintf(stderr,
                   "unknown flag %s\nusage: rendezvous_scale [--ranks 256,1024] "
                   "[--sidecars 1,4,16] [--rounds 3] [--store memory,grpc] [--timeout-s 120]\n",
                   flag.c_str());
      return 2;
    }
  }
  for (const std::string& mode : modes) {
    if (mode != "memory" && mode != "grpc") {
      std::fprintf(stderr, "unknown store mode '%s' (memory or grpc)\n", mode.c_str());
      return 2;
    }
  }
  SetLogLevel(LogLevel::kWarning);  // one "joined group" line per rank would drown the table
  std::printf(
      "group creation: R ranks (one thread each) over S sidecars (GroupRegistry + Gloo "
      "TCP on 127.0.0.1), %d rounds each\n",
      rounds);
  std::printf(
      "store requests: calls made by the registries (and their Gloo rendezvous) per "
      "round; over gRPC, those of the remote sidecars\n\n");
  std::printf("%-7s %6s %8s %11s %11s %12s %12s %12s %8s\n", "store", "ranks", "sidecars",
              "median (s)", "max (s)", "calls/round", "keys/round", "rpcs/round", "failed");
  for (const std::string& mode : modes) {
    const bool grpc = mode == "grpc";
    for (int ranks : rank_counts) {
      for (int sidecars : sidecar_counts) {
        if (sidecars > ranks) continue;
        SharedStore store(grpc, sidecars);
        std::vector<std::unique_ptr<GroupRegistry>> registries;
        for (int s = 0; s < sidecars; ++s) {
          GroupRegistryOptions options;
          options.sidecar_id = "sidecar-" + std::to_string(s);
          options.advertise_host = "127.0.0.1";
          registries.push_back(std::make_unique<GroupRegistry>(std::move(options)));
        }
        std::vector<RoundResult> results;
        for (int round = 0; round < rounds; ++round) {
          results.push_back(RunRound("scale-" + std::to_string(round), ranks, sidecars, registries,
                                     store, grpc, std::chrono::seconds(timeout_s)));
          if (results.back().failures > 0) {
            std::fprintf(stderr, "  round %d: %d ranks failed, first: %s\n", round,
                         results.back().failures, results.back().first_error.c_str());
          }
        }
        std::vector<double> seconds;
        int failures = 0;
        for (const RoundResult& r : results) {
          seconds.push_back(r.seconds);
          failures += r.failures;
        }
        std::sort(seconds.begin(), seconds.end());
        const RoundResult& last = results.back();
        std::printf("%-7s %6d %8d %11.3f %11.3f %12lld %12lld %12lld %8d\n", mode.c_str(), ranks,
                    sidecars, seconds[seconds.size() / 2], seconds.back(),
                    static_cast<long long>(last.calls), static_cast<long long>(last.keys),
                    static_cast<long long>(last.remote_calls), failures);
        std::fflush(stdout);
        registries.clear();
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace collectived

int main(int argc, char** argv) {
  return collectived::Main(argc, argv);
}
