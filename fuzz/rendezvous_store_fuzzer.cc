// Fuzz target: GlooRendezvousStore, the adapter through which Gloo's rendezvous (run with
// addresses and keys that peers wrote) reads our store. The input is a program of set, get and
// wait calls (both wait overloads) with fuzzed keys, values and timeouts on a MemoryStore.
// Failures must arrive as Gloo exceptions (InvalidOperationException for bad input, IoException
// for timeouts), values must come back byte for byte, and nothing may block: the adapter's own
// timeout is 1 ms and waits on missing keys get 1 ms or an invalid timeout.
#include <gloo/common/error.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/group/gloo/gloo_rendezvous_store.h"
#include "engine/store/memory_store.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"

namespace collectived::fuzz {
namespace {

using std::chrono::milliseconds;

constexpr int kMaxTimedWaits = 1;

enum class Outcome { kOk, kInvalid, kIo };

class Program {
 public:
  Program(const uint8_t* data, size_t size)
      : in_(data, size),
        memory_(std::make_shared<MemoryStore>()),
        adapter_(memory_, milliseconds(1)) {}

  void Run() {
    while (!in_.empty()) Step();
  }

 private:
  std::string Key() {
    const uint8_t choice = in_.U8();
    if (choice < 170) return "rank_" + std::to_string(choice % 4);
    if (choice < 240) return in_.String(48);
    if (choice < 248) return "";
    return std::string(kMaxKeyBytes - 1 + in_.U8() % 3, 'k');
  }
  std::vector<std::string> Keys() {
    std::vector<std::string> keys(in_.U8() % 4);
    for (auto& key : keys) key = Key();
    return keys;
  }
  static bool Valid(const std::string& key) { return !key.empty() && key.size() <= kMaxKeyBytes; }
  bool Present(const std::string& key) const { return model_.count(key) > 0; }

  // Whether a wait on `keys` could block: some valid key missing.
  bool CouldBlock(const std::vector<std::string>& keys) const {
    bool valid = true, present = true;
    for (const auto& key : keys) {
      valid &= Valid(key);
      present &= Present(key);
    }
    return valid && !present;
  }
  Outcome Expected(const std::vector<std::string>& keys, bool timeout_valid) const {
    for (const auto& key : keys) {
      if (!Valid(key)) return Outcome::kInvalid;
    }
    if (!timeout_valid) return Outcome::kInvalid;
    return CouldBlock(keys) ? Outcome::kIo : Outcome::kOk;
  }

  template <typename Call>
  void Expect(Outcome expected, const char* op, Call call) {
    Outcome got = Outcome::kOk;
    std::string what;
    try {
      call();
    } catch (const gloo::InvalidOperationException& e) {
      got = Outcome::kInvalid;
      what = e.what();
    } catch (const gloo::IoException& e) {
      got = Outcome::kIo;
      what = e.what();
    }
    FUZZ_CHECK(got == expected, "%s: outcome %d, expected %d (%s)", op, static_cast<int>(got),
               static_cast<int>(expected), what.c_str());
    FUZZ_CHECK(got == Outcome::kOk || what.find("collectived store") != std::string::npos,
               "%s: exception without our message: %s", op, what.c_str());
  }

  void Step() {
    switch (in_.U8() % 4) {
      case 0: {
        std::string key = Key();
        std::string value = in_.String(64);
        const bool valid = Valid(key) && value.size() <= kMaxValueBytes;
        Expect(valid ? Outcome::kOk : Outcome::kInvalid, "set",
               [&] { adapter_.set(key, std::vector<char>(value.begin(), value.end())); });
        if (valid) model_[key] = value;
        break;
      }
      case 1: {
        std::string key = Key();
        if (CouldBlock({key}) && ++timed_waits_ > kMaxTimedWaits) break;
        std::vector<char> value;
        Expect(Expected({key}, true), "get", [&] { value = adapter_.get(key); });
        if (Valid(key) && Present(key)) {
          FUZZ_CHECK(std::string(value.begin(), value.end()) == model_[key],
                     "get returned other bytes");
        }
        break;
      }
      case 2: {
        std::vector<std::string> keys = Keys();
        if (CouldBlock(keys) && ++timed_waits_ > kMaxTimedWaits) break;
        Expect(Expected(keys, true), "wait", [&] { adapter_.wait(keys); });
        break;
      }
      case 3: {
        // Any timeout when nothing can block (0 = no deadline, huge ones are clamped);
        // otherwise 1 ms or a negative one.
        std::vector<std::string> keys = Keys();
        milliseconds timeout(in_.I64());
        if (CouldBlock(keys)) {
          if (timeout.count() >= 0) {
            if (++timed_waits_ > kMaxTimedWaits) break;
            timeout = milliseconds(1);
          }
        }
        Expect(Expected(keys, timeout.count() >= 0), "wait(timeout)",
               [&] { adapter_.wait(keys, timeout); });
        break;
      }
    }
  }

  FuzzInput in_;
  std::shared_ptr<MemoryStore> memory_;
  GlooRendezvousStore adapter_;
  std::map<std::string, std::string> model_;
  int timed_waits_ = 0;
};

// A value over the store's limit, once per process (a 16 MiB value in every input would make
// the fuzzer slow): refused with InvalidOperationException.
void CheckValueLimit() {
  GlooRendezvousStore adapter(std::make_shared<MemoryStore>(), milliseconds(1));
  try {
    adapter.set("big", std::vector<char>(kMaxValueBytes + 1, 'v'));
    FUZZ_CHECK(false, "a value over the limit accepted");
  } catch (const gloo::InvalidOperationException&) {
  }
  adapter.set("big", std::vector<char>(kMaxValueBytes, 'v'));
  FUZZ_CHECK(adapter.get("big").size() == kMaxValueBytes, "a value at the limit changed");
}

}  // namespace
}  // namespace collectived::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool limit_checked = (collectived::fuzz::CheckValueLimit(), true);
  (void)limit_checked;
  collectived::fuzz::Program(data, size).Run();
  return 0;
}
