// The CUDA backend's kernels, one file per op family (executor/cuda/*.cu), as host functions on
// device tensors: bf16 or fp32 storage as the tensor says, fp32 arithmetic. Each returns after
// enqueuing its work on `stream`. The same sources compile with nvcc and, for tests, with the host
// compiler against the emulation (executor/cuda/emu/).
#pragma once
#include "executor/cuda/compat.hpp"
#include "executor/tensor.hpp"

namespace np::cuda {

using exec::Tensor;

// y = x / sqrt(mean(x^2) + eps) * w, per row of x (rows x h); w has h elements. rstd (fp32, one
// per row; null: not kept) receives each row's 1/rms (kRmsNormStats' second output).
void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor* rstd,
                     float eps, cudaStream_t stream);
// dx (=, or += when accumulate) and dw += for the rows of x, dw a deterministic column sum. rstd
// (fp32, one per row) holds each row's 1/rms when the forward kept it (saved); else it is the op
// table's backward workspace and receives the recomputed values.
void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                      bool accumulate, const Tensor& dw, const Tensor& rstd, bool saved,
                      float eps, cudaStream_t stream);
// LayerNorm: y = (x - mean) / sqrt(var + eps) * w + b per row, mean and rstd kept as RMSNorm's
// rstd (both null: not kept); its backward as RMSNorm's, with db += the column sums of dy.
void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                       const Tensor* mean, const Tensor* rstd, float eps, cudaStream_t stream);
void layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                        bool accumulate, const Tensor& dw, const Tensor& db, const Tensor& mean,
                        const Tensor& rstd, bool saved, float eps, cudaStream_t stream);
// Qwen3's q/k norms on rows [q | k | v] of q_heads + 2 kv_heads heads (head_dim = wq's size):
// RMSNorm of each q head with wq and each k head with wk, v copied; rstd (fp32) receives one
// 1/rms per row and normalised head. Backward from the kept rstd: dx (=, or += when accumulate),
// the values' gradient passed through; dwq and dwk += deterministic sums in (row, head) order.
void qk_norm_forward(const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& y,
                     const Tensor& rstd, long long q_heads, long long kv_heads, float eps,
                     cudaStream_t stream);
void qk_norm_backward(const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& dy,
                      const Tensor& dx, bool accumulate, const Tensor& dwq, const Tensor& dwk,
                      const Tensor& rstd, long long q_heads, long long kv_heads,
                      cudaStream_t stream);
// The same as PyTorch ops (transformers' Qwen3RMSNorm per head, the hf profile): a = fp32 of the
// q and k columns ([rows, (q_heads + kv_heads) x head_dim]), r one 1/rms per row and head, b =
// a x r (fp32 scratch), c = b rounded to y's dtype, y = w x c, v copied. Backward from a, r, c:
// db = dy w, da = db r - a r^3 mean(db a) (fp32 workspaces), dx (=, or +=) = da and dy's v part,
// dwq and dwk += sums of dy c in (row, head) order.
void qk_norm_hf_forward(const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& y,
                        const Tensor& a, const Tensor& r, const Tensor& b, const Tensor& c,
                        long long q_heads, long long kv_heads, float eps, cudaStream_t stream);
void qk_norm_hf_backward(const Tensor& a, const Tensor& r, const Tensor& c, const Tensor& wq,
                         const Tensor& wk, const Tensor& dy, const Tensor& db, const Tensor& da,
                         const Tensor& dx, bool accumulate, const Tensor& dwq, const Tensor& dwk,
                         long long q_heads, long long kv_heads, cudaStream_t stream);
// dst[c] += sum over the first `rows` rows of src (rows x dst.numel()), rows in order.
void column_sums_add(const Tensor& src, long long rows, const Tensor& dst, cudaStream_t stream);
// GeLU (tanh approximation) and its backward (dx =, or += when accumulate).
void gelu_forward(const Tensor& x, const Tensor& y, cudaStream_t stream);
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate,
                   cudaStream_t stream);
// out = a + b, elementwise.
void add(const Tensor& a, const Tensor& b, const Tensor& out, cudaStream_t stream);
// t *= f elementwise, in place.
void scale(const Tensor& t, float f, cudaStream_t stream);
// t += v elementwise (gradient accumulation), rounding once to t's dtype.
void accumulate(const Tensor& t, const Tensor& v, cudaStream_t stream);
// SwiGLU on x = [gate | up] (rows x 2f): y = silu(gate) * up (rows x f).
void swiglu_forward(const Tensor& x, const Tensor& y, cudaStream_t stream);
// dx (=, or += when accumulate) for dy.
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate,
                     cudaStream_t stream);
// RMSNorm as PyTorch ops (Hugging Face's): a = fp32(x), r = 1/rms per row, b = a * r (fp32
// scratch), c = b rounded to y's dtype, y = w * c. Backward from a, r, c: db = dy * w, da =
// db * r - a r^3 mean(db * a) (both fp32 workspaces), dx (=, or +=) = da, dw += sum_rows dy * c.
void rmsnorm_hf_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& a,
                        const Tensor& r, const Tensor& b, const Tensor& c, float eps,
                        cudaStream_t stream);
void rmsnorm_hf_backward(const Tensor& a, const Tensor& r, const Tensor& c, const Tensor& w,
                         const Tensor& dy, const Tensor& db, const Tensor& da, const Tensor& dx,
                         bool accumulate, const Tensor& dw, cudaStream_t stream);
// Hugging Face's repeat_kv on rows [q | k | v] (q_heads + 2 kv_heads heads of head_dim): y =
// [q | k | v] with each K and V head repeated for its q_heads / kv_heads query heads. Backward:
// dx (=, or +=) = dy's q part and the sums of the repeats, in head order.
void repeat_kv_forward(const Tensor& x, const Tensor& y, long long q_heads, long long kv_heads,
                       long long head_dim, cudaStream_t stream);
void repeat_kv_backward(const Tensor& dy, const Tensor& dx, bool accumulate, long long q_heads,
                        long long kv_heads, long long head_dim, cudaStream_t stream);
// The unfused GLU on x = [gate | up] (rows x 2f): a = silu(gate) (rows x f); its backward writes
// (or, when accumulate, adds to) the gate half of dx, and zeroes the up half when it writes.
void glu_act_forward(const Tensor& x, const Tensor& y, cudaStream_t stream);
void glu_act_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate,
                      cudaStream_t stream);
// y = a * up; da = dy * up and the up half of dx = dy * a (its gate half zeroed when it writes).
void glu_mul_forward(const Tensor& a, const Tensor& x, const Tensor& y, cudaStream_t stream);
void glu_mul_backward(const Tensor& a, const Tensor& x, const Tensor& dy, const Tensor& da,
                      bool accumulate_a, const Tensor& dx, bool accumulate_x, cudaStream_t stream);
// y = x W^T (+ bias) through cuBLAS; x [rows, in], W [out, in], y [rows, out].
void linear_forward(cublasHandle_t h, const Tensor& x, const Tensor& w, const Tensor* bias,
                    const Tensor& y, cudaStream_t stream);
// dx (=, or += when add_dx; none when dx is null) = dy W, dW += dy^T x, db += column sums.
// dense (bf16, W's shape): dy^T x is written there first, then added into dW (Megatron without
// gradient-accumulation fusion).
void linear_backward(cublasHandle_t h, const Tensor& x, const Tensor& w, const Tensor& dy,
                     const Tensor* dx, bool add_dx, const Tensor& dw, const Tensor* db,
                     cudaStream_t stream, const Tensor* dense = nullptr);
// A row-major matrix operand of gemm_rows: element (r, c) of batch item i at
// p + i * stride + r * ld + c (elements of bf16 or fp32); trans: the operand is the transpose.
struct MatArg {
  void* p;
  bool bf16;
  long long ld, stride = 0;
  bool trans = false;
};
// C (m x n) = op(A) (m x k) op(B) (k x n) + beta C for `batch` items, row-major, through cuBLAS
// (fp32 accumulation). A and B must share a dtype (cuBLAS's rule).
void gemm_rows(cublasHandle_t h, long long m, long long n, long long k, const MatArg& a,
               const MatArg& b, const MatArg& c, float beta, long long batch, cudaStream_t stream);
// Multi-head latent attention's [q | k | v] rows (the CPU reference's mla_rope): heads of q/k
// width head_dim whose last rope_dim features are rotated (q from its own, k from the one shared
// RoPE part of the token), k's content and v (v_head_dim) from the kv up-projection's sections;
// rows at global positions (first_row + t) / batch. The backward is the transpose: rotations by
// -angle, the heads' RoPE-part gradients summed in head order; every gradient written (=).
struct MlaShape {
  long long heads, head_dim, rope_dim, v_head_dim, first_row, batch;
};
void mla_rope_forward(const Tensor& q, const Tensor& kv, const Tensor& pe, const Tensor& out,
                      const MlaShape& m, cudaStream_t stream);
void mla_rope_backward(const Tensor& g, const Tensor& dq, const Tensor& dkv, const Tensor& dpe,
                       const MlaShape& m, cudaStream_t stream);
// Rotary embedding of the q and k heads of qkv rows ([q | k | v] of this rank's heads, head_dim
// d): position of row t is (first_row + t) / batch; sign -1 applies the inverse (the backward).
void rope(const Tensor& in, const Tensor& out, long long q_heads, long long kv_heads,
          long long head_dim, long long first_row, long long batch, float sign,
          cudaStream_t stream);

// torchtitan's ops (the CPU reference's silu, mul, rope_qk, rope_half_qk, head_rmsnorm):
// y = silu(x); its backward dx (=, or += when accumulate) = dy (s + x s (1 - s)), s = sigmoid(x).
void silu_forward(const Tensor& x, const Tensor& y, cudaStream_t stream);
void silu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate,
                   cudaStream_t stream);
// y = a b elementwise; da = dy b, db = dy a (each =, or += when its flag says).
void mul_forward(const Tensor& a, const Tensor& b, const Tensor& y, cudaStream_t stream);
void mul_backward(const Tensor& a, const Tensor& b, const Tensor& dy, const Tensor& da,
                  bool accumulate_a, const Tensor& db, bool accumulate_b, cudaStream_t stream);
// Rotary embedding of every head of head_dim d in rows [heads x d] (no values), pairing features
// 2i and 2i + 1 (adjacent: torchtitan's complex form) or i and i + d / 2 (the rotate-half form);
// position and sign as rope's. out may be fp32 or bf16, and may alias in.
void rope_heads(const Tensor& in, const Tensor& out, long long head_dim, bool adjacent,
                long long first_row, long long batch, float sign, cudaStream_t stream);

// One AdamW step (Loshchilov and Hutter 2019, with bias corrections; step is 0-based) over a flat
// parameter group: fp32 master weights and moments, the gradient in its own dtype.
void adamw_step(const Tensor& grad, const Tensor& master, const Tensor& m, const Tensor& v,
                float lr, float beta1, float beta2, float eps, float weight_decay, int step,
                cudaStream_t stream);
// master -= lr * grad.
void sgd_step(const Tensor& grad, const Tensor& master, float lr, cudaStream_t stream);
// Columns [dst_col0, dst_col0 + cols) of every row of dst = (or, acc, +=) columns [src_col0, ...)
// of the same rows of src, converting between bf16 and fp32.
void copy_columns(const Tensor& dst, long long dst_col0, const Tensor& src, long long src_col0,
                  long long cols, bool acc, cudaStream_t stream);
// dst[dst_offset + i] = src[src_offset + i] for i < n, converting between bf16 and fp32.
void copy_elements(const Tensor& dst, long long dst_offset, const Tensor& src,
                   long long src_offset, long long n, cudaStream_t stream);

// Causal self-attention with GQA on qkv rows [q heads | k heads | v heads] (row t = pos * batch
// + b), keeping only the output [s*b, q_heads*head_dim] and the fp32 logsumexp [b, q_heads, s].
struct AttentionShape {
  long long batch, seq, q_heads, kv_heads, head_dim;
  long long v_head_dim = 0;  // the values' head dim (MLA), at most head_dim; 0: head_dim
};
void flash_attention_forward(const AttentionShape& a, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse, cudaStream_t stream);
// The gradient of qkv (=, or += when accumulate), with the op table's fp32 workspaces: dq
// [s*b, q_heads*head_dim] and rowsum [b, q_heads, s].
void flash_attention_backward(const AttentionShape& a, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const Tensor& dout, const Tensor& dqkv,
                              bool accumulate, const Tensor& dq, const Tensor& rowsum,
                              cudaStream_t stream);
// The same on separate q [s*b, q_heads*head_dim], k and v [s*b, kv_heads*head_dim] (PyTorch's
// scaled_dot_product_attention, the torchtitan profile), with a gradient per input (=, or +=
// when its flag says) and the same workspaces.
void sdpa_forward(const AttentionShape& a, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& out, const Tensor& lse, cudaStream_t stream);
void sdpa_backward(const AttentionShape& a, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& gq,
                   bool acc_q, const Tensor& gk, bool acc_k, const Tensor& gv, bool acc_v,
                   const Tensor& dq, const Tensor& rowsum, cudaStream_t stream);

// Eager attention's softmax over {b, heads, s, s} scores: probs = causal softmax(scores /
// sqrt(head_dim)) along the last dim, 0 above the diagonal; the backward reads probs only.
void causal_softmax_forward(const Tensor& scores, const Tensor& probs, long long head_dim,
                            cudaStream_t stream);
void causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dscores,
                             bool accumulate, long long head_dim, cudaStream_t stream);
// Eager attention's GEMMs on qkv rows (as flash attention's), per batch and key-value head
// group through cuBLAS: scores {b, q_heads, s, s} = Q K^T, unscaled, 0 above the diagonal;
// context [s*b, q_heads*head_dim] = P V. Backward: dqkv (=, or += when accumulate) gets the Q
// and K columns (scores) or the V columns (context), and dprobs = dO V^T below the diagonal, 0
// above. The gradients above the diagonal of scores and of probs are read as 0 (the causal
// softmax writes 0 there).
void attn_scores_forward(cublasHandle_t h, const AttentionShape& a, const Tensor& qkv,
                         const Tensor& scores, cudaStream_t stream);
void attn_scores_backward(cublasHandle_t h, const AttentionShape& a, const Tensor& qkv,
                          const Tensor& dscores, const Tensor& dqkv, bool accumulate,
                          cudaStream_t stream);
void attn_context_forward(cublasHandle_t h, const AttentionShape& a, const Tensor& probs,
                          const Tensor& qkv, const Tensor& out, cudaStream_t stream);
void attn_context_backward(cublasHandle_t h, const AttentionShape& a, const Tensor& probs,
                           const Tensor& qkv, const Tensor& dout, const Tensor& dprobs,
                           bool accumulate_probs, const Tensor& dqkv, bool accumulate_qkv,
                           cudaStream_t stream);
// Vocabulary-parallel token embedding: out[t] = W[id - tp_rank * vocab_shard] where this rank's
// shard holds the id, else 0.
void embedding_forward(const Tensor& ids, const Tensor& w, const Tensor& out, long long tp_rank,
                       cudaStream_t stream);
// dW[id - tp_rank * vocab_shard] += dy[t] for the tokens of this shard, each row's tokens in
// order (deterministic).
void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dw, long long tp_rank,
                        cudaStream_t stream);
// Learned positions: out[t] = x[t] + W[(first_row + t) / batch]; the backward adds each
// position's rows (in row order) into dW. The input gradient is dy itself (the caller's).
void pos_embedding_forward(const Tensor& x, const Tensor& w, const Tensor& out, long long first_row,
                           long long batch, cudaStream_t stream);
void pos_embedding_backward(const Tensor& dy, const Tensor& dw, long long first_row,
                            long long batch, cudaStream_t stream);
// Vocabulary-parallel cross-entropy in stages; between them the caller takes the maximum of mx
// over the TP group, then sums sum and target_logit over it:
//   max:      mx[t] = max_j logits[t][j] (this rank's shard)
//   exp_sum:  softmax[t][j] = exp(logits - mx), sum[t] = its row sum, target_logit[t] on the owner
//   finalize: softmax /= sum, loss[t] = log(sum) + mx - target_logit; with log_probs_of (the
//             logits): softmax = logits - mx - log(sum), the log-probabilities, instead
void cross_entropy_max(const Tensor& logits, const Tensor& mx, cudaStream_t stream);
void cross_entropy_exp_sum(const Tensor& logits, const Tensor& targets, const Tensor& mx,
                           const Tensor& softmax, const Tensor& sum, const Tensor& target_logit,
                           long long tp_rank, cudaStream_t stream);
void cross_entropy_finalize(const Tensor& softmax, const Tensor& sum, const Tensor& mx,
                            const Tensor& target_logit, const Tensor& loss,
                            const Tensor* log_probs_of, cudaStream_t stream);
// Transformer Engine's loss keeps no softmax (exp_sum with an empty softmax tensor): te_finalize
// writes loss[t] and stats[t] = {mx, log(sum)}; te_backward forms dlogits (=, or +=) =
// (exp(logits - mx - log(sum)) - onehot(target)) * loss_scale from the logits and the stats.
void cross_entropy_te_finalize(const Tensor& sum, const Tensor& mx, const Tensor& target_logit,
                               const Tensor& loss, const Tensor& stats, cudaStream_t stream);
void cross_entropy_te_backward(const Tensor& logits, const Tensor& stats, const Tensor& targets,
                               const Tensor& dlogits, bool accumulate, long long tp_rank,
                               float loss_scale, cudaStream_t stream);
// dlogits (=, or +=) = (softmax - onehot(target)) * loss_scale. With nll_grad (fp32, PyTorch's
// log-softmax backward): softmax holds log-probabilities, nll_grad receives -loss_scale at the
// target and dlogits nll_grad + exp(log p) * loss_scale.
void cross_entropy_backward(const Tensor& softmax, const Tensor& targets, const Tensor& dlogits,
                            bool accumulate, long long tp_rank, float loss_scale,
                            const Tensor* nll_grad, cudaStream_t stream);

// How dropout numbers an element globally (executor/rng.cpp's index): rows of `width` starting
// at global row `first_row`, or attention probabilities {b, heads_local, s, s} of TP rank
// `tp_rank` of `tp`.
struct DropoutLayout {
  bool probs = false;
  long long width = 0, first_row = 0;             // rows
  long long heads_local = 0, seq = 0, tp = 1, tp_rank = 0;  // probabilities
};
// out = x / (1 - p) where u(seed, stream_id, index) >= p, else 0; mask (u8) records the choice.
void dropout_forward(const Tensor& x, const Tensor& out, const Tensor& mask, float p,
                     unsigned long long seed, unsigned long long stream_id,
                     const DropoutLayout& layout, cudaStream_t stream);
void dropout_backward(const Tensor& dy, const Tensor& mask, const Tensor& dx, bool accumulate,
                      float p, cudaStream_t stream);

// Mixture of experts (executor/cuda/moe.cu). Routing indices are i64 [tokens, top_k]; item
// i = t * top_k + j goes to the expert-major row of the CPU reference (rows grouped by expert,
// items ascending within an expert).
// Per token: the top_k fp32 logits (ties: the lower expert first) and the softmax over them.
void topk_forward(const Tensor& logits, const Tensor& probs, const Tensor& idx, cudaStream_t stream);
// dlogits (fp32 [tokens, experts], =, or +=): p_j (g_j - sum_i p_i g_i) at the chosen experts.
void topk_backward(const Tensor& probs, const Tensor& idx, const Tensor& dprobs,
                   const Tensor& dlogits, bool accumulate, cudaStream_t stream);
// DeepSeek's and Qwen2-MoE's routing (spec.hpp, RouterSpec; the CPU reference's
// route_scores and route_topk, executor/cpu/moe.cpp). Scores: sigmoid, or the softmax over the
// experts, of fp32 logits; backward dlogits (=, or +=) from the kept scores.
void route_scores_forward(const Tensor& logits, const Tensor& scores, bool sigmoid,
                          cudaStream_t stream);
void route_scores_backward(const Tensor& scores, const Tensor& dscores, const Tensor& dlogits,
                           bool accumulate, bool sigmoid, cudaStream_t stream);
// The top-k's forward scratch ([tokens, experts] fp32 each, nullptr when the op has none): the
// biased scores (with an expert bias), the group mask and the masked scores (with groups).
struct RouteScratch {
  const Tensor *biased = nullptr, *mask = nullptr, *masked = nullptr;
};
// The group-limited top-k of scores (+ bias, [experts] fp32, nullptr: none), the chosen scores
// renormalised and scaled; backward dscores (=, or +=) at the chosen experts.
void route_topk_forward(const Tensor& scores, const Tensor* bias, const RouteScratch& scratch,
                        const RouterSpec& r, const Tensor& probs, const Tensor& idx,
                        cudaStream_t stream);
void route_topk_backward(const Tensor& scores, const Tensor& idx, const Tensor& dprobs,
                         const RouterSpec& r, const Tensor& dscores, bool accumulate,
                         cudaStream_t stream);
// The router's backward: its output gradient is fp32, its weights bf16 (cuBLAS does not mix
// input types): dx (=, or +=) = dy W, dW += dy^T x, db += column sums.
void router_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                     bool accumulate, const Tensor& dw, const Tensor* db, cudaStream_t stream);
// The routing layouts (moe.cu): dropless (capacity 0), rows grouped by expert; with a capacity C
// per expert, C slots each (choices past them dropped, unused slots zero).
// xe[row(t, j)] = x[t]; the backward dx[t] (=, or +=) sum_j dxe[row(t, j)], j ascending.
void moe_dispatch_forward(const Tensor& x, const Tensor& idx, const Tensor& xe, long long experts,
                          long long capacity, cudaStream_t stream);
void moe_dispatch_backward(const Tensor& dxe, const Tensor& idx, const Tensor& dx, bool accumulate,
                           long long experts, long long capacity, cudaStream_t stream);
// out[t] = sum_j probs[t, j] ye[row(t, j)], j ascending; the backward: dye[row(t, j)] = probs[t,
// j] dout[t] and dprobs[t, j] = ye[row(t, j)] . dout[t] (each =, or += when accumulating).
void moe_combine_forward(const Tensor& ye, const Tensor& probs, const Tensor& idx, const Tensor& out,
                         long long experts, long long capacity, cudaStream_t stream);
void moe_combine_backward(const Tensor& ye, const Tensor& probs, const Tensor& idx, const Tensor& dout,
                          const Tensor& dye, bool accumulate_ye, const Tensor& dprobs,
                          bool accumulate_probs, long long experts, long long capacity,
                          cudaStream_t stream);
// The grouped expert GEMMs, one cuBLAS GEMM per expert over its rows (sizes from the routing
// indices, copied to the host): out = xe W_e^T with W {experts, out, in}; the backward dx (=, or
// +=) and dW_e +=.
void expert_forward(cublasHandle_t h, const Tensor& xe, const Tensor& idx, const Tensor& w,
                    const Tensor& out, long long capacity, cudaStream_t stream);
void expert_backward(cublasHandle_t h, const Tensor& xe, const Tensor& idx, const Tensor& w,
                     const Tensor& dy, const Tensor& dx, bool accumulate, const Tensor& dw,
                     long long capacity, cudaStream_t stream);
// The shared expert's gate: out = sigmoid(x . w) y per row; the backward dy = s g, dx = dz w with
// dz = (g . y) s (1 - s) kept per row in the fp32 workspace dz (the op table's), dw += sum_t dz x.
void shared_gate_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& out,
                         cudaStream_t stream);
void shared_gate_backward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dout,
                          const Tensor& dx, bool accumulate_x, const Tensor& dy, bool accumulate_y,
                          const Tensor& dw, const Tensor& dz, cudaStream_t stream);

// t[i] = value for every element.
void fill(const Tensor& t, float value, cudaStream_t stream);

}  // namespace np::cuda
