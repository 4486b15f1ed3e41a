// FuzzInput: reads typed values off the front of a fuzzer's byte string, so one input drives a
// whole sequence of calls. Every read succeeds: past the end it yields zeros and empty strings,
// so a target never has to check lengths. Shared by the targets in this directory, which build
// with gcc (replay) as well as clang (libFuzzer), so it does not use clang's FuzzedDataProvider.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace collectived::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return at_ >= size_; }
  size_t remaining() const { return size_ - at_; }

  uint8_t U8() { return empty() ? 0 : data_[at_++]; }
  bool Bool() { return (U8() & 1) != 0; }

  // Little-endian, from as many bytes as are left (missing bytes are zero).
  template <typename T>
  T Integer() {
    uint64_t value = 0;
    for (size_t i = 0; i < sizeof(T); ++i) value |= uint64_t{U8()} << (8 * i);
    T out;
    std::memcpy(&out, &value, sizeof(T));
    return out;
  }
  uint16_t U16() { return Integer<uint16_t>(); }
  uint32_t U32() { return Integer<uint32_t>(); }
  uint64_t U64() { return Integer<uint64_t>(); }
  int64_t I64() { return Integer<int64_t>(); }

  // A string of at most `max_bytes` bytes; its length is one byte (or two when max_bytes > 255)
  // read first, so short strings cost one byte and long ones stay reachable.
  std::string String(size_t max_bytes = 64) {
    size_t length = max_bytes > 255 ? U16() : U8();
    length = std::min({length, max_bytes, remaining()});
    std::string out(reinterpret_cast<const char*>(data_ + at_), length);
    at_ += length;
    return out;
  }

  // Everything not read yet.
  std::string Rest() {
    std::string out(reinterpret_cast<const char*>(data_ + at_), remaining());
    at_ = size_;
    return out;
  }

 private:
  const uint8_t* const data_;
  const size_t size_;
  size_t at_ = 0;
};

}  // namespace collectived::fuzz
