// The TP collectives as ops: all-gather and reduce-scatter along the token dim (conjugate pairs in
// backward) and the all-reduce after a row-parallel linear (identity in backward: Megatron's g).
#include <cstring>

#include "executor/cpu/kernels.hpp"

namespace np::exec::cpu {

namespace {

TensorType with_rows(const TensorType& t, int64_t rows) {
  TensorType r = t;
  check(!r.shape.empty(), "a collective needs a tensor with a token dim");
  r.shape[0] = rows;
  return r;
}

// grad_in = collective(grad_out) of type t: written straight into a new input gradient, or
// through scratch and added to the one already there.
template <typename Collective>
void collective_grad_input(const Env& env, const BackwardArgs& a, const TensorType& t,
                           Collective collective) {
  Tensor& dst = a.grad_inputs[0];
  if (!dst) {
    dst = env.alloc(t, AllocRole::kGradInput);
    collective(dst);
    return;
  }
  Scratch s(t);
  collective(s.t);
  grad_input_tensor(env, a, 0, s.t);
}

}  // namespace

// Context parallelism's K/V exchange: the K/V columns of this rank's qkv rows, all-gathered over
// the CP group (rank order); backward reduce-scatters their gradient and adds it to the K/V
// columns of the qkv gradient (the attention core wrote the Q columns).
Outs cp_gather_kv_forward(const Env& env, Ins in, Ins) {
  const Tensor& qkv = need(in, 0, "cp_gather_kv qkv");
  const OpAttrs& a = env.attrs();
  int64_t T = dim(qkv, 0), q = a.heads * a.head_dim, kv = 2 * a.kv_heads * a.head_dim;
  check(row_width(qkv) == q + kv, "cp_gather_kv: qkv is not [q | k | v] of the attrs' heads");
  Scratch mine({{T, kv}, qkv.type.dtype});
  int64_t e = dtype_bytes(qkv.type.dtype);
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(mine.t.as<unsigned char>() + t * kv * e,
                qkv.as<unsigned char>() + (t * (q + kv) + q) * e, static_cast<size_t>(kv * e));
  Tensor out = env.output({T * env.comm().cp_size(), kv}, qkv.type.dtype);
  env.comm().cp_all_gather(mine.t, out);
  return {out};
}

void cp_gather_kv_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "cp_gather_kv output gradient");
  const OpAttrs& at = env.attrs();
  int64_t cp = env.comm().cp_size(), T = dim(g, 0) / cp, q = at.heads * at.head_dim,
          kv = 2 * at.kv_heads * at.head_dim;
  Scratch part({{T, kv}, g.type.dtype});
  env.comm().cp_reduce_scatter(g, part.t);
  Mat P = load_mat(part.t), dX = Mat::Zero(T, q + kv);
  dX.rightCols(kv) = P;
  grad_input(env, a, 0, {{T, q + kv}, env.act}, dX);
}

Outs all_gather_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "all_gather input");
  Tensor out = env.alloc(with_rows(x.type, dim(x, 0) * env.comm().tp_size()), AllocRole::kOutput);
  env.comm().all_gather(x, out);
  if (x.type.dtype == Dtype::kFp8E4m3) te_gathered(env, x, out);  // TE's float8 shard's scale
  return {out};
}

// grad_in = this rank's block of the sum over ranks of grad_out (reduce-scatter).
void all_gather_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "all_gather output gradient");
  collective_grad_input(env, a, with_rows(g.type, dim(g, 0) / env.comm().tp_size()),
                        [&](Tensor& out) { env.comm().reduce_scatter(g, out); });
}

Outs reduce_scatter_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "reduce_scatter input");
  int64_t tp = env.comm().tp_size();
  check(dim(x, 0) % tp == 0, "reduce_scatter: the token dim is not a multiple of tp");
  Tensor out = env.alloc(with_rows(x.type, dim(x, 0) / tp), AllocRole::kOutput);
  env.comm().reduce_scatter(x, out);
  return {out};
}

// grad_in = all-gather of grad_out.
void reduce_scatter_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "reduce_scatter output gradient");
  collective_grad_input(env, a, with_rows(g.type, dim(g, 0) * env.comm().tp_size()),
                        [&](Tensor& out) { env.comm().all_gather(g, out); });
}

Outs all_reduce_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "all_reduce input");
  Tensor out = env.alloc(x.type, AllocRole::kOutput);
  std::memcpy(out.data, x.data, x.bytes());
  env.comm().all_reduce(out);
  return {out};
}

void all_reduce_backward(const Env& env, const BackwardArgs& a) {
  grad_input_tensor(env, a, 0, need(a.grad_outputs, 0, "all_reduce output gradient"));
}

// Every TP rank's features of the same rows, side by side in rank order: all-gathered into a
// [tp x rows] buffer (the op's workspace), then each rank's block placed at its columns.
Outs gather_features_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "gather_features input");
  const int64_t tp = env.comm().tp_size(), T = dim(x, 0), c = row_width(x);
  const int64_t e = dtype_bytes(x.type.dtype);
  Tensor out = env.output({T, c * tp}, x.type.dtype);
  Tensor all = env.workspace({T * tp, c}, x.type.dtype);
  env.comm().all_gather(x, all);
  for (int64_t r = 0; r < tp; ++r)
    for (int64_t t = 0; t < T; ++t)
      std::memcpy(out.as<unsigned char>() + (t * c * tp + r * c) * e,
                  all.as<unsigned char>() + ((r * T + t) * c) * e, static_cast<size_t>(c * e));
  return {out, all};
}

// This rank's columns of the gradient.
void gather_features_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "gather_features output gradient");
  const int64_t tp = env.comm().tp_size(), T = dim(g, 0), c = row_width(g) / tp;
  Mat G = load_mat(g);
  Mat mine = G.middleCols(env.ctx.tp_rank * c, c);
  grad_input(env, a, 0, {{T, c}, g.type.dtype}, mine);
}

// This rank's rows of a tensor every TP rank holds whole.
Outs scatter_rows_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "scatter_rows input");
  const int64_t tp = env.comm().tp_size();
  check(dim(x, 0) % tp == 0, "scatter_rows: the token dim is not a multiple of tp");
  Tensor out = env.alloc(with_rows(x.type, dim(x, 0) / tp), AllocRole::kOutput);
  std::memcpy(out.data, x.as<unsigned char>() + env.ctx.tp_rank * out.bytes(),
              static_cast<size_t>(out.bytes()));
  return {out};
}

// grad_in = all-gather of grad_out.
void scatter_rows_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "scatter_rows output gradient");
  collective_grad_input(env, a, with_rows(g.type, dim(g, 0) * env.comm().tp_size()),
                        [&](Tensor& out) { env.comm().all_gather(g, out); });
}

}  // namespace np::exec::cpu
