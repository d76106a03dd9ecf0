// Counter-based random numbers for dropout: a stateless hash of (seed, stream, index), so that a
// recompute, another rank or another backend regenerates bit for bit the same mask. GPU kernels
// implement exactly the formulas written out below.
#include "executor/rng.hpp"

#include <cstdint>
#include <stdexcept>

#include "executor/backend.hpp"

namespace np::exec {

namespace {

// splitmix64's finaliser: a bijection of 64-bit words with full avalanche.
constexpr uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

}  // namespace

// h = mix64(mix64(mix64(seed ^ kGolden) ^ stream) ^ index); u = (h >> 40) / 2^24.
// For a fixed (seed, stream) distinct indices give distinct h (mix64 is a bijection).
float counter_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t h = mix64(mix64(mix64(seed ^ kGolden) ^ stream) ^ index);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

// FNV-1a (64-bit) over the bytes of the op's name, then h = mix64(h ^ mix64(layer + kGolden)) with
// the layer as a two's-complement 64-bit word (-1 for the embedding and head blocks).
uint64_t dropout_stream(const OpContext& ctx) {
  if (!ctx.op) throw std::invalid_argument("dropout_stream: the context names no op");
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : ctx.op->name) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return mix64(h ^ mix64(static_cast<uint64_t>(static_cast<int64_t>(ctx.layer)) + kGolden));
}

}  // namespace np::exec
