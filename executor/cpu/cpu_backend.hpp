// The CPU reference backend: plain, unfused fp32 kernels (Eigen for the GEMMs) over bf16/fp32
// storage, bitwise deterministic, every output and workspace allocated through the context.
#pragma once
#include <memory>

#include "executor/backend.hpp"

namespace np::exec {

// The reference backend: activations stored as the op table says (bf16).
std::unique_ptr<Backend> make_cpu_backend();

// Gradient-check variant (tests): every tensor the op table stores in bf16 is allocated in fp32
// instead, everything else (kernels, loop orders, fp32/u8/i64 tensors) is the same code. Feeding it
// the same (bf16-representable) values gives the fp32 result that make_cpu_backend() rounds once.
std::unique_ptr<Backend> make_cpu_backend_fp32_activations();

}  // namespace np::exec
