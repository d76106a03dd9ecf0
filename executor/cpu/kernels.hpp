// Internal to the CPU backend: the kernel entry points of each op family, and the helpers they
// share (staging bf16/fp32 tensors into aligned fp32 Eigen matrices, writing or accumulating the
// results with one rounding, allocating through the context).
#pragma once
#include <Eigen/Dense>
#include <cstdint>
#include <span>
#include <vector>

#include "executor/backend.hpp"

namespace np::exec::cpu {

// Row-major fp32 staging matrix. Eigen's aligned storage keeps the GEMMs' summation order
// independent of where the device-model buffers happen to lie (bitwise-deterministic recompute).
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using Ins = std::span<const Tensor>;
using Outs = std::vector<Tensor>;

struct Env {
  const OpContext& ctx;
  Dtype
      act;  // the dtype of what the op table stores as activations: bf16 (fp32 in gradient checks)

  const OpAttrs& attrs() const { return ctx.op->attrs; }
  Tensor alloc(const TensorType& type, AllocRole role) const;
  Tensor output(std::vector<int64_t> shape, Dtype dtype) const {
    return alloc({std::move(shape), dtype}, AllocRole::kOutput);
  }
  Tensor workspace(std::vector<int64_t> shape, Dtype dtype) const {
    return alloc({std::move(shape), dtype}, AllocRole::kWorkspace);
  }
  // A workspace the per-op checkpointing's cache may hold (OpContext::kept).
  Tensor kept(std::vector<int64_t> shape, Dtype dtype) const {
    if (!ctx.kept) return workspace(std::move(shape), dtype);
    TensorType type{std::move(shape), dtype};
    Tensor t = ctx.kept(type);
    t.type = type;
    return t;
  }
  // Global index of the first row of a token tensor with `rows` rows: 0 when it holds the full
  // sequence (s*b rows), else ctx.token_offset (a sequence shard).
  int64_t first_row(int64_t rows) const;
  int64_t batch() const { return ctx.setup->micro_batch; }
  int64_t tp_size() const { return ctx.comm ? ctx.comm->tp_size() : 1; }
  Communicator& comm() const;  // throws when the context has none
};

[[noreturn]] void fail(const std::string& what);
void check(bool ok, const char* what);
int64_t dim(const Tensor& t, size_t i);
int64_t row_width(const Tensor& t);                      // numel / shape[0]
const Tensor& need(Ins ts, size_t i, const char* what);  // present, else throws
bool is_float(Dtype d);

Mat load_mat(const Tensor& t);  // shape[0] x row_width, as fp32
Mat load_vec(const Tensor& t);  // all elements as one row (1 x numel): norm weights, biases
Mat load_rows(const Tensor& t, int64_t rows, int64_t cols,
              int64_t offset = 0);  // a block of rows*cols elements
void store_mat(const Tensor& t, const Mat& m, int64_t offset = 0);
void add_mat(const Tensor& t, const Mat& m, int64_t offset = 0);  // t += m, rounded once
Mat column_sums(const Mat& m);  // 1 x cols: sums over rows in row order (double), rounded once
// The gradient of input k: accumulated into args.grad_inputs[k] when present, else allocated
// (kGradInput, `type`), written and set there.
void grad_input(const Env& env, const BackwardArgs& args, int k, const TensorType& type,
                const Mat& g);
// A linear's weight gradients: dW += DW, through `dense` where given (dense_wgrad: the weight
// gradient whole in the activation dtype first, then added); db += the column sums of
// `bias_rows` where the op has a bias.
void add_linear_grads(const BackwardArgs& args, Mat DW, const Tensor& dense, const Mat& bias_rows);
// Same for a gradient already held in a tensor of the right dtype (collectives): copies or adds.
void grad_input_tensor(const Env& env, const BackwardArgs& args, int k, const Tensor& g);
// A tensor view of scratch memory outside the device model (collective staging).
struct Scratch {
  std::vector<uint64_t> mem;
  Tensor t;
  explicit Scratch(const TensorType& type);
};

// Where an MoE micro-batch's routed tokens go (the attrs of the dispatch, expert and combine ops):
//  - dropless (capacity 0, ep 1): expert-major, expert e's rows in (t, j) order;
//  - capacity C: token t's j-th choice e takes slot e C + (its place among e's choices in token
//    order), or is dropped (row -1) past C; the send layout is the E experts' C slots each, so
//    EP rank q's experts are block q; after the all-to-all, block s holds source s's slots for
//    this rank's experts (local expert e at rows (s x local + e) C).
struct Routing {
  struct Segment {
    int64_t expert, first, rows;  // a local expert's block of rows of the dispatched tensor
  };
  int64_t tokens = 0, k = 0, rows = 0;  // rows: of the dispatched tensor
  std::vector<int64_t> row;             // tokens x k: the row of (t, j) in the send layout, or -1
  std::vector<Segment> segments;        // the dispatched tensor's rows as this rank holds them
};
Routing routing(const Env& env, const Tensor& idx);

#define NP_CPU_OP(fn)                                     \
  Outs fn##_forward(const Env& env, Ins in, Ins weights); \
  void fn##_backward(const Env& env, const BackwardArgs& args);

// attention.cpp (the others are declared below)
NP_CPU_OP(flash_attention_cp)
// vocab.cpp
NP_CPU_OP(embedding)
NP_CPU_OP(pos_embedding)
NP_CPU_OP(cross_entropy)
NP_CPU_OP(cross_entropy_te)
NP_CPU_OP(cast_fp32)
NP_CPU_OP(log_softmax_loss)
// pointwise.cpp
NP_CPU_OP(rmsnorm)
NP_CPU_OP(layernorm)
NP_CPU_OP(rmsnorm_hf)
NP_CPU_OP(qk_norm)
NP_CPU_OP(qk_norm_hf)
NP_CPU_OP(rope)
NP_CPU_OP(mla_rope)
NP_CPU_OP(rope_qk)
NP_CPU_OP(rope_half_qk)
NP_CPU_OP(head_rmsnorm)
NP_CPU_OP(silu)
NP_CPU_OP(mul)
NP_CPU_OP(dropout)
NP_CPU_OP(swiglu)
NP_CPU_OP(glu_act)
NP_CPU_OP(glu_mul)
NP_CPU_OP(gelu)
NP_CPU_OP(add)
NP_CPU_OP(concat)
// linear.cpp (besides the declarations below)
NP_CPU_OP(replicated_linear)
// collective.cpp
NP_CPU_OP(cp_gather_kv)
NP_CPU_OP(all_gather)
NP_CPU_OP(reduce_scatter)
NP_CPU_OP(all_reduce)
NP_CPU_OP(gather_features)
NP_CPU_OP(scatter_rows)
// linear.cpp
NP_CPU_OP(column_linear)
// float8.cpp: torchao's Float8Linear (column or row linear with OpAttrs::fp8)
NP_CPU_OP(float8_linear)
// ... and torchao's float8 tensor parallelism (ops.hpp: kFp8AllGather's backward is
// all_gather_backward's reduce-scatter of its bf16 gradient)
Outs fp8_all_gather_forward(const Env& env, Ins in, Ins weights);
NP_CPU_OP(fp8_column_linear)
NP_CPU_OP(fp8_row_linear)
NP_CPU_OP(row_linear)
// te_fp8.cpp: Transformer Engine's float8 linears (kTeColumnLinear, kTeRowLinear), the float8
// output of a norm with OpAttrs::fp8 (y its values; dtype the activations', of the current
// scaling's scratch), and the scale a float8 all-gather passes on.
NP_CPU_OP(te_column_linear)
NP_CPU_OP(te_row_linear)
Tensor te_norm_output(const Env& env, const Mat& y, Dtype dtype);
void te_gathered(const Env& env, const Tensor& from, const Tensor& to);
NP_CPU_OP(router)
NP_CPU_OP(expert_column)
NP_CPU_OP(expert_row)
// attention.cpp
NP_CPU_OP(flash_attention)
NP_CPU_OP(sdpa)
NP_CPU_OP(attn_scores)
NP_CPU_OP(softmax)
NP_CPU_OP(softmax_fp32)
NP_CPU_OP(repeat_kv)
NP_CPU_OP(attn_context)
// moe.cpp
NP_CPU_OP(topk)
NP_CPU_OP(route_scores)
NP_CPU_OP(route_topk)
NP_CPU_OP(moe_dispatch)
NP_CPU_OP(moe_combine)
NP_CPU_OP(shared_gate)

#undef NP_CPU_OP

// The experts one token is routed to (spec.hpp, RouterSpec): the top k of its scores plus `bias`
// (nullptr: none) among the experts of its top topk_groups groups, each group scored by the sum
// of its top k / topk_groups; ties to the lower group and expert. `chosen` gets k indices, best
// first; `group_mask` (nullptr: not wanted) gets 1 for each eligible expert, else 0.
void route_choose(const float* scores, const float* bias, int64_t E, int64_t k,
                  const RouterSpec& r, int64_t* chosen, float* group_mask = nullptr);

}  // namespace np::exec::cpu
