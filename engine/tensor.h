// TensorView: a dtype, an element count and the memory the engine reads and writes in place
// (a range of a registered shared-memory segment, or a heap buffer holding inline bytes).
#pragma once

#include <cstddef>
#include <memory>

#include "engine/dtype.h"

namespace collectived {

struct TensorView {
  DType dtype = DType::kUnspecified;
  size_t count = 0;
  std::byte* data = nullptr;
  // Keeps the memory alive while an op uses it (the mapping of a segment, an inline buffer).
  std::shared_ptr<void> owner;

  size_t bytes() const { return count * DTypeSize(dtype); }
  // A view of `n` elements starting at element `first`, sharing the owner.
  TensorView Slice(size_t first, size_t n) const {
    return TensorView{dtype, n, data + first * DTypeSize(dtype), owner};
  }
};

}  // namespace collectived
