// Deterministic, sharding-invariant initial values: every weight element and every token is drawn
// from a counter-based generator keyed by its GLOBAL position, so a tp = 4 run starts from exactly
// the same model and batch as a tp = 1 run.
#pragma once
#include <cstdint>
#include <string>

#include "executor/tensor.hpp"
#include "planner/graph/graph.hpp"
#include "planner/schedule/schedule.hpp"

namespace np::exec {

// The global name of weight w of an op in a block: "L3/attn.qkv.weight", or "embedding.weight"
// for the (possibly tied) token embedding table.
std::string weight_key(const StageBlock& block, const GraphOp& op, size_t w);

// Where a rank's weights sit in the global ones: its TP rank of tp (sharded weights), and its EP
// rank (experts: local expert e is global expert ep_rank x local experts + e).
struct RankShards {
  int64_t tp = 1, tp_rank = 0, ep_rank = 0;
};

// Global flat index of local element i of weight w of op on the rank.
int64_t global_weight_index(const GraphOp& op, size_t w, int64_t i, const RankShards& at);

// Fills a bf16 weight: norms' weights 1 and biases 0, everything else N(0, 0.02^2).
void init_weight(const Tensor& t, const StageBlock& block, const GraphOp& op, size_t w,
                 const RankShards& at, uint64_t seed);

// Token ids or targets of micro-batch mb: uniform over the vocabulary, the same every step.
void fill_tokens(const Tensor& t, const std::string& which, int mb, int64_t vocab, uint64_t seed);

}  // namespace np::exec
