// Named recompute policies and the saved set they imply.
#include "planner/graph/policy.hpp"

#include <algorithm>

namespace np {

bool has_mtp(const BlockGraph& g) {
  return std::any_of(g.ops.begin(), g.ops.end(),
                     [](const GraphOp& op) { return op.mtp_depth > 0; });
}

namespace {

// torchtitan's per-op checkpointing of a decoder layer (torchtitan 238fa99,
// torchtitan/distributed/activation_checkpoint.py, _apply_op_sac; the save list
// _op_sac_save_list in torchtitan/models/llama3/infra/parallelize.py): the outputs of the listed
// ops are kept (MUST_SAVE) and every other op is re-run (PREFER_RECOMPUTE). Listed: aten.mm, the
// SDPA kernels and _c10d_functional.reduce_scatter_tensor (the sequence-parallel reduce-scatter);
// of the mm, "every second mm" is re-run: a per-layer count saves the 1st, 3rd, 5th ... (wq, wv,
// w1, w2 of a Llama block) and re-runs the rest (wk, wo, w3). An mm whose weight shape is listed
// in per_op_sac_force_recompute_mm_shapes_by_fqns (default "moe.router.gate") is re-run and not
// counted; grouped GEMMs (aten._grouped_mm), bmm, the all-gathers and the elementwise ops are not
// listed. With early_stop False (torchtitan's default) the recompute runs the whole layer, so the
// last residual add re-runs and reads the kept w2 output (saved_set keeps it for that reason).
// torchao's float8 linears (OpAttrs::fp8) count and are kept as bf16 ones: the policy's dispatch
// mode sees their torch.mm before torchao's tensor subclass turns it into _scaled_mm. Inside
// them the casts' ops (abs, max, mul, clamp, to) are seen too: a kept float8 linear's casts run
// again in the recompute, its mm taking the cached output (float8_cast_only_recompute), and each
// tensorwise cast's aten.max output, on the list, is kept for the recompute (OpStep::sac_kept;
// rowwise takes aten.amax, not listed).
bool op_sac_keeps(const GraphOp& op, int& mm_count) {
  switch (op.kind) {
    case OpKind::kColumnLinear:
    case OpKind::kRowLinear:
    case OpKind::kLinear:
      return ++mm_count % 2 == 1;
    case OpKind::kSdpa:
    case OpKind::kFlashAttention:
    case OpKind::kFlashAttentionCp:
    case OpKind::kReduceScatter:
      return true;
    default:  // kRouter: moe.router.gate, re-run uncounted
      return false;
  }
}

}  // namespace

BlockPolicy named_policy(const BlockGraph& g, const TrainSpec& t) {
  BlockPolicy p{std::vector<bool>(g.ops.size(), false), name_of(t.recompute)};
  bool layer = g.kind == BlockKind::kLayer;
  // torchtitan keeps the gathered input: PrepareModuleInput's redistribute to Replicate is an
  // autograd op whose output the column linears save (torchtitan 238fa99,
  // models/llama3/infra/parallelize.py; PyTorch's torch/distributed/tensor/parallel/style.py,
  // PrepareModuleInput). Keeping the shard and gathering again is nanotron's option
  // (tp_recompute_allgather) and Megatron's way.
  bool regather = t.sp && t.tp_recompute_allgather && t.impl != Impl::kTorchtitan;
  int mm_count = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const GraphOp& op = g.ops[i];
    if (layer && t.recompute == Recompute::kSelectiveOp && !op_sac_keeps(op, mm_count))
      p.recompute[i] = true;
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

bool caches_outputs(const BlockPolicy& p) {
  return p.name.rfind(name_of(Recompute::kSelectiveOp), 0) == 0;
}

SavedSet saved_set(const BlockGraph& g, const BlockPolicy& p) {
  std::vector<bool> needed = backward_reads(g);
  const bool cache = caches_outputs(p);
  int mm_count = 0;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const bool stored = cache && op_sac_keeps(g.ops[i], mm_count);  // counts every mm in order
    if (p.recompute[i])
      for (int t : g.ops[i].inputs) needed[t] = true;  // a re-run op reads its inputs
    else if (stored)
      for (int t : g.ops[i].outputs) needed[t] = true;  // kept until the recompute passes it
  }
  SavedSet s{std::vector<bool>(g.tensors.size(), false), 0};
  for (size_t t = 0; t < g.tensors.size(); ++t) {
    int producer = g.tensors[t].producer;
    if (needed[t] && (producer < 0 || !p.recompute[producer])) {
      s.saved[t] = true;
      s.bytes += g.tensors[t].type.bytes();
    }
  }
  // A stepped op's temporaries the cache keeps to its recompute (OpStep::sac_kept: a tensorwise
  // float8 cast's aten.max), whether the op re-runs or only its casts do.
  for (size_t i = 0; cache && i < g.ops.size(); ++i) {
    std::vector<TensorType> in;
    for (int t : g.ops[i].inputs) in.push_back(g.tensors[t].type);
    std::vector<OpStep> steps = op_steps(op_info(g.ops[i].kind), g.ops[i].attrs, in, true);
    std::vector<int64_t> bytes;
    for (const OpStep& st : steps)
      for (const TensorType& x : st.temps) bytes.push_back(x.bytes());
    for (const OpStep& st : steps)
      for (int k : st.sac_kept) s.bytes += bytes.at(static_cast<size_t>(k));
  }
  return s;
}

}  // namespace np
