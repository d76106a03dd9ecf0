// The op table: for every OpKind, its output shapes and dtypes, FLOPs, weights, workspaces and
// which tensors its backward reads; and weight_shard, the one statement of TP sharding.
//
// What the estimate and the executors share is this table's weight shapes and sharding (so weight,
// gradient-buffer and optimizer bytes agree by construction) and which tensors each backward
// reads. The planner sizes every tensor from this table. The executors do not: their kernels
// compute output and workspace shapes from their own inputs and allocate them, the runner frees
// each tensor after its last use by its own count, and every allocation and release is compared
// with the planner's simulation event by event (planner/schedule/contract.hpp, executor/compare.hpp).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "planner/inputs/spec.hpp"

namespace np {

enum class OpKind {
  kEmbedding,     // vocab-parallel lookup: ids -> partial hidden (rows of this TP rank only)
  kPosEmbedding,  // learned absolute positions added to the hidden states
  kRmsNorm,    // statistics recomputed in backward (a per-row fp32 workspace there)
  kLayerNorm,  // as kRmsNorm; with a bias
  // The norms that keep their per-row fp32 statistics for backward as extra outputs (flash-attn's
  // and apex's fused norms): 1/rms; mean and 1/std.
  kRmsNormStats,
  // RMSNorm as PyTorch ops (Hugging Face's): x cast to fp32 (kept), its 1/rms (kept), the fp32
  // product (forward scratch), its bf16 cast (kept), times the weight; the backward's fp32
  // gradients of the product and of the fp32 input are its workspaces.
  kRmsNormHf,
  kLayerNormStats,
  kAllGather,      // TP group, along the token dim (sequence parallelism)
  kReduceScatter,  // TP group, along the token dim
  kAllReduce,      // TP group
  kColumnLinear,   // weight (out/tp, in): output features sharded
  kRowLinear,      // weight (out, in/tp): output is a partial sum over the TP group
  kRope,
  kFlashAttention,  // keeps output and logsumexp; recomputes scores in backward
  kAttnScores,      // eager: Q K^T
  kSoftmax,         // eager: scaled, causal-masked softmax; backward needs its output only
  // The softmax computed in fp32 and kept, then cast to bf16 for the context (Hugging Face's
  // eager attention); its backward casts the incoming gradient to fp32 (a workspace).
  kSoftmaxFp32,
  // Hugging Face's repeat_kv: [q | k | v] rows with the K and V heads repeated to one per query
  // head, materialised (hq + 2 hq columns of head_dim); backward sums the repeats.
  kRepeatKv,
  kAttnContext,     // eager: probs V
  kDropout,         // keeps a 1-byte mask
  kSwiGlu,          // silu(gate) * up, input is [gate | up]; keeps its input only
  // The unfused GLU (act(gate) * up as two PyTorch ops): silu of the gate half of [gate | up],
  // kept for the product's backward, then the product with the up half.
  kGluAct,
  kGluMul,
  kGelu,
  kAdd,           // residual add
  kRouter,        // MoE router linear, fp32 logits
  kTopK,          // top-k of the router logits, softmax over the k
  kMoeDispatch,   // permute tokens to experts (+ all-to-all over ep): capacity slots, or balanced
  kExpertColumn,  // grouped GEMM over the local experts (rows grouped by expert)
  kExpertRow,     // grouped GEMM over the local experts, partial sum over tp
  kMoeCombine,    // un-permute (+ all-to-all back) and weight by the router probabilities
  kSharedGate,    // sigmoid(Linear(h, 1)(x)) * shared expert output
  kCrossEntropy,  // vocab-parallel, fp32 softmax kept for backward
  // Context parallelism: the K/V columns of this rank's qkv all-gathered over the CP group (all
  // the sequence's keys and values, in rank order of the load-balanced chunks); backward
  // reduce-scatters their gradient into the K/V columns of the qkv gradient.
  kCpGatherKv,
  // Flash attention of this rank's queries against the gathered K/V (causal by the chunks' global
  // positions); keeps output and logsumexp.
  kFlashAttentionCp,
  // Hugging Face's loss, PyTorch's F.cross_entropy of logits.float(): the cast as its own op
  // (backward: the fp32 gradient cast back), then the log-softmax (kept, fp32) and the per-token
  // NLL of the fp32 logits (input 0) and targets (input 1). Input 2 is the bf16 logits, which the
  // loss outlives (LlamaForCausalLM holds them while it runs) and which nothing reads. Its
  // backward's workspace is the fp32 NLL gradient per logit; the fp32 logits' gradient follows.
  kCastFp32,
  kLogSoftmaxLoss,
  // Transformer Engine's parallel_cross_entropy (Megatron's --cross-entropy-loss-fusion
  // --cross-entropy-fusion-impl te): no fp32 copy and no kept softmax. Backward reads the bf16
  // logits (TE overwrites them with their gradient in forward and keeps them) and the targets;
  // output 1 is each row's fp32 max and log-sum-exp, which the executors keep to form the
  // gradient. Its forward scratch is TE's [3 x rows] fp32 (max, sum, target logit).
  kCrossEntropyTe,
  // RMSNorm of each query and key head of a [q | k | v] row over head_dim (Qwen3's q_norm and
  // k_norm; Transformer Engine's RMSNorm under Megatron's --qk-layernorm), the values passed
  // through; keeps each head's fp32 1/rms ([rows, heads + kv_heads]) for backward, which reads
  // it and the input. Weights: q_weight and k_weight of head_dim, replicated over TP, their
  // gradients partial sums over the TP ranks' heads.
  kQkNorm,
  // The q/k norms as PyTorch ops (transformers' Qwen3RMSNorm on each q and k head, the hf
  // profile): as kRmsNormHf per head, over the q and k columns ([rows, (heads + kv_heads) x
  // head_dim]): a = fp32(x) kept, 1/rms per head kept, b = a x r an fp32 forward scratch, its
  // bf16 cast kept, y = w x it; v passed through; backward's two fp32 workspaces as kRmsNormHf's.
  kQkNormHf,
  // A linear whose weight (features, in) every TP rank holds whole (Transformer Engine's Linear in
  // parallel_mode "duplicated"): MLA's down-projections, applied to this rank's rows (its sequence
  // shard under SP, else every token).
  kLinear,
  // MLA's query, key and value rows from their projections: input 0 is the queries [rows, heads x
  // head_dim] (each head's last rope_dim features rotated), input 1 the kv up-projection [rows,
  // heads x (head_dim - rope_dim + v_head_dim)] (each head's k content, then its v), input 2 the
  // keys' RoPE part [rows, rope_dim], one per token (rotated and given to every head). Output:
  // [q | k | v] rows as the attention ops read them, heads x (2 head_dim + v_head_dim) wide.
  // Linear in its inputs: its backward reads nothing. Under TP without SP the RoPE part's
  // gradient is a partial sum over this rank's heads, all-reduced over TP in backward.
  kMlaRope,
  // MoE routing other than the softmax over the top-k logits (spec.hpp, RouterSpec; DeepSeek's,
  // Qwen2-MoE's): the score function over every expert's fp32 logit, sigmoid or softmax, kept
  // (its backward reads it);
  kRouteScores,
  // then the group-limited top-k of the scores plus the expert bias (the forward's scratch: the
  // biased scores, the group mask and the masked scores, each of the scores' shape), the chosen
  // scores renormalised and scaled: the probabilities and the indices as kTopK's. Its backward
  // reads the scores and the indices.
  kRouteTopK,
  // Multi-token prediction's input (Megatron-LM d98e8a6, multi_token_prediction.py,
  // _concat_embeddings): torch.cat of the normed embedding (input 0) and the normed hidden states
  // (input 1) along the features; attrs.features: input 0's. Its backward reads nothing.
  kConcat,
  // Megatron's gather_from_tensor_model_parallel_region after a column-parallel linear kept
  // sharded (mappings.py, _gather_along_last_dim): the features all-gathered over the TP group
  // through a [group x rows, features] buffer (the forward's scratch) then concatenated; backward
  // takes this rank's features (_split_along_last_dim, a fresh tensor).
  kGatherFeatures,
  // Megatron's scatter_to_sequence_parallel_region (mappings.py, _split_along_first_dim): this
  // rank's rows of a tensor every TP rank holds whole, copied; backward all-gathers the rows'
  // gradients.
  kScatterRows,
  // torchtitan's apply_rotary_emb (torchtitan 238fa99, torchtitan/models/llama3/model/model.py):
  // q (input 0) and k (input 1), heads of attrs.head_dim, each cast to fp32 and viewed as complex
  // numbers of adjacent feature pairs, multiplied by the complex64 frequencies, then cast back to
  // bf16 (outputs 0 and 1). The forward's scratch is the four fp32 tensors the function holds
  // until it returns (the fp32 q and k, then each product);
  // autograd keeps nothing (the frequencies are a buffer, so the product saves only them).
  // Backward: the fp32 gradient and its product by the conjugate, the larger input's shape.
  kRopeQk,
  // PyTorch's scaled_dot_product_attention on separate q, k and v [rows, heads x head_dim] with
  // its flash kernel (aten._scaled_dot_product_flash_attention, GQA without repeating K/V): keeps
  // the output and the fp32 logsumexp [batch, heads, seq]; backward reads q, k, v and both.
  // Backward scratch, FlashAttention-2's mha_bwd as PyTorch builds it: the fp32 dQ accumulator,
  // the fp32 rowsum(dO x O), and under GQA dK and dV expanded to every query head in bf16 before
  // they are summed per K/V head.
  kSdpa,
  // F.silu and the elementwise product as PyTorch ops on their own tensors: silu's backward reads
  // its input; the product's reads both inputs.
  kSilu,
  kMul,
  // nn.RMSNorm(head_dim) on one tensor of heads, q's or k's ([rows, heads x head_dim]; torchtitan's
  // qwen3 q_norm and k_norm): PyTorch's fused kernel per head, keeping its input and one fp32
  // 1/rms per row and head ([rows, heads]); a head_dim weight, replicated over TP, its gradient a
  // partial sum over the TP ranks' heads.
  kHeadRmsNorm,
  // torchtitan's qwen3 apply_rotary_emb: (x * cos) + (rotate_half(x) * sin) of q (input 0) and k
  // (input 1) in bf16 ops, heads of attrs.head_dim, rotate_half pairing features i and
  // i + head_dim / 2. Autograd keeps nothing (cos and sin are buffers). Forward scratch: the two
  // bf16 products of the larger input (q's are freed before k's are made); backward: the same.
  kRopeHalfQk,
  // torchao's float8 tensor parallelism as torchtitan applies it to a decoder layer (tensorwise
  // recipe; torchtitan 238fa99, models/llama3/infra/parallelize.py, apply_tp; pytorch/ao 36027d8,
  // torchao/float8/float8_tensor_parallel.py; planner/graph/float8.cpp has the steps).
  // PrepareFloat8ModuleInput: this rank's sequence shard [rows, features] cast to e4m3 (its max
  // all-reduced over TP: a DTensor's partial max), then all-gathered over TP as float8 bytes.
  // Output 0: the gathered e4m3 [group x rows, features]; output 1: its 0-dim fp32 scale (made by
  // the cast, shared by the gathered tensor). Backward: the bf16 gradient of output 0 (a float8
  // tensor's gradient is bf16: _ToFloat8ConstrFunc passes it through) reduce-scattered.
  kFp8AllGather,
  // Float8ColwiseParallel's linear: its input the float8 tensor above (input 0) and its scale
  // (input 1), which it saves uncast; weight (out/tp, in). Backward: the output's bf16 gradient
  // cast to e5m2 first (NoopFwToFloat8BwDynamic, its max all-reduced over TP), then the linear's
  // backward on float8 operands; the input's gradient in bf16.
  kFp8ColumnLinear,
  // Float8RowwiseParallel's linear with its reduce-scatter: the input [rows, in/tp] cast to e4m3
  // (max all-reduced over TP), kept as outputs 1 (e4m3) and 2 (its scale) for backward, which
  // reads no bf16 input; the partial product reduce-scattered into output 0 [rows / group, out].
  // Backward: output 0's bf16 gradient cast to e5m2 on the sequence shard (max all-reduced) and
  // all-gathered as float8 bytes, then the linear's backward; the input's gradient in bf16.
  kFp8RowLinear,
  // Transformer Engine's float8 linears as Megatron's TE layer spec builds them (te_fp8; Hopper's
  // layouts: cuBLAS takes float8 GEMMs in TN form only, so each operand a GEMM reads transposed
  // is a second, transposed copy; read from NVIDIA/TransformerEngine d0067d0,
  // transformer_engine/pytorch/module/layernorm_linear.py, linear.py, base.py
  // grad_output_preprocess, distributed.py _all_gather_fp8, tensor/float8_tensor.py).
  // TELayerNormColumnParallelLinear's GEMM: its norm writes float8 (the norm's attrs.fp8; under
  // SP the shard, rowwise, then all-gathered as float8 bytes), input 0 the float8 operand
  // [rows, in]; weight (out/tp, in) as a column linear's. The norm made it with its transpose
  // where no all-gather follows (attrs.fp8_transpose): the linear's forward holds the rowwise
  // copy as its scratch and keeps the transposed one for the weight gradient (the same bytes as
  // input 0, which stands for it). Under SP the shard is kept and gathered again in backward
  // (the gather's re-run), and the backward transposes the gathered copy (a scratch). Backward
  // scratch: the output gradient cast to float8 with its transpose; the input's gradient bf16.
  kTeColumnLinear,
  // TERowParallelLinear with its reduction: the bf16 input [rows, in/tp] cast to float8 with
  // its transpose (the rowwise copy a forward scratch, the transposed one output 1, kept for the
  // weight gradient; backward reads no bf16 input), the GEMM's bf16 partial product, then
  // reduce-scattered over TP under SP (the partial a scratch; output 0 [rows / group, out]) or
  // all-reduced in place. Backward: under SP the output gradient's shard cast to float8 and
  // all-gathered as float8 bytes into a copy with its transpose, else cast with its
  // transpose; the input's gradient bf16.
  kTeRowLinear,
  kCount
};

struct TensorType {
  std::vector<int64_t> shape;
  Dtype dtype = Dtype::kBf16;
  int64_t elements() const;
  int64_t bytes() const { return elements() * dtype_bytes(dtype); }
};

// What distinguishes one op instance of a kind; all sizes are this rank's (already sharded).
struct OpAttrs {
  int64_t features = 0;        // output features (linears, router, experts, embeddings)
  int64_t rows = 0;            // table rows (embeddings: vocab/tp or max positions)
  int64_t group = 1;           // collective group size
  int64_t batch = 0, seq = 0;  // micro-batch and full sequence (attention)
  int64_t heads = 0, kv_heads = 0, head_dim = 0;  // this rank's heads
  int64_t v_head_dim = 0;  // attention: the values' head dim when apart from head_dim (MLA)
  int64_t v_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }  // the values' head dim
  int64_t rope_dim = 0;    // MLA: the rotated last features of each q and k head
  int64_t experts = 0, top_k = 0;                 // local experts, routed experts per token
  RouterSpec router;  // kRouteScores, kRouteTopK; `bias` there: the model has the expert bias
  // MoE with a capacity factor: token slots per expert per source rank (the dispatched tensor is
  // experts x group x capacity rows, each local expert's slots contiguous per source rank);
  // 0: dropless, tokens x top_k rows grouped by expert.
  int64_t capacity = 0;
  bool bias = false;                              // linears: add a bias; LayerNorm always has one
  // Column-parallel outputs that fuse several sharded matrices ([q | k | v], [gate | up]): this
  // rank's width of each, in order. Empty: one matrix.
  std::vector<int64_t> sections;
  std::string tie;  // weights shared with another op of that name (tied embeddings)
  // Cross-entropy: the logits are first cast to an fp32 copy (a forward workspace) and the
  // softmax is computed out of place from it (nanotron's sharded cross-entropy).
  bool fp32_copy = false;
  // Cross-entropy: the backward forms the logits' gradient in a fresh fp32 buffer (a backward
  // workspace of the logits' shape) before casting it. Megatron's native fused loss
  // (--cross-entropy-loss-fusion): its calculate_gradients is torch.compile'd (Megatron-LM
  // 23e00ed, megatron/core/fusions/fused_cross_entropy.py L63-84; jit_fuser in
  // megatron/core/jit.py), and inductor's code for it (PyTorch 2.15, TORCH_LOGS=output_code)
  // does the target update out of place into an fp32 [tokens, V/tp] buffer beside the kept
  // softmax, then writes the bf16 gradient.
  bool fp32_grad = false;
  // Embedding and linears: the weight gradient made whole in bf16 (a backward workspace of the
  // weight's shape) before it is added into the gradient buffer. PyTorch's embedding backward
  // returns a dense [rows, features] gradient, and so do the linears without Megatron's
  // gradient-accumulation fusion; Megatron's DDP hook adds it into main_grad and drops it
  // (Megatron-LM 23e00ed, megatron/core/distributed/distributed_data_parallel.py,
  // _make_backward_post_hook). The bias gradient, also returned whole, is not counted.
  bool dense_wgrad = false;
  // The losses: the weight of this loss in the step's (1; a multi-token prediction depth's:
  // TrainSpec::mtp_loss_scale / depths).
  double loss_weight = 1.0;
  // Column and row linears: torchao's Float8Linear (TrainSpec::fp8), its forward and backward run
  // as the steps of float8_steps.
  Fp8Recipe fp8 = Fp8Recipe::kNone;
  // ... and its weight arrives in float8 from FSDP's float8 all-gather (TrainSpec::fp8_all_gather),
  // with its scale: the steps cast it in neither pass.
  bool fp8_gathered = false;
  // Transformer Engine (te_fp8): the float8 tensor is made with its transpose, as no all-gather
  // follows it (the norms writing float8, kTeColumnLinear); under SP it is made rowwise only,
  // the layout TE's float8 all-gather takes.
  bool fp8_transpose = false;
  // Whether weight w arrives so: a float8 linear's weight (w 0; not its bias). The one statement
  // of the rule for the schedule's FSDP units, the cost model and the executors' weights.
  bool fp8_gathered_weight(size_t w) const {
    return fp8_gathered && fp8 != Fp8Recipe::kNone && w == 0;
  }
};

struct WeightShape {
  const char* suffix;  // "weight" or "bias"
  std::vector<int64_t> shape;
  int64_t elements() const;
};

// How a weight is split over the TP group: the one statement of TP sharding. The graph builder
// reads it (which weights are replicated), the executors' weight init and gradient capture map a
// rank's local elements to global ones with it.
enum class Shard : uint8_t {
  kReplicated,   // norms, routers, learned positions, row-parallel biases, the shared-expert gate
  kRows,         // dim 0 in contiguous blocks per rank (vocab-parallel embedding and LM head)
  kSectionRows,  // dim 0 per fused section ([q | k | v], [gate | up]) and the matching bias
  kColumns,      // the last dim in contiguous blocks (row-parallel linear's weight)
  kExpertSectionRows,  // per expert (dim 0): dim 1 per fused section
  kExpertColumns,      // per expert (dim 0): the last dim in contiguous blocks
};
const char* name_of(Shard s);
Shard weight_shard(OpKind kind, std::string_view suffix);

// Bytes of a tensor of this type, or -1 when the count does not fit in 63 bits (checked
// arithmetic, for plans and setups read from files).
int64_t checked_bytes(const TensorType& t);

struct OpInfo {
  OpKind kind;
  const char* name;
  int num_inputs;
  int num_outputs;
  unsigned bwd_reads_inputs;   // bit i: backward reads input i
  unsigned bwd_reads_outputs;  // bit j: backward reads output j
  unsigned grad_inputs;        // bit i: input i receives a gradient
  unsigned grad_outputs;       // bit j: output j carries a gradient
  bool collective;
  std::vector<TensorType> (*infer)(const OpAttrs&, std::span<const TensorType> in);
  double (*flops)(const OpAttrs&, std::span<const TensorType> in);  // forward FLOPs
  std::vector<WeightShape> (*weights)(const OpAttrs&, std::span<const TensorType> in);
  std::vector<TensorType> (*bwd_workspace)(const OpAttrs&, std::span<const TensorType> in);
  // Scratch of the forward that lives in device memory (nullptr: none), freed after the op.
  std::vector<TensorType> (*fwd_workspace)(const OpAttrs&,
                                           std::span<const TensorType> in) = nullptr;
};

// One step of an op whose forward or backward is eager code with temporaries that die between
// its calls (torchao's Float8Linear: each cast to float8 is abs, max, a scale, an fp32 copy, its
// product by the scale, the saturating clamp and the float8 result, each a PyTorch op that frees
// what the next no longer needs). A step allocates its temporaries (workspaces), in order; reads
// some earlier ones (by their index among the op's temporaries, in allocation order); and may
// allocate the op's results. A temporary dies after the last step that allocates or reads it.
// The schedule emits step 0 as the op's instruction and every further step as a kStep
// instruction; an executor's kernel runs once and passes from step to step (OpContext::step).
struct OpStep {
  std::vector<TensorType> temps;
  std::vector<int> reads;
  unsigned results = 0;  // kStepResults and kStepWeightGrads
  // Outputs (by index) this step allocates before kStepResults allocates the rest: a float8
  // cast's scale and float8 tensor where they are the op's outputs (kFp8AllGather, kFp8RowLinear).
  std::vector<int> outputs;
  // Backward: from this step on the op's output gradients are not read (freed after the step
  // before): NoopFwToFloat8BwDynamic's cast ends its backward, and autograd drops the bf16
  // gradient before the linear's backward runs.
  bool drops_grad_outputs = false;
  // Temporaries (indices among the op's) that torchtitan's per-op checkpointing keeps for the
  // recompute (outputs of ops on its save list, a float8 cast's aten.max): under that policy a
  // re-run op's forward keeps them to its recompute, which takes them in place of allocating.
  std::vector<int> sac_kept;
  // The float8 cast whose scale this step makes takes its max across TP (fp8_max_over_tp): the
  // bytes of that max (bf16), all-reduced; 0: a max of the rank's own.
  int64_t tp_max_bytes = 0;
};
// The forward's outputs, or the backward's input gradients; FSDP2's bf16 weight gradients.
inline constexpr unsigned kStepResults = 1, kStepWeightGrads = 2;
// torchao's Float8Linear under plain TP (torchtitan's ColwiseParallel and RowwiseParallel: the LM
// head, and every linear under the rowwise recipes) casts DTensor shards: the input x [R, K], the
// weight W [N, K] and the output gradient G [R, N], a column linear's N split over TP, a row
// linear's K (the input and G replicated otherwise: gathered before the column linear, the row
// linear's output gradient gathered by its reduction's backward). A cast's max over a split
// dimension is DTensor's partial max, reduced across the TP group; over unsplit ones it is the
// rank's own. The scale's axis names what one scale covers: the whole tensor, a row ([rows, 1],
// the max over the columns) or a column ([1, cols], over the rows), in the operand's layout above.
enum class Fp8Operand : uint8_t { kInput, kWeight, kGradOutput };
enum class Fp8ScaleAxis : int { kTensor, kRows, kCols };
bool fp8_max_over_tp(OpKind kind, int64_t tp, Fp8Operand operand, Fp8ScaleAxis axis);

// The steps of an op's forward or backward; empty: it runs as one step with its workspaces.
std::vector<OpStep> op_steps(const OpInfo& info, const OpAttrs& attrs,
                             std::span<const TensorType> in, bool forward);
// The largest bytes of temporaries and results live at once in a stepped pass, less the results'
// bytes (`results`): the workspace that, allocated with the results, peaks as the steps do.
int64_t steps_peak_workspace(const std::vector<OpStep>& steps, int64_t results);
// ... where the results are the op's outputs, of these bytes, some allocated early (OpStep::outputs).
int64_t steps_peak_workspace(const std::vector<OpStep>& steps, const std::vector<int64_t>& outputs);
// A tensor's gradient bytes: a float8 tensor's gradient is bf16 (torchao's _ToFloat8ConstrFunc
// passes the high-precision gradient through), every other tensor's is its own dtype.
int64_t grad_bytes(const TensorType& t);
inline bool is_float8(Dtype d) { return d == Dtype::kFp8E4m3 || d == Dtype::kFp8E5m2; }

// The forward scratch of an op (empty for most).
std::vector<TensorType> forward_workspace(const OpInfo& info, const OpAttrs& attrs,
                                          std::span<const TensorType> in);

const OpInfo& op_info(OpKind kind);
bool is_norm(OpKind kind);  // the norm kinds (every profile's)
bool is_loss(OpKind kind);  // the loss kinds: the block's root, their output 0 the per-token loss
const char* name_of(OpKind kind);
// Backward FLOPs: twice the forward for ops with weights (input and weight gradients) and for the
// attention matmuls (two GEMMs each), once otherwise (Korthikanti et al.'s 3x forward convention).
double backward_flops(const OpInfo& info, const OpAttrs& attrs, std::span<const TensorType> in);

}  // namespace np
