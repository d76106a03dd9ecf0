// The setup flags' table and what reads it (setup_flags.hpp).
#include "planner/inputs/setup_flags.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "planner/inputs/catalog.hpp"
#include "planner/inputs/configs.hpp"
#include "planner/inputs/read_file.hpp"
#include "planner/inputs/units.hpp"

namespace np {
namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

std::string number(int64_t v) { return std::to_string(v); }

Result<bool> parse_switch(std::string_view flag, const std::string& v, const char* yes,
                          const char* no) {
  if (v == yes) return true;
  if (v == no) return false;
  return make_error("invalid " + std::string(flag) + " " + quote_input(v) + " (valid: " + yes +
                    ", " + no + ")");
}

Result<bool> parse_bool(std::string_view flag, const std::string& v) {
  if (v == "true" || v == "on" || v == "1") return true;
  if (v == "false" || v == "off" || v == "0") return false;
  return make_error("invalid " + std::string(flag) + " " + quote_input(v) +
                    " (valid: true, false)");
}

std::string capacity_text(double f) {
  char cf[32];
  std::snprintf(cf, sizeof cf, "%g", f);
  return cf;
}

std::vector<SetupFlag> make_table() {
  using T = TrainSpec;
  auto never = [](const T&) -> std::string { return std::string(); };
  return {
      {"--tp", "tensor-parallel degree", "1", true, kMin, kMax,
       [](T& to, const T& f) { to.tp = f.tp; }, [](const T& t) -> std::string { return number(t.tp); }},
      {"--cp", "context-parallel degree: each sequence split over cp ranks (Megatron's "
               "--context-parallel-size; flash attention)",
       "1", true, kMin, kMax, [](T& to, const T& f) { to.cp = f.cp; },
       [](const T& t) -> std::string { return t.cp > 1 ? number(t.cp) : ""; }},
      {"--pp", "pipeline-parallel degree", "1", true, kMin, kMax,
       [](T& to, const T& f) { to.pp = f.pp; }, [](const T& t) -> std::string { return number(t.pp); }},
      {"--dp", "data-parallel degree", "1", true, kMin, kMax,
       [](T& to, const T& f) { to.dp = f.dp; }, [](const T& t) -> std::string { return number(t.dp); }},
      {"--ep", "expert-parallel degree (MoE; carved out of dp)", "1", true, kMin, kMax,
       [](T& to, const T& f) { to.ep = f.ep; },
       [](const T& t) -> std::string { return t.ep > 1 ? number(t.ep) : ""; }},
      {"--moe-capacity-factor",
       "MoE expert capacity factor (Megatron's --moe-expert-capacity-factor, padded to capacity, "
       "overflow dropped in token order); 0 or unset: dropless",
       "", false, kMin, kMax,
       [](T& to, const T& f) { to.moe_capacity_factor = f.moe_capacity_factor; },
       [](const T& t) -> std::string {
         return t.moe_capacity_factor > 0 ? capacity_text(t.moe_capacity_factor) : "";
       }},
      {"--mtp-layers",
       "multi-token prediction depths on the last stage (Megatron's --mtp-num-layers); unset: "
       "the model's (DeepSeek-V3: 1)",
       "", true, 0, 16, [](T& to, const T& f) { to.mtp_layers = f.mtp_layers; },
       [](const T& t) -> std::string { return t.mtp_layers > 0 ? number(t.mtp_layers) : ""; }},
      {"--sp", "sequence parallelism: on, off, auto (on when tp > 1, nanotron's REDUCE_SCATTER)",
       "auto", false, kMin, kMax, [](T& to, const T& f) { to.sp = f.sp; },
       [](const T& t) -> std::string { return t.sp == (t.tp > 1) ? "" : t.sp ? "on" : "off"; }},
      {"--zero", "ZeRO stage over dp: 0, 1, 2, 3", "0", true, 0, 3,
       [](T& to, const T& f) { to.zero = f.zero; },
       [](const T& t) -> std::string { return t.zero > 0 ? number(t.zero) : ""; }},
      {"--fsdp",
       "FSDP2 in place of ZeRO (PyTorch's fully_shard as torchtitan applies it): on (given "
       "alone: on; fp32 parameters, gradients and AdamW states sharded over dp / --dp-replicate "
       "x cp, each block's bf16 weights all-gathered for its forward and backward, its gradients "
       "reduce-scattered in fp32), off",
       "off", false, kMin, kMax, [](T& to, const T& f) { to.fsdp = f.fsdp; },
       [](const T& t) -> std::string { return t.fsdp ? "on" : ""; }, "on"},
      {"--dp-replicate",
       "HSDP under --fsdp: data-parallel replicas, each sharding over dp / dp-replicate "
       "(torchtitan's data_parallel_replicate_degree)",
       "1", true, 1, kMax, [](T& to, const T& f) { to.dp_replicate = f.dp_replicate; },
       [](const T& t) -> std::string { return t.dp_replicate > 1 ? number(t.dp_replicate) : ""; }},
      {"--reshard-after-forward",
       "under --fsdp: on (each block's gathered weights freed after its forward and gathered "
       "again for its backward: torchtitan's fsdp_reshard_after_forward default without PP), off "
       "(kept to its backward: \"never\")",
       "on", false, kMin, kMax,
       [](T& to, const T& f) { to.reshard_after_forward = f.reshard_after_forward; },
       [](const T& t) -> std::string { return t.reshard_after_forward ? "" : "off"; }},
      {"--micro-batch", "sequences per micro-batch", "1", true, kMin, kMax,
       [](T& to, const T& f) { to.micro_batch = f.micro_batch; },
       [](const T& t) -> std::string { return number(t.micro_batch); }},
      {"--microbatches", "gradient-accumulation steps per optimizer step (default: pp)", "", true,
       kMin, kMax, [](T& to, const T& f) { to.microbatches = f.microbatches; },
       [](const T& t) -> std::string { return number(t.microbatches); }},
      {"--seq-len", "sequence length in tokens", "4096", true, kMin, kMax,
       [](T& to, const T& f) { to.seq_len = f.seq_len; },
       [](const T& t) -> std::string { return number(t.seq_len); }},
      {"--pp-schedule",
       "pipeline schedule: 1f1b, afab (nanotron's default), interleaved (Megatron's 1F1B over "
       "virtual stages)",
       "afab", false, kMin, kMax,
       [](T& to, const T& f) { to.pp_schedule = f.pp_schedule, to.virtual_stages = f.virtual_stages; },
       [](const T& t) -> std::string { return t.pp > 1 ? std::string(name_of(t.pp_schedule)) : ""; }},
      {"--virtual-stages",
       "model chunks per pipeline stage under --pp-schedule interleaved (Megatron's "
       "--num-layers-per-virtual-pipeline-stage as a count; default 2 there, else 1)",
       "", true, kMin, kMax,
       [](T& to, const T& f) { to.pp_schedule = f.pp_schedule, to.virtual_stages = f.virtual_stages; },
       [](const T& t) -> std::string {
         return t.pp_schedule == PpSchedule::kInterleaved ? number(t.virtual_stages) : "";
       }},
      {"--partition",
       "decoder layers per pipeline stage: balanced (by FLOPs), auto (searched with --recompute "
       "auto: the split whose slowest stage is fastest), or counts such as 21,20,20,19",
       "balanced", false, kMin, kMax,
       [](T& to, const T& f) { to.stage_layers = f.stage_layers; },
       [](const T& t) -> std::string { return t.stage_layers.empty() ? "" : format_partition(t.stage_layers); }},
      {"--attention", "attention implementation: flash, eager", "flash", false, kMin, kMax,
       [](T& to, const T& f) { to.attention = f.attention; },
       [](const T& t) -> std::string {
         return t.attention != AttentionImpl::kFlash ? std::string(name_of(t.attention)) : "";
       }},
      {"--impl",
       "whose kernels: nanotron (norm statistics kept, unfused GLU, fp32 logits copy), megatron "
       "(statistics kept, fused SwiGLU, in-place loss), fused (the least kept), hf (Hugging Face "
       "transformers' Llama in PyTorch ops: fp32 norm copies, repeated K/V, fp32 softmax and "
       "log-softmax), torchtitan (torchtitan's Llama 3 in eager PyTorch: separate q/k/v and "
       "w1/w3 linears, complex fp32 RoPE, SDPA flash, fp32 log-softmax)",
       "nanotron", false, kMin, kMax, [](T& to, const T& f) { to.impl = f.impl; },
       [](const T& t) -> std::string { return t.impl != Impl::kNanotron ? std::string(name_of(t.impl)) : ""; }},
      {"--fp8",
       "none, tensorwise, rowwise, rowwise_with_gw_hp, delayed: float8 linears. Under --impl "
       "torchtitan (with --fsdp) torchao's Float8Linear: dynamic scaling per tensor (e4m3, e5m2 "
       "output gradients; also at tp > 1, torchao's float8 TP) or per row (e4m3, power-of-2 "
       "scales; with_gw_hp: the weight gradient in bf16; at tp > 1 on plain TP, maxima over "
       "split dimensions all-reduced); linears with a dimension not a "
       "multiple of 16 stay bf16. Under --impl megatron Transformer Engine's, as Megatron's "
       "--fp8-recipe: delayed (amax history) or tensorwise (current scaling), the decoder "
       "layers' linears with their norms writing float8 and cached float8 weight copies",
       "none", false, kMin, kMax, [](T& to, const T& f) { to.fp8 = f.fp8; },
       [](const T& t) -> std::string {
         return t.fp8 != Fp8Recipe::kNone ? std::string(name_of(t.fp8)) : "";
       }},
      {"--fp8-filter",
       "with --fp8: module names kept in bf16, comma-separated (torchtitan's filter_fqns: a "
       "linear whose torchtitan name contains one stays bf16; e.g. output, or attention.wq; "
       "auto_filter_small_kn: also torchao's shapes too small to gain, as torchtitan's)",
       "", false, kMin, kMax, [](T& to, const T& f) { to.fp8_filter = f.fp8_filter; },
       [](const T& t) -> std::string {
         std::string out;
         for (const std::string& n : t.fp8_filter) out += (out.empty() ? "" : ",") + n;
         return out;
       }},
      {"--fp8-all-gather",
       "with --fp8 tensorwise under --fsdp: on (given alone: on; each float8 weight's fp32 shard "
       "cast to float8 before FSDP's all-gather, which then moves one byte per element, and the "
       "linears use it uncast: torchtitan's enable_fsdp_float8_all_gather), off",
       "off", false, kMin, kMax, [](T& to, const T& f) { to.fp8_all_gather = f.fp8_all_gather; },
       [](const T& t) -> std::string { return t.fp8_all_gather ? "on" : ""; }, "on"},
      {"--fp8-param-gather",
       "with --impl megatron --fp8 delayed|tensorwise: on (given alone: on; Megatron's "
       "--fp8-param-gather: the TE linears' weights kept in float8 with their transposes, no "
       "cached weight copies, the distributed optimizer gathering one byte per such "
       "parameter; needs --zero 1), off",
       "off", false, kMin, kMax,
       [](T& to, const T& f) { to.fp8_param_gather = f.fp8_param_gather; },
       [](const T& t) -> std::string { return t.fp8_param_gather ? "on" : ""; }, "on"},
      {"--cross-entropy-fusion",
       "Megatron's loss under --impl megatron: none (vocab_parallel_cross_entropy, fp32 softmax "
       "kept), native (--cross-entropy-loss-fusion, the same memory), te "
       "(--cross-entropy-fusion-impl te: only the bf16 logits kept)",
       "none", false, kMin, kMax, [](T& to, const T& f) { to.loss_fusion = f.loss_fusion; },
       [](const T& t) -> std::string {
         return t.loss_fusion != LossFusion::kNone ? std::string(name_of(t.loss_fusion)) : "";
       }},
      {"--gradient-accumulation-fusion",
       "Megatron's under --impl megatron: on (weight gradients added into the fp32 buffer by the "
       "GEMM; Transformer Engine keeps a placeholder per weight shape), off "
       "(--no-gradient-accumulation-fusion: each weight gradient whole in bf16 first)",
       "on", false, kMin, kMax,
       [](T& to, const T& f) { to.grad_accum_fusion = f.grad_accum_fusion; },
       [](const T& t) -> std::string { return t.grad_accum_fusion ? "" : "off"; }},
      {"--dataloader-attention-mask",
       "Megatron's under --impl megatron: on (its default: a bool [b, 1, s, s] causal mask on the "
       "first and last stages during each forward), off "
       "(--no-create-attention-mask-in-dataloader)",
       "on", false, kMin, kMax, [](T& to, const T& f) { to.dataloader_mask = f.dataloader_mask; },
       [](const T& t) -> std::string { return t.dataloader_mask ? "" : "off"; }},
      {"--overlap-grad-reduce",
       "Megatron's --overlap-grad-reduce: on (the data-parallel gradient reduction in buckets "
       "during the last micro-batch's backward), off (its default: after the backward); step "
       "time only",
       "off", false, kMin, kMax,
       [](T& to, const T& f) { to.overlap_grad_reduce = f.overlap_grad_reduce; },
       [](const T& t) -> std::string { return t.overlap_grad_reduce ? "on" : ""; }},
      {"--overlap-param-gather",
       "Megatron's --overlap-param-gather (with --zero 1 or more and --overlap-grad-reduce on): "
       "on (the parameter all-gather during the next step's forward), off (its default); step "
       "time only",
       "off", false, kMin, kMax,
       [](T& to, const T& f) { to.overlap_param_gather = f.overlap_param_gather; },
       [](const T& t) -> std::string { return t.overlap_param_gather ? "on" : ""; }},
      {"--tp-comm-overlap",
       "Megatron's --tp-comm-overlap under --impl megatron with --sp on: on (Transformer "
       "Engine's userbuffers overlap the layer's sequence-parallel all-gathers and "
       "reduce-scatters with its GEMMs, and hold their own buffers), off (its default)",
       "off", false, kMin, kMax,
       [](T& to, const T& f) { to.tp_comm_overlap = f.tp_comm_overlap; },
       [](const T& t) -> std::string { return t.tp_comm_overlap ? "on" : ""; }},
      {"--make-vocab-size-divisible-by",
       "Megatron's under --impl megatron: the vocabulary padded to a multiple of this x tp", "128",
       true, 1, 1 << 20, [](T& to, const T& f) { to.vocab_multiple = f.vocab_multiple; },
       [](const T& t) -> std::string { return t.vocab_multiple != 128 ? number(t.vocab_multiple) : ""; }},
      {"--grad-accum-dtype",
       "gradient accumulation dtype: fp32 (nanotron's accumulate_grad_in_fp32), bf16", "fp32",
       false, kMin, kMax, [](T& to, const T& f) { to.grad_dtype = f.grad_dtype; },
       [](const T& t) -> std::string {
         return t.grad_dtype != Dtype::kFp32 ? std::string(name_of(t.grad_dtype)) : "";
       }},
      {"--optimizer", "adamw, sgd, none", "adamw", false, kMin, kMax,
       [](T& to, const T& f) { to.optimizer = f.optimizer; },
       [](const T& t) -> std::string {
         return t.optimizer != Optimizer::kAdamW ? std::string(name_of(t.optimizer)) : "";
       }},
      {"--recompute",
       "none, selective (attention core), selective-op (torchtitan's per-op policy: each layer "
       "keeps its input, every other matmul's output, attention's and the reduce-scatters'), "
       "full (nanotron's recompute_layer: true), auto (cheapest per-layer plan that fits; the "
       "default with --budget or --gpu, else none)",
       "", false, kMin, kMax, [](T& to, const T& f) { to.recompute = f.recompute; }, never},
      {"--recompute-every",
       "with --recompute full: recompute every Nth decoder layer only, layers l with (l + 1) mod "
       "N = 0 (torchtitan's selective_ac_option N)",
       "1", true, 1, 1 << 20, [](T& to, const T& f) { to.recompute_every = f.recompute_every; },
       [](const T& t) -> std::string {
         return t.recompute_every > 1 ? number(t.recompute_every) : "";
       }},
      {"--tp-recompute-allgather",
       "true, false: keep the SP shard and all-gather again in backward (nanotron's and "
       "Megatron's way; --impl torchtitan keeps the gathered input)",
       "true", false, kMin, kMax,
       [](T& to, const T& f) { to.tp_recompute_allgather = f.tp_recompute_allgather; },
       [](const T& t) -> std::string { return t.tp_recompute_allgather ? "" : "false"; }},
  };
}

}  // namespace

const std::vector<SetupFlag>& setup_flags() {
  static const std::vector<SetupFlag> table = make_table();
  return table;
}

SetupText::SetupText() {
  for (const SetupFlag& f : setup_flags()) text_[std::string(f.name)] = std::string(f.default_text);
}

void SetupText::set(std::string_view flag, std::string text) {
  text_[std::string(flag)] = std::move(text);
  given_.insert(std::string(flag));
}

const std::string& SetupText::operator[](std::string_view flag) const {
  auto it = text_.find(flag);
  if (it == text_.end()) throw std::logic_error("not a setup flag: " + std::string(flag));
  return it->second;
}

Result<double> parse_real_flag(std::string_view flag, const std::string& text, double most,
                          std::string_view valid) {
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !(v >= 0 && v <= most))
    return make_error("invalid " + std::string(flag) + " " + quote_input(text) + " (valid: " +
                      std::string(valid) + ")");
  return v;
}

Result<int64_t> parse_count_flag(std::string_view flag, std::string_view text, int64_t lo,
                                 int64_t hi) {
  std::string valid = lo == 1 && hi == kMax   ? "a positive whole number"
                      : lo == 0 && hi == kMax ? "a whole number >= 0"
                      : lo <= -kMax           ? "a whole number"
                                              : format_int(lo) + " to " + format_int(hi);
  if (lo >= 0 && hi < kMax && hi - lo >= 1 && hi - lo <= 4) {  // a few values: list them
    valid.clear();
    for (int64_t k = lo; k <= hi; ++k) valid += (k > lo ? ", " : "") + std::to_string(k);
  }
  Result<int64_t> r = parse_integer(text);
  if (!r)
    return make_error("invalid " + std::string(flag) + " " + quote_input(text) + ": " +
                      r.error().message + " (valid: " + valid + ")");
  if (*r < lo || *r > hi)
    return make_error("invalid " + std::string(flag) + " " + std::string(text) + " (valid: " +
                      valid + ")");
  return *r;
}

Result<TrainSpec> setup_from_flags(const SetupText& s, bool budgeted) {
  TrainSpec t;
  std::optional<Error> failed;
  auto count = [&](std::string_view name, int64_t& out) {
    if (failed || s[name].empty()) return;
    for (const SetupFlag& f : setup_flags())
      if (f.name == name) {
        Result<int64_t> r = parse_count_flag(name, s[name], f.lo, f.hi);
        if (!r) failed = r.error();
        else out = *r;
      }
  };
  auto take = [&]<typename V>(Result<V> r, auto& out) {
    if (failed) return;
    if (!r) failed = r.error();
    else out = *r;
  };
  int64_t zero = 0, microbatches = 0, virtual_stages = 0;
  count("--tp", t.tp), count("--pp", t.pp), count("--dp", t.dp), count("--ep", t.ep);
  count("--cp", t.cp), count("--zero", zero), count("--micro-batch", t.micro_batch);
  count("--seq-len", t.seq_len), count("--microbatches", microbatches);
  count("--virtual-stages", virtual_stages);
  count("--make-vocab-size-divisible-by", t.vocab_multiple);
  count("--mtp-layers", t.mtp_layers);
  count("--dp-replicate", t.dp_replicate);
  count("--recompute-every", t.recompute_every);
  t.zero = static_cast<int>(zero);
  if (!failed && !s["--moe-capacity-factor"].empty())
    take(parse_real_flag("--moe-capacity-factor", s["--moe-capacity-factor"], 64,
                    "0 for dropless routing, or a factor in (0, 64] such as 1.25"),
         t.moe_capacity_factor);
  if (failed) return *failed;
  t.microbatches = s["--microbatches"].empty() ? std::max<int64_t>(1, t.pp) : microbatches;
  const std::string& sp = s["--sp"];
  if (sp != "auto" && sp != "on" && sp != "off")
    return make_error("invalid --sp " + quote_input(sp) + " (valid: on, off, auto)");
  t.sp = sp == "auto" ? t.tp > 1 : sp == "on";
  take(parse_enum<PpSchedule>("--pp-schedule", s["--pp-schedule"]), t.pp_schedule);
  if (failed) return *failed;
  take(parse_switch("--fsdp", s["--fsdp"], "on", "off"), t.fsdp);
  if (failed) return *failed;
  // FSDP without a pipeline runs micro-batches one after another (torchtitan's train_step).
  if (t.fsdp && t.pp == 1 && !s.given("--pp-schedule")) t.pp_schedule = PpSchedule::k1F1B;
  // torchtitan's "default" reshard policy: not under PP.
  if (t.fsdp && t.pp > 1 && !s.given("--reshard-after-forward")) t.reshard_after_forward = false;
  t.virtual_stages = !s["--virtual-stages"].empty()                   ? virtual_stages
                     : t.pp_schedule == PpSchedule::kInterleaved ? 2
                                                                      : 1;
  take(parse_enum<AttentionImpl>("--attention", s["--attention"]), t.attention);
  take(parse_enum<Impl>("--impl", s["--impl"]), t.impl);
  take(parse_enum<Fp8Recipe>("--fp8", s["--fp8"]), t.fp8);
  if (!s["--fp8-filter"].empty()) {
    t.fp8_filter.clear();
    const std::string& text = s["--fp8-filter"];
    for (size_t at = 0;;) {
      size_t comma = text.find(',', at);
      std::string name = text.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      if (name.empty() || name.find_first_of(" \t\n") != std::string::npos)
        return make_error("invalid --fp8-filter " + quote_input(text) +
                          " (valid: module names without spaces, comma-separated, such as "
                          "output,attention.wq)");
      t.fp8_filter.push_back(std::move(name));
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  }
  take(parse_switch("--fp8-all-gather", s["--fp8-all-gather"], "on", "off"), t.fp8_all_gather);
  take(parse_switch("--fp8-param-gather", s["--fp8-param-gather"], "on", "off"),
       t.fp8_param_gather);
  take(parse_enum<LossFusion>("--cross-entropy-fusion", s["--cross-entropy-fusion"]),
       t.loss_fusion);
  take(parse_switch("--gradient-accumulation-fusion", s["--gradient-accumulation-fusion"], "on",
                    "off"),
       t.grad_accum_fusion);
  take(parse_switch("--dataloader-attention-mask", s["--dataloader-attention-mask"], "on", "off"),
       t.dataloader_mask);
  take(parse_switch("--overlap-grad-reduce", s["--overlap-grad-reduce"], "on", "off"),
       t.overlap_grad_reduce);
  take(parse_switch("--overlap-param-gather", s["--overlap-param-gather"], "on", "off"),
       t.overlap_param_gather);
  take(parse_switch("--tp-comm-overlap", s["--tp-comm-overlap"], "on", "off"),
       t.tp_comm_overlap);
  take(parse_switch("--reshard-after-forward", s["--reshard-after-forward"], "on", "off"),
       t.reshard_after_forward);
  take(parse_enum<Dtype>("--grad-accum-dtype", s["--grad-accum-dtype"]), t.grad_dtype);
  take(parse_enum<Optimizer>("--optimizer", s["--optimizer"]), t.optimizer);
  if (failed) return *failed;
  if (s["--recompute"].empty())
    t.recompute = budgeted ? Recompute::kAuto : Recompute::kNone;
  else
    take(parse_enum<Recompute>("--recompute", s["--recompute"]), t.recompute);
  if (failed) return *failed;
  if (t.recompute == Recompute::kAuto && !budgeted)
    return make_error("--recompute auto needs a budget: give --budget or --gpu");
  take(parse_bool("--tp-recompute-allgather", s["--tp-recompute-allgather"]),
       t.tp_recompute_allgather);
  if (failed) return *failed;
  const std::string& partition = s["--partition"];
  if (partition == "auto" && t.recompute != Recompute::kAuto)
    return make_error(
        "--partition auto searches with the recompute plan: it needs --recompute auto and a "
        "budget (--budget or --gpu)");
  if (partition == "auto" && t.pp_schedule == PpSchedule::kInterleaved)
    return make_error(
        "--partition auto searches contiguous stage splits; the interleaved schedule splits the "
        "layers into balanced chunks (use --partition balanced, or --pp-schedule 1f1b)");
  if (partition != "balanced" && partition != "auto")
    take(parse_partition(partition), t.stage_layers);
  if (failed) return *failed;
  return t;
}

Result<TrainSpec> override_setup(const TrainSpec& config, bool config_sets_recompute,
                                 const SetupText& s, bool budgeted) {
  Result<TrainSpec> flags = setup_from_flags(s, budgeted);
  if (!flags) return flags;
  TrainSpec t = config;
  for (const SetupFlag& f : setup_flags())
    if (f.name != "--recompute" && s.given(f.name)) f.copy(t, *flags);
  if (!s.given("--partition") &&
      (s.given("--pp") || s.given("--pp-schedule") || s.given("--virtual-stages")))
    t.stage_layers.clear();  // the config's split was for its own pp and schedule: balanced
  if (s.given("--recompute") || !config_sets_recompute) t.recompute = flags->recompute;
  if (s.given("--recompute") && !s.given("--recompute-every")) t.recompute_every = 1;
  if (t.fsdp && t.pp == 1 && !s.given("--pp-schedule")) t.pp_schedule = PpSchedule::k1F1B;
  if (t.fsdp && t.pp > 1 && !s.given("--reshard-after-forward")) t.reshard_after_forward = false;
  if (t.tp == 1) t.sp = false;
  return t;
}

std::string setup_command_flags(const TrainSpec& t) {
  std::string c;
  for (const SetupFlag& f : setup_flags())
    if (std::string v = f.write(t); !v.empty()) c += " " + std::string(f.name) + " " + v;
  return c;
}

namespace {

// RoPE runs past the trained positions (learned ones cannot: validate_setup refuses them): said.
void warn_past_positions(const ModelSpec& m, const TrainSpec& t,
                         const std::function<void(const std::string&)>& say) {
  if (m.max_positions > 0 && t.seq_len > m.max_positions)
    say("warning: --seq-len " + std::to_string(t.seq_len) + " is beyond " + m.name +
        "'s max_position_embeddings " + std::to_string(m.max_positions) +
        " (the bytes are estimated; the model was not trained that long)");
}

}  // namespace

Result<ResolvedSetup> resolve_setup(const SetupSources& src, const SetupText& s, bool budgeted,
                                    const std::function<void(const std::string&)>& say) {
  if ((!src.nanotron_config.empty()) + (!src.megatron_args.empty()) +
          (!src.torchtitan_config.empty()) > 1)
    return make_error(src.torchtitan_config.empty()
                          ? "--nanotron-config and --megatron-args both give the setup; give one "
                            "of them"
                          : "--torchtitan-config and --" +
                                std::string(src.nanotron_config.empty() ? "megatron-args"
                                                                        : "nanotron-config") +
                                " both give the setup; give one of them");
  if (src.gpus > 0 && src.torchtitan_config.empty())
    return make_error("--gpus gives a torchtitan config's world size and needs "
                      "--torchtitan-config (give --dp for the data-parallel degree)");
  if (!src.torchtitan_config.empty()) {
    if (!src.model.empty())
      return make_error("--model and --torchtitan-config both name the model (the config's "
                        "[model] name and flavor); give one of them");
    Result<std::string> text = read_text_file(src.torchtitan_config, "torchtitan config");
    if (!text) return text.error();
    Result<ConfigSetup> c = torchtitan_config(*text, src.torchtitan_config, src.gpus);
    if (!c) return c.error();
    for (const std::string& n : c->notes) say(n);
    Result<std::vector<ModelSpec>> catalog = load_model_catalog(src.models_dir);
    if (!catalog) return catalog.error();
    Result<ModelSpec> m = resolve_model(*catalog, c->catalog_model);
    if (!m) return m.error();
    Result<TrainSpec> t = override_setup(c->setup, true, s, budgeted);
    if (!t) return t.error();
    if (auto e = validate_setup(*m, *t)) return make_error(src.torchtitan_config + ": " + e->message);
    warn_past_positions(*m, *t, say);
    t->mtp_layers = mtp_depths(*m, *t);
    return ResolvedSetup{*m, *t};
  }
  if (!src.nanotron_config.empty()) {
    if (!src.model.empty())
      return make_error(
          "--model and --nanotron-config both name the model (the config's "
          "model.model_config); give one of them");
    Result<std::string> text = read_text_file(src.nanotron_config, "nanotron config");
    if (!text) return text.error();
    Result<ConfigSetup> c = nanotron_config(*text, src.nanotron_config);
    if (!c) return c.error();
    for (const std::string& n : c->notes) say(n);
    ModelSpec m = *c->model;
    std::filesystem::path file(src.nanotron_config);
    m.name = file.stem().string();
    if (!is_model_name(m.name)) m.name = "nanotron-config";
    m.display_name = "nanotron config " + file.filename().string();
    Result<TrainSpec> t = override_setup(c->setup, c->given.count("--recompute") > 0, s, budgeted);
    if (!t) return t.error();
    if (auto e = validate_setup(m, *t)) return make_error(src.nanotron_config + ": " + e->message);
    warn_past_positions(m, *t, say);
    t->mtp_layers = mtp_depths(m, *t);
    return ResolvedSetup{m, *t};
  }
  if (src.model.empty())
    return make_error(
        "--model is required (a catalog name or alias, a .toml or config.json path), or give "
        "--nanotron-config FILE");
  Result<std::vector<ModelSpec>> catalog = load_model_catalog(src.models_dir);
  if (!catalog) return catalog.error();
  Result<ModelSpec> m = resolve_model(*catalog, src.model);
  if (!m) return m.error();
  Result<TrainSpec> t = setup_from_flags(s, budgeted);
  if (!t) return t.error();
  if (!src.megatron_args.empty()) {
    Result<ConfigSetup> c = megatron_args(src.megatron_args, *m, t->dp);
    if (!c) return c.error();
    for (const std::string& n : c->notes) say(n);
    t = override_setup(c->setup, c->given.count("--recompute") > 0, s, budgeted);
    if (!t) return t.error();
  }
  if (auto e = validate_setup(*m, *t)) return *e;
  warn_past_positions(*m, *t, say);
  t->mtp_layers = mtp_depths(*m, *t);  // the model's default made explicit
  return ResolvedSetup{*m, *t};
}

Result<int64_t> parse_budget(const std::string& text) {
  Result<int64_t> r = parse_bytes(text);
  if (!r) return make_error("--budget: " + r.error().message);
  // A number without a unit is bytes; no GPU has under 1 MiB, so such a budget lost its unit.
  if (*r < (int64_t{1} << 20))
    return make_error("invalid --budget " + quote_input(text) + ": " + format_int(*r) +
                      " bytes is under 1 MiB; give a unit (valid: such as 80GB, 80GiB or "
                      "85899345920)");
  return *r;
}

Result<int64_t> parse_headroom(const std::string& h, int64_t budget) {
  const std::string valid = "a percentage of the budget in [0, 50] such as 3%, or bytes below "
                            "the budget such as 2GiB";
  if (!h.empty() && h.back() == '%') {
    char* end = nullptr;
    std::string digits = h.substr(0, h.size() - 1);
    double pct = std::strtod(digits.c_str(), &end);
    if (digits.empty() || *end != '\0' || !(pct >= 0 && pct <= 50))
      return make_error("invalid --headroom " + quote_input(h) + " (valid: " + valid + ")");
    return static_cast<int64_t>(static_cast<double>(budget) * pct / 100);
  }
  // A bare number is ambiguous (bytes, or a percentage without its sign): a unit or % is needed.
  if (!h.empty() && h.find_first_not_of("0123456789.") == std::string::npos && h != "0")
    return make_error("invalid --headroom " + quote_input(h) + ": give a unit or % (valid: " +
                      valid + ")");
  Result<int64_t> r = parse_bytes(h, /*allow_zero=*/true);
  if (!r) return make_error("--headroom: " + r.error().message);
  if (*r >= budget)
    return make_error("invalid --headroom " + quote_input(h) + ": " + format_int(*r) +
                      " bytes leave nothing of the budget of " + format_int(budget) +
                      " (valid: " + valid + ")");
  return *r;
}

}  // namespace np
