// Recompute policies on a block graph: which forward ops re-run before the block's backward, and
// the set of tensors that must be kept for backward as a consequence.
#pragma once
#include <cstdint>
#include <vector>

#include "planner/graph/graph.hpp"

namespace np {

struct BlockPolicy {
  std::vector<bool> recompute;  // per op of the block graph: re-run before backward
  std::string name;             // "none", "selective", "full", each "+regather" when it applies
};

// The named policies. sp regather (tp_recompute_allgather under SP) re-runs every all-gather that
// feeds a linear, so the linear's backward finds the sequence shard kept instead of the gathered
// tensor. Embedding and head blocks are never recomputed (nanotron), only regathered.
BlockPolicy named_policy(const BlockGraph& g, const TrainSpec& t);
// Whether the block holds multi-token prediction depths (a head's: build_head).
bool has_mtp(const BlockGraph& g);

// Whether the policy is torchtitan's per-op checkpointing, which stores the outputs of the ops it
// keeps until the layer's recompute reaches them (torch.utils.checkpoint's selective
// checkpointing caches every MUST_SAVE output), read or not: saved_set keeps them, and the
// schedule's recompute reads them where the recompute passes their op (after that instruction's
// own inputs, which the executors take from the front of its reads).
bool caches_outputs(const BlockPolicy& p);

struct SavedSet {
  std::vector<bool> saved;  // per tensor: kept from forward until the block's backward
  int64_t bytes = 0;        // per micro-batch
};

// A tensor is kept when the backward or a recomputed op reads it and its producer is not re-run.
SavedSet saved_set(const BlockGraph& g, const BlockPolicy& p);

}  // namespace np
