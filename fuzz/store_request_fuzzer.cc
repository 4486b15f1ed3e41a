// Fuzz target: the rendezvous store as the Store service drives it. The input is a program of
// store calls (set, get, add, compare_set, delete_key, check, num_keys, multi_get, multi_set,
// append, wait, wait_async/cancel, set_default_timeout) with fuzzed keys, values, deltas and
// timeouts, run against a MemoryStore, directly or through a PrefixStore. The Store base class
// is the service's validation (the service passes request fields straight to it), so invalid
// keys, values and timeouts are checked here; every result is compared with a plain std::map
// model of c10d's semantics, and every WaitAsync callback must run exactly once.
//
// No call may block: waits on missing keys use a 1 ms timeout (at most a few per input) or an
// invalid one; waits on present keys may use any timeout, the default and "no deadline" too.
// Values at the 16 MiB limit would make every input slow, so the value limit (set, append,
// compare_set, multi_set) is checked once per process instead, by CheckValueLimits.
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/store/memory_store.h"
#include "engine/store/prefix_store.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"

namespace collectived::fuzz {
namespace {

using std::chrono::milliseconds;

constexpr int kMaxTimedWaits = 1;  // 1 ms waits on missing keys per input

class Program {
 public:
  Program(const uint8_t* data, size_t size) : in_(data, size) {
    memory_ = std::make_shared<MemoryStore>();
    if (in_.Bool()) {
      prefix_ = "g" + std::to_string(in_.U8() % 4);
      store_ = std::make_shared<PrefixStore>(prefix_, memory_);
    } else {
      store_ = memory_;
    }
  }

  void Run() {
    while (!in_.empty()) Step();
    // The store ends as the model does.
    for (const auto& [key, value] : model_) {
      StatusOr<std::string> got = store_->Get(key, milliseconds(1));
      FUZZ_CHECK(got.ok() && *got == value, "final get of a key the model holds: %s",
                 got.status().ToString().c_str());
    }
    StatusOr<int64_t> count = store_->NumKeys();
    FUZZ_CHECK(count.ok() && *count == static_cast<int64_t>(model_.size()),
               "num_keys %lld, model %zu", count.ok() ? static_cast<long long>(*count) : -1LL,
               model_.size());
    // Destroying the store completes every pending async wait (Aborted) on this thread.
    store_.reset();
    memory_.reset();
    FUZZ_CHECK(async_->done.load() == async_->started, "%d async waits started, %d callbacks ran",
               async_->started, async_->done.load());
    FUZZ_CHECK(async_->twice.load() == 0, "an async wait completed twice");
  }

 private:
  // Callbacks may run on the store's timer thread after Program is gone: shared state.
  struct AsyncState {
    int started = 0;
    std::atomic<int> done{0};
    std::atomic<int> twice{0};
  };

  // A key from a small pool (so calls meet), an arbitrary short one, an empty one, or one near
  // the length limit.
  std::string Key() {
    const uint8_t choice = in_.U8();
    if (choice < 160) return "k" + std::to_string(choice % 6);
    if (choice < 230) return in_.String(48);
    if (choice < 240) return "";
    return std::string(kMaxKeyBytes - prefix_overhead() - 1 + in_.U8() % 3, 'k');
  }
  std::vector<std::string> Keys() {
    std::vector<std::string> keys(in_.U8() % 5);
    for (auto& key : keys) key = Key();
    return keys;
  }
  std::string Value() {
    const uint8_t choice = in_.U8();
    if (choice < 100) return std::to_string(static_cast<int64_t>(in_.U64()) >> (in_.U8() % 64));
    return in_.String(32);
  }

  size_t prefix_overhead() const { return prefix_.empty() ? 0 : prefix_.size() + 1; }
  bool ValidKey(const std::string& key) const {
    return !key.empty() && key.size() + prefix_overhead() <= kMaxKeyBytes;
  }
  bool AllValid(const std::vector<std::string>& keys) const {
    for (const auto& key : keys) {
      if (!ValidKey(key)) return false;
    }
    return true;
  }
  bool AllPresent(const std::vector<std::string>& keys) const {
    for (const auto& key : keys) {
      if (!model_.count(key)) return false;
    }
    return true;
  }
  static bool ValidTimeout(milliseconds t) { return t.count() >= 0 && t <= kMaxStoreTimeout; }

  // A timeout that cannot block for long on `keys`: anything when they all exist; otherwise an
  // invalid one or (a few times per input) 1 ms.
  StoreTimeout Timeout(const std::vector<std::string>& keys) {
    const uint8_t choice = in_.U8();
    if (AllPresent(keys) || !AllValid(keys)) {
      switch (choice % 4) {
        case 0:
          return std::nullopt;
        case 1:
          return milliseconds(0);
        case 2:
          return milliseconds(1);
        default:
          return milliseconds(in_.I64());
      }
    }
    if (choice % 8 == 0 && timed_waits_ < kMaxTimedWaits) {
      ++timed_waits_;
      return milliseconds(1);
    }
    int64_t raw = in_.I64();
    if (raw >= 0 && raw <= kMaxStoreTimeout.count()) raw = -1 - raw;
    return milliseconds(raw);
  }
  // What a wait with `timeout` on `keys` must give: InvalidArgument, OK or Timeout.
  ErrorKind ExpectedWait(const std::vector<std::string>& keys, StoreTimeout timeout) const {
    if (!AllValid(keys) || (timeout && !ValidTimeout(*timeout))) return ErrorKind::kInvalidArgument;
    return AllPresent(keys) ? ErrorKind::kOk : ErrorKind::kTimeout;
  }

  static std::optional<int64_t> Parse(const std::string& text) {
    if (text.empty()) return 0;
    int64_t value = 0;
    auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
    return value;
  }

  void Expect(const Status& status, ErrorKind kind, const char* op) {
    FUZZ_CHECK(status.kind() == kind, "%s: got %s, expected kind %d", op, status.ToString().c_str(),
               static_cast<int>(kind));
    FUZZ_CHECK(status.ok() || !status.message().empty(), "%s: an error without a message", op);
  }

  void Step() {
    switch (in_.U8() % 14) {
      case 0: {
        std::string key = Key(), value = Value();
        const bool valid = ValidKey(key) && value.size() <= kMaxValueBytes;
        Expect(store_->Set(key, value), valid ? ErrorKind::kOk : ErrorKind::kInvalidArgument,
               "set");
        if (valid) model_[key] = value;
        break;
      }
      case 1: {
        std::string key = Key();
        StoreTimeout timeout = Timeout({key});
        StatusOr<std::string> got = store_->Get(key, timeout);
        Expect(got.status(), ExpectedWait({key}, timeout), "get");
        if (got.ok()) FUZZ_CHECK(*got == model_[key], "get returned another value");
        break;
      }
      case 2: {
        std::string key = Key();
        const int64_t delta = static_cast<int64_t>(in_.U64()) >> (in_.U8() % 64);
        StatusOr<int64_t> sum = store_->Add(key, delta);
        std::optional<int64_t> current =
            ValidKey(key) ? Parse(model_.count(key) ? model_[key] : "") : std::nullopt;
        int64_t expected = 0;
        if (!current || __builtin_add_overflow(*current, delta, &expected)) {
          Expect(sum.status(), ErrorKind::kInvalidArgument, "add");
        } else {
          Expect(sum.status(), ErrorKind::kOk, "add");
          FUZZ_CHECK(*sum == expected, "add returned %lld, expected %lld",
                     static_cast<long long>(*sum), static_cast<long long>(expected));
          model_[key] = std::to_string(expected);
        }
        break;
      }
      case 3: {
        std::string key = Key(), expected = in_.Bool() ? "" : Value(), desired = Value();
        StatusOr<std::string> got = store_->CompareSet(key, expected, desired);
        if (!ValidKey(key) || expected.size() > kMaxValueBytes || desired.size() > kMaxValueBytes) {
          Expect(got.status(), ErrorKind::kInvalidArgument, "compare_set");
          break;
        }
        Expect(got.status(), ErrorKind::kOk, "compare_set");
        auto it = model_.find(key);
        std::string result;
        if (it == model_.end()) {
          result = expected.empty() ? desired : expected;
          if (expected.empty()) model_[key] = desired;
        } else if (it->second == expected) {
          result = desired;
          it->second = desired;
        } else {
          result = it->second;
        }
        FUZZ_CHECK(*got == result, "compare_set returned another value");
        break;
      }
      case 4: {
        std::string key = Key();
        StatusOr<bool> deleted = store_->DeleteKey(key);
        if (!ValidKey(key)) {
          Expect(deleted.status(), ErrorKind::kInvalidArgument, "delete_key");
          break;
        }
        Expect(deleted.status(), ErrorKind::kOk, "delete_key");
        FUZZ_CHECK(*deleted == (model_.erase(key) == 1), "delete_key answered wrong");
        break;
      }
      case 5: {
        std::vector<std::string> keys = Keys();
        StatusOr<bool> present = store_->Check(keys);
        Expect(present.status(), AllValid(keys) ? ErrorKind::kOk : ErrorKind::kInvalidArgument,
               "check");
        if (present.ok()) FUZZ_CHECK(*present == AllPresent(keys), "check answered wrong");
        break;
      }
      case 6: {
        StatusOr<int64_t> count = store_->NumKeys();
        Expect(count.status(), ErrorKind::kOk, "num_keys");
        FUZZ_CHECK(*count == static_cast<int64_t>(model_.size()), "num_keys %lld, model %zu",
                   static_cast<long long>(*count), model_.size());
        break;
      }
      case 7: {
        std::vector<std::string> keys = Keys();
        StoreTimeout timeout = Timeout(keys);
        StatusOr<std::vector<std::string>> values = store_->MultiGet(keys, timeout);
        Expect(values.status(), ExpectedWait(keys, timeout), "multi_get");
        if (values.ok()) {
          FUZZ_CHECK(values->size() == keys.size(), "multi_get: %zu values for %zu keys",
                     values->size(), keys.size());
          for (size_t i = 0; i < keys.size(); ++i) {
            FUZZ_CHECK((*values)[i] == model_[keys[i]], "multi_get value %zu differs", i);
          }
        }
        break;
      }
      case 8: {
        std::vector<std::string> keys = Keys();
        std::vector<std::string> values(in_.Bool() ? keys.size() : in_.U8() % 5);
        for (auto& value : values) value = Value();
        bool valid = keys.size() == values.size() && AllValid(keys);
        for (const auto& value : values) valid &= value.size() <= kMaxValueBytes;
        Expect(store_->MultiSet(keys, values), valid ? ErrorKind::kOk : ErrorKind::kInvalidArgument,
               "multi_set");
        if (valid) {
          for (size_t i = 0; i < keys.size(); ++i) model_[keys[i]] = values[i];
        }
        break;
      }
      case 9: {
        std::string key = Key(), value = Value();
        const size_t before = model_.count(key) ? model_[key].size() : 0;
        const bool valid = ValidKey(key) && value.size() <= kMaxValueBytes &&
                           before + value.size() <= kMaxValueBytes;
        Expect(store_->Append(key, value), valid ? ErrorKind::kOk : ErrorKind::kInvalidArgument,
               "append");
        if (valid) model_[key] += value;
        break;
      }
      case 10: {
        std::vector<std::string> keys = Keys();
        StoreTimeout timeout = Timeout(keys);
        Expect(store_->Wait(keys, timeout), ExpectedWait(keys, timeout), "wait");
        break;
      }
      case 11: {
        // Any timeout: a pending wait blocks nobody, and the store's destruction ends it.
        std::vector<std::string> keys = Keys();
        StoreTimeout timeout;
        if (in_.Bool()) timeout = milliseconds(in_.Bool() ? in_.U8() % 3 : in_.I64());
        ++async_->started;
        auto state = async_;
        auto called = std::make_shared<std::atomic<bool>>(false);
        WaitId id = store_->WaitAsync(keys, timeout, [state, called](Status) {
          if (called->exchange(true)) state->twice.fetch_add(1);
          state->done.fetch_add(1);
        });
        if (id == kInvalidWaitId) FUZZ_CHECK(called->load(), "no id and no callback");
        if (in_.Bool()) {
          bool cancelled = store_->CancelWait(id);
          if (cancelled) FUZZ_CHECK(called->load(), "cancelled without a callback");
        }
        break;
      }
      case 12: {
        const milliseconds timeout(in_.Bool() ? in_.U8() : in_.I64());
        Expect(store_->SetDefaultTimeout(timeout),
               ValidTimeout(timeout) ? ErrorKind::kOk : ErrorKind::kInvalidArgument,
               "set_default_timeout");
        break;
      }
      case 13: {
        // A key, or its first bytes: a prefix of several model keys.
        std::string prefix = Key();
        prefix.resize(in_.U8() % (prefix.size() + 1));
        StatusOr<std::int64_t> deleted = store_->DeletePrefix(prefix);
        if (!ValidKey(prefix)) {
          Expect(deleted.status(), ErrorKind::kInvalidArgument, "delete_prefix");
          break;
        }
        Expect(deleted.status(), ErrorKind::kOk, "delete_prefix");
        std::int64_t expected = 0;
        for (auto it = model_.lower_bound(prefix);
             it != model_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
          it = model_.erase(it);
          ++expected;
        }
        FUZZ_CHECK(*deleted == expected, "delete_prefix deleted %lld keys, the model %lld",
                   static_cast<long long>(*deleted), static_cast<long long>(expected));
        break;
      }
    }
  }

  FuzzInput in_;
  std::string prefix_;
  std::shared_ptr<MemoryStore> memory_;
  std::shared_ptr<Store> store_;
  std::map<std::string, std::string> model_;
  std::shared_ptr<AsyncState> async_ = std::make_shared<AsyncState>();
  int timed_waits_ = 0;
};

// The value limit at its edges, on both kinds of store: a value of kMaxValueBytes is accepted,
// one byte more is refused (nothing changes), whatever the call.
void CheckValueLimits() {
  auto memory = std::make_shared<MemoryStore>();
  for (std::shared_ptr<Store> store :
       {std::shared_ptr<Store>(memory),
        std::shared_ptr<Store>(std::make_shared<PrefixStore>("g", memory))}) {
    const std::string at_limit(kMaxValueBytes, 'v'), over(kMaxValueBytes + 1, 'v');
    FUZZ_CHECK(store->Set("big", at_limit).ok(), "a value at the limit refused");
    FUZZ_CHECK(store->Append("big", "x").IsInvalidArgument(), "append past the limit accepted");
    FUZZ_CHECK(store->Get("big", milliseconds(1)).value().size() == kMaxValueBytes,
               "a refused append changed the value");
    FUZZ_CHECK(store->Set("over", over).IsInvalidArgument(), "a value over the limit accepted");
    FUZZ_CHECK(store->CompareSet("over", "", over).status().IsInvalidArgument(),
               "compare_set with a desired value over the limit accepted");
    FUZZ_CHECK(store->MultiSet({"a", "over"}, {"1", over}).IsInvalidArgument(),
               "multi_set with a value over the limit accepted");
    FUZZ_CHECK(!store->Check({"a"}).value() && !store->Check({"over"}).value(),
               "a refused call stored something");
    FUZZ_CHECK(store->DeleteKey("big").value(), "big key missing");
  }
}

}  // namespace
}  // namespace collectived::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool limits_checked = (collectived::fuzz::CheckValueLimits(), true);
  (void)limits_checked;
  collectived::fuzz::Program(data, size).Run();
  return 0;
}
