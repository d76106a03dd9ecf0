// Named recompute policies and the saved set they imply.
#include "planner/graph/policy.hpp"

#include <algorithm>

namespace np {

bool has_mtp(const BlockGraph& g) {
  return std::any_of(g.ops.begin(), g.ops.end(),
                     [](const GraphOp& op) { return op.mtp_depth > 0; });
}

BlockPolicy named_policy(const BlockGraph& g, const TrainSpec& t) {
  BlockPolicy p{std::vector<bool>(g.ops.size(), false), name_of(t.recompute)};
  bool layer = g.kind == BlockKind::kLayer;
  bool regather = t.sp && t.tp_recompute_allgather;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const GraphOp& op = g.ops[i];
    // A multi-token prediction depth's decoder layer is recomputed as the layers are (Megatron-LM
    // d98e8a6, multi_token_prediction.py: _checkpointed_forward under full recompute, from the
    // norms to its final norm; its TransformerLayer's own selective recompute).
    if ((layer || op.mtp_checkpointed) && t.recompute == Recompute::kFull) p.recompute[i] = true;
    if ((layer || op.mtp_depth > 0) && t.recompute == Recompute::kSelective && op.attention_core)
      p.recompute[i] = true;
    if (regather && op.kind == OpKind::kAllGather) p.recompute[i] = true;
    // Context parallelism keeps only this rank's K/V and exchanges them again in backward (as
    // Megatron's ring and all-gather forms do); the auto planner may keep the gathered K/V.
    if (op.kind == OpKind::kCpGatherKv) p.recompute[i] = true;
  }
  if (!layer) p.name = "none";
  if (has_mtp(g) && (t.recompute == Recompute::kFull || t.recompute == Recompute::kSelective))
    p.name = std::string("mtp:") + name_of(t.recompute);
  if (regather && !(layer && t.recompute == Recompute::kFull)) p.name += "+regather";
  return p;
}

SavedSet saved_set(const BlockGraph& g, const BlockPolicy& p) {
  std::vector<bool> needed = backward_reads(g);
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (p.recompute[i])
      for (int t : g.ops[i].inputs) needed[t] = true;  // a re-run op reads its inputs
  SavedSet s{std::vector<bool>(g.tensors.size(), false), 0};
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    int producer = g.tensors[t].producer;
    if (needed[t] && (producer < 0 || !p.recompute[producer])) {
      s.saved[t] = true;
      s.bytes += g.tensors[t].type.bytes();
    }
  }
  return s;
}

}  // namespace np
