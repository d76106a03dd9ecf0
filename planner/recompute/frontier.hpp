// Per-layer recompute options: every non-wasteful choice of forward ops to re-run before a block's
// backward, measured by (bytes kept per micro-batch, working bytes of the block's forward and
// backward, recompute cost), and the Pareto frontier of those three. A choice is wasteful when it
// re-runs an op none of whose outputs the backward or another re-run op reads: dropping that op
// is never worse, so the frontier over non-wasteful choices is the frontier over all choices
// (tests check it against brute force over every subset on small graphs).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "planner/graph/graph.hpp"
#include "planner/graph/policy.hpp"

namespace np {

struct LayerOption {
  std::vector<bool> recompute;  // per op of the block graph
  int64_t kept_bytes = 0;       // saved for backward, per micro-batch (the block input included)
  int64_t working_bytes = 0;    // peak of this block's own tensors during its forward or backward
  double cost = 0;              // seconds of re-running the recomputed ops (one micro-batch)
  int64_t extra_bytes() const {
    return working_bytes - kept_bytes;
  }  // transient above the kept set
};

// Bytes kept and working bytes of a block under a recompute mask (one micro-batch; during the
// backward the incoming gradient of the block output is live, as in the schedule).
LayerOption evaluate_option(const BlockGraph& g, const std::vector<bool>& recompute,
                            const std::vector<double>& op_cost);

// A lower bound of the working bytes of every mask: the peak of the block's forward with each
// value freed after its last use there (the forward is the same under every mask).
int64_t least_working_bytes(const BlockGraph& g);

// Every non-wasteful recompute mask, evaluated.
std::vector<LayerOption> enumerate_options(const BlockGraph& g, const std::vector<double>& op_cost);
// Every subset of ops (2^ops; the test oracle for small graphs).
std::vector<LayerOption> enumerate_all_subsets(const BlockGraph& g,
                                               const std::vector<double>& op_cost);

// Options no other option beats on all three of kept bytes, working bytes and cost (ties: one of
// the equal triples kept). Sorted by kept bytes, largest first (none first, full last).
std::vector<LayerOption> pareto_frontier(std::vector<LayerOption> options);

struct NamedPoint {
  std::string name;  // "none", "none+regather", "selective+regather", "full"
  LayerOption option;
  int on_frontier = -1;   // index of the equal frontier point, or -1
  int dominated_by = -1;  // index of a frontier point at least as good everywhere, when not on it
};

struct LayerFrontier {
  std::vector<LayerOption> options;  // the Pareto frontier
  std::vector<bool>
      on_hull;  // per option: a vertex of the (kept, cost) convex hull, found by min cut
  std::vector<NamedPoint> named;  // where the named policies land
  // The layer's non-wasteful masks (within --tp-recompute-allgather), all of them accounted for:
  // a decoder layer's by its halves (attention, MLP; MoE layers with MLA and shared experts have
  // hundreds of millions), any other block's one by one; and the masks (or halves' masks)
  // evaluated to find the frontier.
  size_t choices = 0, evaluated = 0;
};
// The decoder layer's MLP half: the index of the op after the attention's residual add; -1 for a
// block without one.
int mlp_half(const BlockGraph& g);

// The exact frontier. A decoder layer's is found by its halves: for each configuration of the
// ops that make or read the tensors both halves touch, each half's masks are evaluated once,
// per phase of the layer's forward, re-run and backward, the pairs no others beat are summed,
// and the frontier's masks are evaluated whole again (frontier.cpp).
LayerFrontier layer_frontier(const BlockGraph& g, const TrainSpec& t,
                             const std::vector<double>& op_cost);
// The working bytes of `mask` from its halves' figures, as layer_frontier adds them (the test of
// that decomposition against evaluate_option); nullopt for a block without halves.
std::optional<int64_t> working_by_halves(const BlockGraph& g, const std::vector<bool>& mask);

// Megatron's --recompute-modules mla_up_proj on an MLA layer (empty for other blocks): its
// CheckpointWithoutOutput around qkv_up_proj_and_rope_apply (multi_latent_attention.py,
// Megatron-LM d98e8a6) drops query, key and value after the attention core and re-runs the
// up-projections (with the latents' norms and SP all-gathers fused into them: TE's
// LayerNormColumnParallelLinear; or the direct q projection) and the RoPE before backward.
std::vector<bool> mla_up_proj_mask(const BlockGraph& g);
// The mask of a named policy on this block (none, selective, full; regather on or off).
std::vector<bool> named_mask(const BlockGraph& g, Recompute r, bool regather);

}  // namespace np
