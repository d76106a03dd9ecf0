// The counter-based random numbers behind dropout (rng.cpp): the same on every run, rank,
// recompute and backend.
#pragma once
#include <cstdint>

namespace np::exec {

struct OpContext;

// Counter-based uniform random number in [0, 1) for (seed, stream, index): the same triple gives
// the same number on every run, rank, recompute and backend (GPU kernels implement the same hash).
float counter_uniform(uint64_t seed, uint64_t stream, uint64_t index);
// The dropout stream of an op: from the op's name and the global layer index (not the rank, not
// the micro-batch position in the schedule; the micro-batch index is mixed in by the caller).
uint64_t dropout_stream(const OpContext& ctx);

}  // namespace np::exec
