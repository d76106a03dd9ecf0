// GEMM ops: column- and row-parallel linears, the MoE router (fp32 logits) and the grouped expert
// GEMMs (one row block per local expert, blocks from the routing indices). y = x W^T (+ bias).
#include <string>

#include "executor/cpu/kernels.hpp"

namespace np::exec::cpu {

namespace {

Outs linear_forward(const Env& env, Ins in, Ins w, Dtype out_dtype, bool add_bias) {
  const Tensor& x = need(in, 0, "linear input");
  Mat X = load_mat(x), W = load_mat(need(w, 0, "linear weight"));
  check(W.cols() == X.cols(), "linear: weight and input widths differ");
  Mat Y = X * W.transpose();
  if (w.size() > 1 && add_bias) {
    Mat B = load_vec(need(w, 1, "linear bias"));
    for (int64_t t = 0; t < Y.rows(); ++t) Y.row(t) += B.row(0);
  }
  Tensor out = env.output({X.rows(), W.rows()}, out_dtype);
  store_mat(out, Y);
  return {out};
}

// dX = G W (all-reduced over TP first when the op's backward collective says so: Megatron's f),
// dW += G^T X, db += sum over rows of G. dense_wgrad: G^T X whole in bf16 first (a workspace
// taken before the input gradient, in the op table's order), then added into dW.
void linear_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& x = need(a.inputs, 0, "linear input");
  Mat X = load_mat(x), G = load_mat(need(a.grad_outputs, 0, "linear output gradient"));
  const Tensor& w = need(a.weights, 0, "linear weight");
  Mat W = load_mat(w);
  Tensor dense = env.ctx.op->attrs.dense_wgrad ? env.workspace(w.type.shape, env.act) : Tensor{};
  Mat DX = G * W;
  if (env.ctx.op->bwd_collective == "all_reduce") {
    Tensor view{DX.data(), {{DX.rows(), DX.cols()}, Dtype::kFp32}};
    env.comm().all_reduce(view);
  }
  grad_input(env, a, 0, x.type, DX);
  add_linear_grads(a, G.transpose() * X, dense, G);
}

// Grouped GEMMs over the local experts' row segments of the dispatched tensor (padding slots
// are zero rows: zero outputs, zero weight-gradient terms).
Outs expert_forward(const Env& env, Ins in, Ins w) {
  const Tensor& xe = need(in, 0, "expert input");
  const Tensor& W = need(w, 0, "expert weight");
  int64_t E = env.attrs().experts, N = dim(xe, 0), K = dim(xe, 1), F = dim(W, 1);
  check(dim(W, 0) == E && dim(W, 2) == K, "expert: weight is not {experts, out, in}");
  Routing r = routing(env, need(in, 1, "routing indices"));
  check(r.rows == N, "expert: input rows differ from the dispatched rows");
  Tensor out = env.output({N, F}, env.act);
  for (const Routing::Segment& s : r.segments) {
    if (s.rows == 0) continue;
    Mat Y = load_rows(xe, s.rows, K, s.first * K) * load_rows(W, F, K, s.expert * F * K).transpose();
    store_mat(out, Y, s.first * F);
  }
  return {out};
}

void expert_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& xe = need(a.inputs, 0, "expert input");
  const Tensor& g = need(a.grad_outputs, 0, "expert output gradient");
  const Tensor& W = need(a.weights, 0, "expert weight");
  const Tensor& dW = need(a.weight_grads, 0, "expert weight gradient");
  int64_t N = dim(xe, 0), K = dim(xe, 1), F = dim(W, 1);
  Routing r = routing(env, need(a.inputs, 1, "routing indices"));
  check(r.rows == N, "expert: input rows differ from the dispatched rows");
  Mat DX = Mat::Zero(N, K);
  for (const Routing::Segment& s : r.segments) {
    if (s.rows == 0) continue;
    Mat Ge = load_rows(g, s.rows, F, s.first * F), We = load_rows(W, F, K, s.expert * F * K);
    DX.middleRows(s.first, s.rows) = Ge * We;
    Mat DWe = Ge.transpose() * load_rows(xe, s.rows, K, s.first * K);
    add_mat(dW, DWe, s.expert * F * K);
  }
  grad_input(env, a, 0, xe.type, DX);
}

}  // namespace

void add_linear_grads(const BackwardArgs& a, Mat DW, const Tensor& dense, const Mat& bias_rows) {
  if (dense) {
    store_mat(dense, DW);
    DW = load_mat(dense);
  }
  add_mat(need(a.weight_grads, 0, "linear weight gradient"), DW);
  if (a.weight_grads.size() > 1)
    add_mat(need(a.weight_grads, 1, "linear bias gradient"), column_sums(bias_rows));
}

Outs column_linear_forward(const Env& env, Ins in, Ins w) {
  return linear_forward(env, in, w, env.act, true);
}
void column_linear_backward(const Env& env, const BackwardArgs& a) {
  linear_backward(env, a);
}

// A linear every TP rank holds whole (MLA's down-projections): as the column-parallel one.
Outs replicated_linear_forward(const Env& env, Ins in, Ins w) {
  return column_linear_forward(env, in, w);
}
void replicated_linear_backward(const Env& env, const BackwardArgs& a) {
  column_linear_backward(env, a);
}

// The output is a partial sum over TP: only rank 0 adds the bias (its gradient is every rank's).
Outs row_linear_forward(const Env& env, Ins in, Ins w) {
  return linear_forward(env, in, w, env.act, env.ctx.tp_rank == 0);
}
void row_linear_backward(const Env& env, const BackwardArgs& a) {
  linear_backward(env, a);
}

Outs router_forward(const Env& env, Ins in, Ins w) {
  return linear_forward(env, in, w, Dtype::kFp32, true);
}
void router_backward(const Env& env, const BackwardArgs& a) {
  linear_backward(env, a);
}

Outs expert_column_forward(const Env& env, Ins in, Ins w) {
  return expert_forward(env, in, w);
}
void expert_column_backward(const Env& env, const BackwardArgs& a) {
  expert_backward(env, a);
}
Outs expert_row_forward(const Env& env, Ins in, Ins w) {
  return expert_forward(env, in, w);
}
void expert_row_backward(const Env& env, const BackwardArgs& a) {
  expert_backward(env, a);
}

}  // namespace np::exec::cpu
