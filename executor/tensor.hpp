// Tensors as the executors see them: a pointer into memory that a rank's tracking allocator owns,
// with the op table's shape and dtype. bf16 is stored as its 16 raw bits; compute is fp32.
#pragma once
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "executor/bf16.hpp"
#include "planner/graph/ops.hpp"

namespace np::exec {

struct Tensor {
  void* data = nullptr;  // nullptr: absent (not read, not produced)
  TensorType type;
  int64_t numel() const { return type.elements(); }
  int64_t bytes() const { return type.bytes(); }
  explicit operator bool() const { return data != nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// The contiguous part of t from element `first` on, viewed with `shape` (t's dtype).
inline Tensor slice(const Tensor& t, int64_t first, std::vector<int64_t> shape) {
  return {static_cast<char*>(t.data) + first * dtype_bytes(t.type.dtype),
          {std::move(shape), t.type.dtype}};
}

// bf16 <-> fp32, round to nearest even (NaN stays NaN).
inline float bf16_to_f32(uint16_t b) { return bf16_bits_to_f32(b); }
inline uint16_t f32_to_bf16(float f) { return f32_to_bf16_bits(f); }

// Element access for the float dtypes (bf16, fp32); u8 and i64 are read through as<>().
inline float load(const Tensor& t, int64_t i) {
  return t.type.dtype == Dtype::kBf16 ? bf16_to_f32(t.as<uint16_t>()[i]) : t.as<float>()[i];
}
inline void store(const Tensor& t, int64_t i, float v) {
  if (t.type.dtype == Dtype::kBf16)
    t.as<uint16_t>()[i] = f32_to_bf16(v);
  else
    t.as<float>()[i] = v;
}
// t[i] += v, rounding once to t's dtype.
inline void accumulate(const Tensor& t, int64_t i, float v) {
  store(t, i, load(t, i) + v);
}

}  // namespace np::exec
