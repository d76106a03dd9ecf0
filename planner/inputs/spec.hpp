// The plain-data inputs of every planner pass: the model, the training setup and the runtime
// assumptions, validated once at the edge (validate_setup) with errors that name the fix.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "planner/inputs/allocator_conf.hpp"
#include "planner/inputs/result.hpp"

namespace np {

// fp8: the OCP formats (OCP 8-bit Floating Point Specification, OFP8, rev. 1.0, 2023; Micikevicius
// et al., "FP8 Formats for Deep Learning", arXiv:2209.05433, Table 1), PyTorch's float8_e4m3fn
// and float8_e5m2.
enum class Dtype { kBf16, kFp32, kU8, kI64, kFp8E4m3, kFp8E5m2 };
enum class Norm { kRms, kLayer };
enum class Activation { kSwiGlu, kGelu };
enum class PosEmb { kRope, kLearned };
enum class PpSchedule { k1F1B, kAfab, kInterleaved };  // interleaved: 1F1B over virtual stages
enum class AttentionImpl { kFlash, kEager };
// What a training framework's kernels keep for backward and allocate around the ops it fuses or
// not (the op table's variants; planner/graph/graph.cpp builds each profile's layer):
//   nanotron: norms keep their fp32 per-row statistics (flash-attn's fused RMSNorm/LayerNorm),
//             the GLU is unfused (silu(gate) is kept), the loss casts the logits to an fp32 copy
//             and subtracts the row maxima out of place (a second fp32 buffer).
//   megatron: norms keep their statistics (apex / Transformer Engine), fused SwiGLU, the loss
//             works in place on one fp32 buffer.
//   fused:    norms recompute their statistics in backward, fused SwiGLU, the in-place loss: the
//             least a framework can keep.
//   hf:       Hugging Face transformers' Llama: RMSNorm in PyTorch ops (keeps an fp32 copy of its
//             input, the fp32 1/rms and the bf16 normalized tensor), unfused GLU, repeat_kv's
//             expanded K/V materialised (eager and sdpa), eager softmax in fp32 kept with its bf16
//             cast, and the loss as an fp32 copy of the logits and a kept fp32 log-softmax.
//   torchtitan: torchtitan's Llama 3 in eager PyTorch 2.10 (torchtitan 238fa99,
//             torchtitan/models/llama3/model/model.py): nn.RMSNorm (PyTorch's fused kernel,
//             _fused_rms_norm, keeps its input and the fp32 1/rms), wq, wk and wv as three
//             linears, RoPE in complex fp32 (apply_rotary_emb), SDPA's flash kernel on separate
//             q, k and v, w1 and w3 as two linears with F.silu and the product as PyTorch ops,
//             and the loss as F.cross_entropy of an fp32 copy of the logits (components/loss.py).
enum class Impl { kNanotron, kMegatron, kFused, kHf, kTorchtitan };
// float8 linears (--fp8): torchao's Float8Linear with dynamic scaling (pytorch/ao 36027d8,
// torchao/float8/config.py): tensorwise (Float8LinearConfig's defaults: e4m3 input and weight,
// e5m2 output gradient, one fp32 scale per tensor), rowwise (its "rowwise" recipe: e4m3
// throughout, one scale per row or column, rounded down to a power of 2), or rowwise_with_gw_hp
// (rowwise, but the input gradient's GEMM takes the weight cast with one scale, and the weight
// gradient's GEMM runs in bf16 on the uncast tensors).
// Under --impl megatron the recipes are Transformer Engine's, as Megatron's --fp8-recipe names
// them (Megatron-LM d98e8a6, megatron/core/fp8_utils.py): delayed (DelayedScaling: each tensor
// cast with the scale of its amax history) and tensorwise (Float8CurrentScaling: each tensor's
// own amax first); te_fp8 below.
enum class Fp8Recipe { kNone, kTensorwise, kRowwise, kRowwiseGwHp, kDelayed };
const char* name_of(Fp8Recipe r);
inline constexpr const char* kFp8AutoFilter = "auto_filter_small_kn";  // TrainSpec::fp8_filter
// Megatron's cross-entropy (--impl megatron): none, vocab_parallel_cross_entropy; native, its
// fused form (--cross-entropy-loss-fusion), which keeps the same fp32 softmax; te, Transformer
// Engine's parallel_cross_entropy (--cross-entropy-fusion-impl te), which keeps only the bf16
// logits, holding their gradient.
enum class LossFusion { kNone, kNative, kTe };
enum class Optimizer { kAdamW, kSgd, kNone };
// auto: chosen per layer under a budget. selective-op: torchtitan's per-op checkpointing of each
// decoder layer (planner/graph/policy.cpp says which ops it keeps).
enum class Recompute { kNone, kSelective, kFull, kAuto, kSelectiveOp };

int64_t dtype_bytes(Dtype d);
const char* name_of(Dtype d);
const char* name_of(Norm n);
const char* name_of(Activation a);
const char* name_of(PosEmb p);
const char* name_of(PpSchedule s);
const char* name_of(AttentionImpl a);
const char* name_of(Impl i);
const char* name_of(Optimizer o);
const char* name_of(LossFusion l);
const char* name_of(Recompute r);

// How a token's experts and their weights come from its router logits. The plain form (softmax,
// normalized, one group, no scaling) is the softmax over the top-k logits (Mixtral, Qwen3-MoE,
// Megatron's default); the rest is DeepSeek's and Qwen2-MoE's (transformers' DeepseekV3TopkRouter,
// DeepseekV2MoEGate, Qwen2MoeSparseMoeBlock; Megatron-LM d98e8a6, megatron/core/transformer/moe/
// moe_utils.py, topk_routing_with_score_function and group_limited_topk):
//   scores = sigmoid(logits), or softmax(logits) over all the experts;
//   the experts are split into `groups` equal groups, each scored by the sum of its top
//   (top_k / topk_groups) scores (plus the expert bias, when the model has one), and the top
//   topk_groups groups are eligible; the top_k eligible experts (scores plus bias) are chosen;
//   their weights are their scores (the bias only chooses), divided by their sum plus 1e-20 when
//   normalized, times `scaling`.
struct RouterSpec {
  bool sigmoid = false;   // scoring_func "sigmoid", else "softmax"
  bool normalize = true;  // norm_topk_prob (Megatron: sigmoid, or softmax without pre-softmax)
  int64_t groups = 1, topk_groups = 1;  // n_group, topk_group
  double scaling = 1.0;                 // routed_scaling_factor
  bool plain() const { return !sigmoid && normalize && groups == 1 && scaling == 1.0; }
};

struct MoeSpec {
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t expert_ffn = 0;    // intermediate size of one routed expert
  int64_t shared_ffn = 0;    // intermediate size of the shared expert (0: none)
  bool shared_gate = false;  // sigmoid gate Linear(hidden, 1) on the shared expert
  // DeepSeek-V3's auxiliary-loss-free balancing (topk_method "noaux_tc"): an fp32 score-correction
  // bias per routed expert, a buffer that the balancing rule updates, not a trained weight; the
  // published parameter counts include it (transformers' DeepseekV3TopkRouter
  // e_score_correction_bias; Megatron's TopKRouter expert_bias, megatron/core/transformer/moe/
  // router.py, Megatron-LM d98e8a6).
  bool expert_bias = false;
  RouterSpec router;
};

// Multi-head latent attention (DeepSeek-V2/V3): queries from a low-rank latent (or projected
// directly when q_lora_rank is 0), keys and values from one shared kv latent, and a decoupled RoPE
// part of each query and key head; a key's RoPE part is one per token, shared by every head.
// Each head's q and k have qk_nope_head_dim + qk_rope_head_dim features (ModelSpec::head_dim),
// its v v_head_dim (Megatron-LM d98e8a6, megatron/core/transformer/multi_latent_attention.py;
// transformers' DeepseekV3Attention).
struct MlaSpec {
  int64_t q_lora_rank = 0;  // 0: q_proj from the hidden states (DeepSeek-V2-Lite)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0, qk_rope_head_dim = 0, v_head_dim = 0;
};

struct ModelSpec {
  std::string name;          // canonical catalog name, e.g. "llama-3.1-70b"
  std::string display_name;  // e.g. "Llama-3.1-70B"
  std::string source;        // where the figures come from (config.json URL, paper)
  std::vector<std::string> aliases;
  int64_t hidden = 0;
  int64_t ffn = 0;  // dense MLP intermediate size
  int64_t layers = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab = 0;
  int64_t max_positions = 0;
  Norm norm = Norm::kRms;
  Activation activation = Activation::kSwiGlu;
  PosEmb position = PosEmb::kRope;
  bool qkv_bias = false;     // bias on q, k, v projections
  // RMSNorm of every query and key head over head_dim before RoPE, one weight of head_dim for the
  // queries and one for the keys (Qwen3: transformers' Qwen3Attention q_norm and k_norm;
  // Megatron's --qk-layernorm).
  bool qk_norm = false;
  std::optional<MlaSpec> mla;  // multi-head latent attention instead of [q | k | v] projections
  bool linear_bias = false;  // bias on the attention output projection and MLP linears
  bool tie_embeddings = false;
  double dropout = 0.0;                        // hidden and attention dropout probability
  std::optional<MoeSpec> moe;                  // the decoder layers' MLP is MoE when set ...
  // ... except these decoder layers (0-based, ascending), whose MLP is the dense one of width ffn:
  // DeepSeek's first_k_dense_replace, Qwen3-MoE's mlp_only_layers, Megatron's --moe-layer-freq.
  std::vector<int64_t> dense_layers;
  // Multi-token prediction modules trained beside the model (DeepSeek-V3's MTP: config.json's
  // num_nextn_predict_layers), the default of TrainSpec::mtp_layers. Not in the parameter count.
  int64_t mtp_layers = 0;
  std::optional<int64_t> expected_parameters;  // the public exact count, when there is one
};

struct TrainSpec {
  int64_t tp = 1, pp = 1, dp = 1, ep = 1;
  // Context parallelism (Megatron's): each sequence split over cp ranks in 2 cp load-balanced
  // causal chunks (rank r holds chunks r and 2 cp - 1 - r), K/V all-gathered for attention and
  // their gradients reduce-scattered back, weights replicated over cp. Ranks: tp, cp, dp, pp.
  int64_t cp = 1;
  bool sp = false;          // sequence parallelism (nanotron's REDUCE_SCATTER mode)
  int zero = 0;             // ZeRO stage 0..3 over dp x cp (Megatron's data-parallel + CP group)
  // FSDP2 (PyTorch's fully_shard, as torchtitan applies it: MixedPrecisionPolicy(param_dtype bf16,
  // reduce_dtype fp32); docs/fsdp.md) in place of ZeRO: fp32 parameters, fp32 gradients and AdamW
  // states sharded over the shard group (dp / dp_replicate x cp), each parameter padded on dim 0
  // to a multiple of the group; one unit per block (the embedding, each decoder layer, the final
  // norm with the output layer), its bf16 weights all-gathered before its forward and, resharded
  // after it, again before its backward; its bf16 gradients reduce-scattered in fp32.
  bool fsdp = false;
  // HSDP (torchtitan's data_parallel_replicate_degree): dp = dp_replicate x the shard degree;
  // each shard's gradient is all-reduced over the replicas in place. 1: plain FSDP.
  int64_t dp_replicate = 1;
  // torchtitan's fsdp_reshard_after_forward: each decoder layer's and the embedding's gathered
  // weights freed after its forward (true, "default" without PP and "always") or kept to its
  // backward ("never"). The final norm with the output layer is kept either way (torchtitan
  // reshards it only under "always"; its backward follows its forward at once).
  bool reshard_after_forward = true;
  int64_t fsdp_shards() const { return dp / dp_replicate * cp; }
  // MoE token capacity (Megatron's --moe-expert-capacity-factor with --moe-pad-expert-input-to-
  // capacity): each expert takes ceil(tokens x top_k x factor / experts) slots of every source
  // rank's micro-batch tokens, padded to that count; assignments beyond it are dropped in token
  // order (--moe-token-drop-policy position). 0: dropless (balanced routing is assumed).
  double moe_capacity_factor = 0;
  int64_t gpus() const { return tp * cp * pp * dp; }
  // NCCL communicators a rank is in: one per parallel dimension above 1, and HSDP's replica
  // group beside its shard group.
  int communicators() const {
    return (tp > 1) + (cp > 1) + (dp > 1) + (pp > 1) + (ep > 1) +
           (fsdp && dp_replicate > 1 && dp > dp_replicate);
  }
  int64_t micro_batch = 1;  // sequences per micro-batch
  int64_t seq_len = 4096;
  int64_t microbatches = 1;  // gradient-accumulation steps per optimizer step
  PpSchedule pp_schedule = PpSchedule::kAfab;
  // Model chunks per pipeline stage under the interleaved schedule (Megatron's
  // virtual_pipeline_model_parallel_size): the layers split into pp x V chunks, chunk j on stage
  // j mod pp. 1 for the other schedules.
  int64_t virtual_stages = 1;
  AttentionImpl attention = AttentionImpl::kFlash;
  Impl impl = Impl::kNanotron;  // whose kernels the layer is built from (--impl)
  // float8 linears (--fp8; torchtitan's float8 converter): the torchtitan profile's linears as
  // torchao's Float8Linear, under FSDP2 (at tp > 1 tensorwise only, as torchao's float8 TP:
  // float8_tp). Linears with a dimension not a multiple of 16,
  // or whose torchtitan name contains one of fp8_filter (its filter_fqns), stay bf16
  // (torchtitan's module_filter_fn, torchtitan/components/quantization/utils.py).
  // With kFp8AutoFilter among them, also the shapes torchao's auto filter keeps in bf16
  // (torchtitan's flag for _auto_filter_for_recipe; float8_linear below).
  Fp8Recipe fp8 = Fp8Recipe::kNone;
  std::vector<std::string> fp8_filter;
  // FSDP2's float8 all-gather (--fp8-all-gather; torchtitan's enable_fsdp_float8_all_gather,
  // tensorwise only): each float8 linear's fp32 shard cast to e4m3 before the all-gather
  // (torchao's WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather), so the unit gathers one
  // byte per element of those weights and the linears take them without casting again.
  bool fp8_all_gather = false;
  // Megatron's --fp8-param-gather under te_fp8: each TE linear's weight a Float8Tensor, its e4m3
  // data in the DDP param buffer (uint8) and, on Hopper, its transpose beside it (created after
  // each param all-gather, TE's post_all_gather_processing): 2 bytes per parameter as bf16's, but
  // no cached weight copies; the distributed optimizer all-gathers one byte per such parameter.
  bool fp8_param_gather = false;
  LossFusion loss_fusion = LossFusion::kNone;  // megatron only (--cross-entropy-fusion)
  // Megatron's gradient-accumulation fusion (megatron only; on by default, off with its
  // --no-gradient-accumulation-fusion): on, each weight-gradient GEMM adds into the fp32 main_grad
  // buffer and Transformer Engine hands autograd a kept placeholder per weight shape; off, each
  // linear's weight gradient is first a whole bf16 tensor, which the DDP hook adds into main_grad
  // and drops (Megatron-LM 23e00ed, megatron/core/distributed/distributed_data_parallel.py,
  // _make_backward_post_hook).
  bool grad_accum_fusion = true;
  // Megatron's dataloader attention mask (megatron only; on by default, off with its
  // --no-create-attention-mask-in-dataloader): a bool [b, 1, s, s] causal mask that get_batch
  // puts on the GPU of every TP rank of the first and last pipeline stages for each micro-batch's
  // forward, sliced to [b, 1, s / cp, s] under CP (Megatron-LM 23e00ed,
  // megatron/core/datasets/gpt_dataset.py L221-225 and L653-692, megatron/training/utils.py
  // get_batch_on_this_tp_rank and get_batch_on_this_cp_rank, pretrain_gpt.py get_batch and
  // forward_step).
  bool dataloader_mask = true;
  // Megatron's --make-vocab-size-divisible-by (megatron only): the vocabulary is padded to a
  // multiple of this x tp.
  int64_t vocab_multiple = 128;
  Dtype grad_dtype = Dtype::kFp32;  // nanotron's accumulate_grad_in_fp32
  Optimizer optimizer = Optimizer::kAdamW;
  Recompute recompute = Recompute::kNone;
  // Full recompute of every Nth decoder layer only (with Recompute::kFull): layers l with
  // (l + 1) mod N = 0, 0-based, as torchtitan's selective_ac_option "N" picks them (a counter
  // incremented before the test: torchtitan 238fa99, torchtitan/distributed/
  // activation_checkpoint.py _apply_layer_sac). 1: every layer.
  int64_t recompute_every = 1;
  bool tp_recompute_allgather = true;  // keep the SP shard, all-gather again in backward
  // Without sequence parallelism, the pipeline's hidden states travel as 1 / tp per TP rank,
  // all-gathered over NVLink on arrival: Megatron-LM before Megatron-core
  // (--scatter-gather-tensors-in-pipeline, on by default; Narayanan et al. 2021, arXiv:2104.04473,
  // section 4.1). Megatron-core, and so the default here, sends the whole tensor from every TP
  // rank (cost.hpp, pipeline_p2p_bytes). Set by the published checks of those papers' setups.
  bool p2p_scatter_gather = false;
  // Megatron's --overlap-grad-reduce and --overlap-param-gather (both off by default:
  // megatron/training/arguments.py, NVIDIA/Megatron-LM 307dcf3): the data-parallel gradient
  // reduction issued bucket by bucket during the last micro-batch's backward, and the distributed
  // optimizer's parameter all-gather during the next step's forward. They change the step time
  // only (cost.hpp), never a byte.
  bool overlap_grad_reduce = false, overlap_param_gather = false;
  // Megatron's --tp-comm-overlap (off by default, model_parallel_config.py): Transformer Engine's
  // userbuffers overlap the sequence-parallel all-gathers and reduce-scatters of the layer's
  // linears with their GEMMs. Needs sequence parallelism and the megatron profile. Changes the
  // step time and adds TE's userbuffers (runtime_terms.cpp).
  bool tp_comm_overlap = false;
  // Decoder layers per pipeline stage (pp entries, each >= 1, summing to the model's layers);
  // empty: balanced by FLOPs (partition_layers in schedule.hpp).
  std::vector<int64_t> stage_layers;
  // Multi-token prediction depths (Megatron's --mtp-num-layers; -1: the model's, ModelSpec::
  // mtp_layers), all on the last pipeline stage as Megatron places them, each loss weighted
  // mtp_loss_scale / depths (Megatron's --mtp-loss-scaling-factor, default 0.1:
  // megatron/core/transformer/transformer_config.py L75 at Megatron-LM d98e8a6). build_head in
  // graph.hpp says what a depth is.
  int64_t mtp_layers = -1;
  double mtp_loss_scale = 0.1;
};

// The multi-token prediction depths a setup trains: its own, else the model's.
int64_t mtp_depths(const ModelSpec& m, const TrainSpec& t);

// Per-GPU runtime costs outside the schedule's tensors; each is printed on its own line
// (planner/schedule/runtime_terms.hpp).
struct RuntimeAssumptions {
  int64_t cuda_context_bytes = 512LL << 20;     // CUDA context + module images on Hopper
  int64_t cublas_workspace_bytes = 32LL << 20;  // one compute stream, PyTorch's sm_90 default
  // Transformer Engine's cuBLAS workspace (the megatron profile): 32 MiB + 1 KiB from compute
  // capability 9.0 on (Hopper, Blackwell), 4 MiB before.
  int64_t te_workspace_bytes = (32LL << 20) + 1024;
  int64_t nccl_bytes_per_comm = 64LL << 20;     // NCCL channel buffers per communicator
  // What allocates the schedule's tensors: PyTorch's caching allocator by default, whose
  // rounding and cached blocks the estimate replays (--allocator, --allocator-conf).
  AllocatorChoice allocator;
};

// The vocabulary rows the embedding and the LM head hold over all TP ranks. The megatron profile
// pads the tokenizer's vocabulary to a multiple of --make-vocab-size-divisible-by
// (TrainSpec::vocab_multiple, default 128) x tp (Megatron-LM core_r0.14.0, megatron/training/tokenizer/tokenizer.py,
// _vocab_size_with_padding, L115-130); the other profiles hold it as it is (tp divides it).
int64_t padded_vocab(const ModelSpec& m, const TrainSpec& t);

// Checks the model against itself and the setup against the model: nanotron's checks plus the
// ones a user expects. Returns the first problem.
std::optional<Error> validate_model(const ModelSpec& m);
// A model name or alias: 1 to 128 letters, digits, '.', '_', '-', '+', '/'.
bool is_model_name(std::string_view name);
// Whether a linear (of torchtitan name `fqn`, its global in and out features) runs as a float8
// linear under the setup: TrainSpec::fp8 and the torchtitan profile, both dimensions multiples of
// 16, no filter of fp8_filter inside its name (torchtitan's module_filter_fn); with kFp8AutoFilter
// among the filters, not a shape torchao's auto filter keeps in bf16.
bool float8_linear(const TrainSpec& t, const std::string& fqn, int64_t in, int64_t out);
// torchao's float8 tensor parallelism (torchtitan's apply_tp with enable_float8_tensorwise_tp):
// tensorwise float8 at tp > 1; the decoder layers' linears as kFp8AllGather, kFp8ColumnLinear
// and kFp8RowLinear (planner/graph/ops.hpp).
bool float8_tp(const TrainSpec& t);
// Transformer Engine's float8 linears under Megatron (--impl megatron with --fp8 delayed or
// tensorwise; Megatron's --fp8-format / --fp8-recipe): the decoder layers' TE linears as
// kTeColumnLinear and kTeRowLinear, their norms writing float8 (planner/graph/ops.hpp).
bool te_fp8(const TrainSpec& t);
// The float8 recipe against the profile (--fp8 under --impl): Transformer Engine's recipes under
// megatron, torchao's under torchtitan, none elsewhere; part of validate_setup, and what the sweep
// checks before generating setups.
std::optional<Error> check_fp8_profile(const TrainSpec& t);
std::optional<Error> validate_setup(const ModelSpec& m, const TrainSpec& t);

// Layers per pipeline stage as the user writes them, "21,20,20,19": decimal integers below 10^9
// separated by commas. (Whether they add up to the model's layers over pp is validate_setup's.)
Result<std::vector<int64_t>> parse_partition(std::string_view text);
// Layer counts per stage as --partition takes them: "21,20,20,19".
std::string format_partition(const std::vector<int64_t>& counts);
// The same syntax for any flag; the error names the flag and `valid`.
Result<std::vector<int64_t>> parse_count_list(std::string_view flag, std::string_view text,
                                              std::string_view valid);

// Parses an enum from its CLI spelling; the error lists the valid choices.
template <typename E>
Result<E> parse_enum(std::string_view flag, std::string_view text);

}  // namespace np
