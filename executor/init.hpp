// Deterministic, sharding-invariant initial values: every weight element and every token is drawn
// from a counter-based generator keyed by its GLOBAL position, so a tp = 4 run starts from exactly
// the same model and batch as a tp = 1 run.
#pragma once
#include <cstdint>
#include <string>

#include "executor/tensor.hpp"
#include "planner/graph.hpp"
#include "planner/schedule.hpp"

namespace np::exec {

// The global name of weight w of an op in a block: "L3/attn.qkv.weight", or "embedding.weight"
// for the (possibly tied) token embedding table.
std::string weight_key(const StageBlock& block, const GraphOp& op, size_t w);

// Global flat index of local element i of weight w of op on TP rank tp_rank.
int64_t global_weight_index(const GraphOp& op, size_t w, int64_t i, int64_t tp, int64_t tp_rank);

// Fills a bf16 weight: norms' weights 1 and biases 0, everything else N(0, 0.02^2).
void init_weight(const Tensor& t, const StageBlock& block, const GraphOp& op, size_t w, int64_t tp,
                 int64_t tp_rank, uint64_t seed);

// Token ids or targets of micro-batch mb: uniform over the vocabulary, the same every step.
void fill_tokens(const Tensor& t, const std::string& which, int mb, int64_t vocab, uint64_t seed);

}  // namespace np::exec
