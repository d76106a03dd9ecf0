// The closest nanotron and Megatron-LM configs of a plan (emit_config.hpp).
#include "planner/report/emit_config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "planner/inputs/configs.hpp"
#include "planner/inputs/units.hpp"
#include "planner/schedule/schedule.hpp"

namespace np {

namespace {

// A TOML basic string: quotes and backslashes escaped, control characters as \uXXXX.
std::string toml_string(const std::string& v) {
  std::string out = "\"";
  for (char ch : v) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// A layer block's policy as the set of ops it re-runs.
std::vector<std::string> recomputed_ops(const StageBlock& b) {
  std::vector<std::string> out;
  for (size_t o = 0; o < b.graph->ops.size(); ++o)
    if (b.policy.recompute[o]) out.push_back(b.graph->ops[o].name);
  return out;
}

bool is_gather(const GraphOp& op) {
  return op.kind == OpKind::kAllGather;
}

// Megatron's --recompute-modules name of an op of a layer, "" for ops no module covers.
std::string module_of(const GraphOp& op) {
  const std::string& n = op.name;
  if (op.kind == OpKind::kFlashAttention || op.kind == OpKind::kFlashAttentionCp ||
      op.kind == OpKind::kSdpa || op.attention_core)
    return "core_attn";
  // Megatron's "layernorm" module is the two layer norms (input_layernorm, pre_mlp_layernorm);
  // no module covers the q/k norms.
  if (is_norm(op.kind))
    return op.kind == OpKind::kQkNorm || op.kind == OpKind::kQkNormHf ||
                   op.kind == OpKind::kHeadRmsNorm
               ? ""
               : "layernorm";
  if (n.rfind("moe.experts.", 0) == 0 &&
      (op.kind == OpKind::kSwiGlu || op.kind == OpKind::kGluAct || op.kind == OpKind::kGluMul))
    return "moe_act";
  if (n.rfind("moe.", 0) == 0) return "moe";
  if (n.rfind("mlp.", 0) == 0 && op.kind != OpKind::kReduceScatter &&
      op.kind != OpKind::kAllReduce && op.kind != OpKind::kDropout && op.kind != OpKind::kAdd)
    return "mlp";
  return "";
}

struct LayerPlans {
  std::vector<const StageBlock*> layers;
  bool any_recompute = false, uniform = true, any_regather = false, any_kept_gather = false;
};

LayerPlans layer_plans(const Schedule& s) {
  LayerPlans p;
  for (const StageProgram& st : s.stages)
    for (const StageBlock& b : st.blocks) {
      if (b.kind != BlockKind::kLayer) continue;
      p.layers.push_back(&b);
      bool gather_only = true;
      for (size_t o = 0; o < b.graph->ops.size(); ++o) {
        const GraphOp& op = b.graph->ops[o];
        if (is_gather(op)) {
          (b.policy.recompute[o] ? p.any_regather : p.any_kept_gather) = true;
        } else if (b.policy.recompute[o]) {
          gather_only = false;
        }
      }
      p.any_recompute |= !gather_only;
      p.uniform &= recomputed_ops(b) == recomputed_ops(*p.layers.front());
    }
  return p;
}

}  // namespace

std::string emit_nanotron(const Schedule& s) {
  const TrainSpec& t = s.setup;
  LayerPlans p = layer_plans(s);
  std::string out = "# nanotron settings closest to nanoplan's plan for " + s.model.name + "\n";
  out += "parallelism:\n";
  out += "  dp: " + std::to_string(t.dp) + "\n  tp: " + std::to_string(t.tp) +
         "\n  pp: " + std::to_string(t.pp) + "\n";
  out += std::string("  pp_engine: ") + (t.pp_schedule == PpSchedule::kAfab ? "afab" : "1f1b") + "\n";
  out += std::string("  tp_mode: ") + (t.sp ? "REDUCE_SCATTER" : "ALL_REDUCE") + "\n";
  out += "  expert_parallel_size: " + std::to_string(t.ep) + "\n";
  out += std::string("  recompute_layer: ") + (p.any_recompute ? "true" : "false") + "\n";
  out += std::string("  tp_recompute_allgather: ") +
         (p.any_regather || !t.sp || p.any_recompute ? "true" : "false") + "\n";
  out += "tokens:\n  micro_batch_size: " + std::to_string(t.micro_batch) +
         "\n  sequence_length: " + std::to_string(t.seq_len) +
         "\n  batch_accumulation_per_replica: " + std::to_string(t.microbatches) + "\n";
  out += "optimizer:\n  zero_stage: " + std::to_string(std::min(t.zero, 1)) +
         std::string("\n  accumulate_grad_in_fp32: ") + (t.grad_dtype == Dtype::kFp32 ? "true" : "false") + "\n";
  if (p.any_recompute && !(p.uniform && t.recompute == Recompute::kFull))
    out += "# not expressible: the plan recomputes parts of some layers; recompute_layer: true "
           "recomputes every layer in full (more time, less memory)\n";
  if (p.any_regather && p.any_kept_gather)
    out += "# not expressible: the plan gathers again in backward for some all-gathers only; "
           "tp_recompute_allgather is all or none\n";
  if (t.pp_schedule == PpSchedule::kInterleaved)
    out += "# not expressible: nanotron has no interleaved schedule (1f1b holds more activations)\n";
  if (t.cp > 1) out += "# not expressible: nanotron has no context parallelism (cp " + std::to_string(t.cp) + ")\n";
  if (t.fp8 != Fp8Recipe::kNone)
    out += std::string("# not expressible: float8 linears (--fp8 ") + name_of(t.fp8) +
           "); nanotron's linears are bf16\n";
  if (mtp_depths(s.model, t) > 0)
    out += "# not expressible: nanotron has no multi-token prediction (" +
           std::to_string(mtp_depths(s.model, t)) + " MTP depths in the plan)\n";
  if (t.zero > 1)
    out += "# not expressible: ZeRO-" + std::to_string(t.zero) +
           "; nanotron's zero_stage shards the optimizer states only (ZeRO-1 for any stage above "
           "0), so each rank keeps the whole gradients" +
           (t.zero > 2 ? std::string(" and weights") : std::string()) + " (more memory)\n";
  if (!t.stage_layers.empty())
    out += "# not expressible: layers per stage " + format_partition(t.stage_layers) +
           "; nanotron balances its stages by compute\n";
  return out;
}

std::string emit_megatron(const Schedule& s) {
  const TrainSpec& t = s.setup;
  LayerPlans p = layer_plans(s);
  std::string flags = "--tensor-model-parallel-size " + std::to_string(t.tp) +
                      " --pipeline-model-parallel-size " + std::to_string(t.pp);
  if (t.sp) flags += " --sequence-parallel";
  if (t.cp > 1) flags += " --context-parallel-size " + std::to_string(t.cp);
  if (t.ep > 1) flags += " --expert-model-parallel-size " + std::to_string(t.ep);
  // Megatron's interleaved chunks hold equal layer counts: --num-layers-per-virtual-pipeline-stage
  // where the layers split so, else the chunk count (--num-virtual-stages-per-pipeline-rank,
  // whose uneven split Megatron takes from the first and last stage's layer flags).
  std::vector<std::string> notes;
  const bool even_chunks = s.model.layers % (t.pp * t.virtual_stages) == 0 && t.stage_layers.empty();
  if (t.pp_schedule == PpSchedule::kInterleaved && even_chunks)
    flags += " --num-layers-per-virtual-pipeline-stage " +
             std::to_string(s.model.layers / (t.pp * t.virtual_stages));
  if (t.pp_schedule == PpSchedule::kInterleaved && !even_chunks)
    notes.push_back("not expressible: the plan's " + std::to_string(s.model.layers) +
                    " layers in pp x " + std::to_string(t.virtual_stages) +
                    " chunks are not all equal; Megatron's interleaved chunks of a stage are, so "
                    "these flags run 1F1B without virtual stages (more activations)");
  flags += " --micro-batch-size " + std::to_string(t.micro_batch) + " --global-batch-size " +
           std::to_string(t.micro_batch * t.microbatches * t.dp) + " --seq-length " +
           std::to_string(t.seq_len);
  if (t.zero >= 1) flags += " --use-distributed-optimizer";
  if (t.attention == AttentionImpl::kEager) flags += " --attention-backend unfused";
  if (t.impl != Impl::kMegatron)
    notes.push_back(std::string("the plan is for the ") + name_of(t.impl) +
                    " profile's kernels; Megatron's keep what --impl megatron keeps (a different "
                    "peak)");
  if (t.zero > 1)
    notes.push_back("not expressible: ZeRO-" + std::to_string(t.zero) +
                    "; Megatron's distributed optimizer shards the optimizer states only "
                    "(ZeRO-1), so each rank keeps the whole gradient buffer" +
                    (t.zero > 2 ? std::string(" and weights") : std::string()) + " (more memory)");
  if (t.grad_dtype == Dtype::kBf16) flags += " --grad-reduce-in-bf16";
  if (t.loss_fusion != LossFusion::kNone)
    flags += std::string(" --cross-entropy-loss-fusion --cross-entropy-fusion-impl ") +
             (t.loss_fusion == LossFusion::kTe ? "te" : "native");
  if (!t.grad_accum_fusion) flags += " --no-gradient-accumulation-fusion";
  if (!t.dataloader_mask) flags += " --no-create-attention-mask-in-dataloader";
  if (t.overlap_grad_reduce) flags += " --overlap-grad-reduce";
  if (t.tp_comm_overlap) flags += " --tp-comm-overlap";
  // Transformer Engine's float8: e4m3 forward, e5m2 gradients (hybrid; e4m3 throughout takes
  // the same bytes).
  if (te_fp8(t)) flags += std::string(" --fp8-format hybrid --fp8-recipe ") + name_of(t.fp8);
  if (t.fp8_param_gather)  // Megatron asserts the distributed optimizer with it
    flags += std::string(t.zero >= 1 ? "" : " --use-distributed-optimizer") + " --fp8-param-gather";
  else if (t.fp8 != Fp8Recipe::kNone)
    notes.push_back(std::string("not expressible: torchao's float8 linears (--fp8 ") +
                    name_of(t.fp8) + "); Megatron's float8 is Transformer Engine's");
  if (t.overlap_param_gather) flags += " --overlap-param-gather";
  if (t.vocab_multiple != 128)
    flags += " --make-vocab-size-divisible-by " + std::to_string(t.vocab_multiple);
  if (const int64_t mtp = mtp_depths(s.model, t); mtp > 0) {
    flags += " --mtp-num-layers " + std::to_string(mtp);
    if (t.mtp_loss_scale != 0.1) {
      char f[32];
      std::snprintf(f, sizeof f, "%g", t.mtp_loss_scale);
      flags += std::string(" --mtp-loss-scaling-factor ") + f;
    }
  }
  if (t.moe_capacity_factor > 0) {
    char f[32];
    std::snprintf(f, sizeof f, "%g", t.moe_capacity_factor);
    flags += std::string(" --moe-expert-capacity-factor ") + f +
             " --moe-pad-expert-input-to-capacity --moe-token-drop-policy position";
  }
  // The plan's layers per stage (a given split, or nanoplan's balanced one): Megatron splits
  // evenly, the first and the last stage's counts given apart.
  std::vector<int64_t> split;
  if (t.pp_schedule != PpSchedule::kInterleaved)
    for (const StageProgram& st : s.stages) split.push_back(st.num_layers());
  bool even = std::adjacent_find(split.begin(), split.end(), std::not_equal_to<>()) == split.end();
  if (split.size() >= 2 && !even)
    flags += " --decoder-first-pipeline-num-layers " + std::to_string(split.front()) +
             " --decoder-last-pipeline-num-layers " + std::to_string(split.back());
  if (split.size() > 2 && !even &&
      std::adjacent_find(split.begin() + 1, split.end() - 1, std::not_equal_to<>()) !=
          split.end() - 1)
    notes.push_back("not expressible: the middle stages hold different layer counts; Megatron "
                    "splits the layers between the first and last stage evenly");
  if (p.any_recompute) {
    // The modules the plan re-runs any op of, over every layer; exact when it re-runs all of
    // each such module's ops in every layer, and nothing outside the modules.
    std::set<std::string> modules;
    bool outside = false, partial = !p.uniform;
    for (const StageBlock* b : p.layers)
      for (size_t o = 0; o < b->graph->ops.size(); ++o) {
        const GraphOp& op = b->graph->ops[o];
        if (!b->policy.recompute[o] || is_gather(op)) continue;
        std::string mod = module_of(op);
        if (mod.empty())
          outside = true;
        else
          modules.insert(mod);
      }
    for (const StageBlock* b : p.layers)
      for (size_t o = 0; o < b->graph->ops.size(); ++o)
        if (modules.count(module_of(b->graph->ops[o])) && !b->policy.recompute[o]) partial = true;
    if (outside || modules.empty()) {
      flags += " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1";
      if (!(p.uniform && t.recompute == Recompute::kFull))
        notes.push_back("not expressible by module: the plan re-runs ops outside Megatron's "
                        "recompute modules; full recompute of every layer is the closest that "
                        "fits (more time)");
    } else {
      flags += " --recompute-granularity selective --recompute-modules";
      for (const std::string& mod : modules) flags += " " + mod;
      if (partial)
        notes.push_back("recomputes more than the plan: whole modules in every layer, where the "
                        "plan re-runs parts of them or only in some layers");
    }
  }
  if (p.any_kept_gather && t.sp)
    notes.push_back("not expressible: the plan keeps some all-gathered tensors; Megatron's "
                    "sequence-parallel layers always gather again in backward (more time, less "
                    "memory)");
  std::string out = flags + "\n";
  for (const std::string& n : notes) out += "# " + n + "\n";
  return out;
}

std::string emit_torchtitan(const Schedule& s) {
  const TrainSpec& t = s.setup;
  const LayerPlans p = layer_plans(s);
  std::vector<std::string> notes;
  std::string out = "# torchtitan settings closest to nanoplan's plan for " + s.model.name + "\n";
  const bool torchao = t.fp8 != Fp8Recipe::kNone && !te_fp8(t);
  if (te_fp8(t))
    notes.push_back(std::string("not expressible: Transformer Engine's float8 linears (--fp8 ") +
                    name_of(t.fp8) + " under --impl megatron); torchtitan's float8 is torchao's");
  if (auto f = torchtitan_flavor(s.model.name))
    out += "[model]\nname = \"" + f->first + "\"\nflavor = \"" + f->second + "\"\n" +
           (torchao ? "converters = [\"quantize.linear.float8\"]\n" : "") + "\n";
  else
    notes.push_back("not expressible: " + s.model.name + " is no torchtitan flavor nanoplan knows");
  // The batch: under PP a step's local batch is its micro-batches; else accumulation steps.
  const int64_t local = t.pp > 1 ? t.micro_batch * t.microbatches : t.micro_batch;
  out += "[training]\nlocal_batch_size = " + std::to_string(local) +
         "\nglobal_batch_size = " + std::to_string(t.micro_batch * t.microbatches * t.dp) +
         "\nseq_len = " + std::to_string(t.seq_len) + "\n\n";
  const int64_t replicate = t.fsdp ? t.dp_replicate : t.dp, shard = t.fsdp ? t.dp / replicate : 1;
  out += "[parallelism]\ndata_parallel_replicate_degree = " + std::to_string(replicate) +
         "\ndata_parallel_shard_degree = " + std::to_string(shard) + "\n";
  if (t.fsdp)
    out += std::string("fsdp_reshard_after_forward = \"") +
           (t.reshard_after_forward == (t.pp == 1) ? "default"
            : t.reshard_after_forward              ? "always"
                                                   : "never") +
           "\"\n";
  out += "tensor_parallel_degree = " + std::to_string(t.tp) +
         "\npipeline_parallel_degree = " + std::to_string(t.pp) + "\n";
  if (t.pp > 1)
    out += std::string("pipeline_parallel_schedule = \"") +
           (t.pp_schedule == PpSchedule::kAfab         ? "GPipe"
            : t.pp_schedule == PpSchedule::kInterleaved ? "Interleaved1F1B"
                                                         : "1F1B") +
           "\"\npipeline_parallel_microbatch_size = " + std::to_string(t.micro_batch) + "\n";
  // The stages' layers: torchtitan's default split, else first and last stage weights that give
  // the plan's, else the modules of each stage.
  if (t.pp > 1 && t.pp_schedule != PpSchedule::kInterleaved) {
    const std::vector<int64_t> plan = partition_layers(s.model, t);
    std::string why;
    auto gives = [&](int64_t in_w, int64_t out_w) {
      return torchtitan_split(t.pp, s.model.layers, in_w, out_w, why) == plan;
    };
    std::optional<std::pair<int64_t, int64_t>> weights;
    if (gives(1, 1)) weights = {{1, 1}};
    for (int64_t sum = 0; sum <= 2 * s.model.layers && !weights; ++sum)
      for (int64_t in_w = std::min<int64_t>(sum, s.model.layers); in_w >= 0 && !weights; --in_w)
        if (sum - in_w <= s.model.layers && gives(in_w, sum - in_w)) weights = {{in_w, sum - in_w}};
    if (weights && *weights != std::pair<int64_t, int64_t>{1, 1}) {
      out += "pipeline_parallel_first_stage_less_layers = " + std::to_string(weights->first) +
             "\npipeline_parallel_last_stage_less_layers = " + std::to_string(weights->second) +
             "\n";
    } else if (!weights) {
      out += "module_fqns_per_model_part = [";
      for (int64_t st = 0, l = 0; st < t.pp; ++st) {
        out += st ? ", [" : "[";
        std::vector<std::string> names;
        if (st == 0) names.push_back("tok_embeddings");
        for (int64_t k = 0; k < plan[static_cast<size_t>(st)]; ++k)
          names.push_back("layers." + std::to_string(l++));
        if (st + 1 == t.pp) names.insert(names.end(), {"norm", "output"});
        for (size_t k = 0; k < names.size(); ++k) out += (k ? ", \"" : "\"") + names[k] + "\"";
        out += "]";
      }
      out += "]\n";
    }
  }
  out += "context_parallel_degree = " + std::to_string(t.cp) +
         "\nexpert_parallel_degree = " + std::to_string(t.ep) + "\n\n";
  if (!t.fsdp && t.dp * t.cp > 1)
    notes.push_back("not expressible: ZeRO-" + std::to_string(t.zero) +
                    " data parallelism; torchtitan without FSDP (shard degree 1) replicates fp32 "
                    "weights under DDP; data_parallel_shard_degree = " +
                    std::to_string(t.dp) + " would be FSDP2 (less memory)");
  if (t.sp != (t.tp > 1))
    notes.push_back("not expressible: sequence parallelism off; torchtitan's TP always shards "
                    "the norms' sequence");
  if (t.pp_schedule == PpSchedule::kInterleaved && t.virtual_stages != 2)
    notes.push_back("torchtitan's Interleaved1F1B takes 2 stages per rank unless "
                    "pipeline_parallel_layers_per_stage says otherwise (the plan has " +
                    std::to_string(t.virtual_stages) + ")");
  // Activation checkpointing: a layer is checkpointed in full when its plan re-runs anything
  // besides all-gathers; torchtitan checkpoints the n-th layer each rank builds (1-based, its
  // chunks in order) when n mod N = 0.
  struct Layer {
    int64_t position;
    bool some, whole;
    bool op_sac;  // the plan re-runs what torchtitan's per-op policy re-runs (gathers aside)
    bool cached;  // ... and holds its cache of kept outputs (the policy is that one)
  };
  std::vector<Layer> layers;
  int64_t most = 1;
  for (const StageProgram& st : s.stages) {
    int64_t n = 0;
    for (const StageBlock& b : st.blocks) {
      if (b.kind != BlockKind::kLayer) continue;
      TrainSpec full = t;
      full.recompute = Recompute::kFull, full.recompute_every = 1;
      const BlockPolicy f = named_policy(*b.graph, full);
      TrainSpec per_op = t;
      per_op.recompute = Recompute::kSelectiveOp;
      const BlockPolicy op = named_policy(*b.graph, per_op);
      bool some = false, all = true, op_sac = true;
      for (size_t o = 0; o < b.graph->ops.size(); ++o) {
        if (is_gather(b.graph->ops[o]) || b.graph->ops[o].kind == OpKind::kCpGatherKv) continue;
        some |= b.policy.recompute[o];
        all &= b.policy.recompute[o] == f.recompute[o];
        op_sac &= b.policy.recompute[o] == op.recompute[o];
      }
      layers.push_back({++n, some, all && some, op_sac && some, caches_outputs(b.policy)});
    }
    most = std::max(most, n);
  }
  int64_t every = 0;  // the largest N whose checkpointed layers cover every layer the plan re-runs
  for (int64_t n = most; n >= 1 && every == 0; --n)
    if (std::all_of(layers.begin(), layers.end(),
                    [&](const Layer& l) { return !l.some || l.position % n == 0; }))
      every = n;
  const bool none = std::none_of(layers.begin(), layers.end(), [](const Layer& l) { return l.some; });
  const bool exact = none || std::all_of(layers.begin(), layers.end(), [&](const Layer& l) {
                       return (l.position % every == 0) == l.whole;
                     });
  const bool op_sac = !layers.empty() && t.impl == Impl::kTorchtitan &&
                      std::all_of(layers.begin(), layers.end(),
                                  [](const Layer& l) { return l.op_sac; });
  if (torchao) {  // torchtitan 238fa99, job_config.py Float8Linear
    out += "[quantize.linear.float8]\n";
    if (t.fp8_all_gather)  // torchtitan refuses recipe_name with it; unset is tensorwise
      out += "enable_fsdp_float8_all_gather = true\n";
    else
      out += std::string("recipe_name = \"") + name_of(t.fp8) + "\"\n";
    if (!t.fp8_filter.empty()) {
      out += "filter_fqns = [";
      for (size_t k = 0; k < t.fp8_filter.size(); ++k)
        out += (k ? ", " : "") + toml_string(t.fp8_filter[k]);
      out += "]\n";
    }
    out += "\n";
  }
  out += "[activation_checkpoint]\n";
  if (op_sac)
    out += "mode = \"selective\"\nselective_ac_option = \"op\"\n";
  else if (none)
    out += "mode = \"none\"\n";
  else if (every == 1)
    out += "mode = \"full\"\n";
  else
    out += "mode = \"selective\"\nselective_ac_option = \"" + std::to_string(every) + "\"\n";
  if (op_sac && !std::all_of(layers.begin(), layers.end(), [](const Layer& l) { return l.cached; }))
    notes.push_back("torchtitan's per-op checkpointing also holds the outputs it keeps until the "
                    "recompute, read or not (under TP each layer's w2 partial output), which the "
                    "plan's layers do not: a higher peak than the plan's");
  if (!op_sac && !none && !exact)
    notes.push_back("not expressible: the plan re-runs parts of layers, or layers other than "
                    "every Nth; the setting above checkpoints whole layers covering every one "
                    "the plan re-runs in (more time, less memory)");
  if (t.impl != Impl::kTorchtitan)
    notes.push_back(std::string("the plan is for the ") + name_of(t.impl) +
                    " profile's kernels; torchtitan's model code keeps what it keeps (a "
                    "different peak; --impl torchtitan is its Llama 3)");
  if (mtp_depths(s.model, t) > 0)
    notes.push_back("not expressible: torchtitan trains no multi-token prediction module (" +
                    std::to_string(mtp_depths(s.model, t)) + " in the plan)");
  for (const std::string& n : notes) out += "# " + n + "\n";
  return out;
}

}  // namespace np
