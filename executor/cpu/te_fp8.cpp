// Transformer Engine's float8 linears under Megatron (te_fp8; planner/graph/ops.hpp,
// kTeColumnLinear and kTeRowLinear, and the norms writing float8), with the allocations the op
// table lists, in its order. A cast is x times its scale, saturated to the format (e4m3 forward,
// e5m2 gradients: Megatron's hybrid format), its codes stored; a GEMM multiplies the decoded
// values in fp32 and scales the product by the reciprocal scales once, rounding to bf16 (TE's
// cuBLASLt float8 GEMM with fp32 accumulation). Scales: current scaling (tensorwise) from the
// tensor's own amax, all-reduced over TP where TE sets the amax reduction group (the SP shard a
// LayerNorm-linear gathers, the row linear's SP output gradient); delayed scaling from the amax
// history (backend.hpp, TeFp8State), every amax all-reduced over TP.
#include <cmath>

#include "executor/cpu/kernels.hpp"
#include "executor/fp8.hpp"

namespace np::exec::cpu {
namespace {

enum Role { kInput = 0, kWeight = 1, kGrad = 2 };

float amax_of(const Mat& m) {
  float a = 0;
  for (int64_t i = 0; i < m.size(); ++i) a = std::fmax(a, std::fabs(m.data()[i]));
  return a;
}

Dtype format_of(Role r) {
  return r == kGrad ? Dtype::kFp8E5m2 : Dtype::kFp8E4m3;
}

// The scale of a tensor of role `r` whose amax is `amax` (`shared`: all-reduced over TP under
// current scaling too).
float scale_of(const Env& env, Role r, float amax, bool shared) {
  if (te_reduces(env.ctx, shared) && env.tp_size() > 1) {
    Scratch s({{1}, Dtype::kFp32});
    s.t.as<float>()[0] = amax;
    env.comm().all_reduce_max(s.t);
    amax = s.t.as<float>()[0];
  }
  return te_scale(env.ctx, r, amax, fp8_format(format_of(r)).max);
}

// x times `scale` cast to `to`: the decoded values; the codes into `codes` (row-major) and
// `transposed` (column-major) where given.
Mat quantize(const Mat& x, float scale, Dtype to, const Tensor& codes = {},
             const Tensor& transposed = {}) {
  const int64_t R = x.rows(), C = x.cols();
  Mat q(R, C);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const uint8_t b = f32_to_fp8(x(r, c) * scale, to);
      q(r, c) = fp8_to_f32(b, to);
      if (codes) codes.as<uint8_t>()[r * C + c] = b;
      if (transposed) transposed.as<uint8_t>()[c * R + r] = b;
    }
  return q;
}

// The decoded values of float8 codes [R, C], or of their transpose stored [C, R].
Mat decode(const Tensor& t, bool transposed = false) {
  const int64_t a = dim(t, 0), b = row_width(t);
  Mat q(transposed ? b : a, transposed ? a : b);
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j) {
      const float v = fp8_to_f32(t.as<uint8_t>()[i * b + j], t.type.dtype);
      if (transposed) q(j, i) = v;
      else q(i, j) = v;
    }
  return q;
}

void copy_codes(const Tensor& from, const Tensor& to, bool transpose) {
  const int64_t a = dim(from, 0), b = row_width(from);
  for (int64_t i = 0; i < a; ++i)
    for (int64_t j = 0; j < b; ++j)
      to.as<uint8_t>()[transpose ? j * a + i : i * b + j] = from.as<uint8_t>()[i * b + j];
}

void set_inv(const Env& env, const Tensor& t, float scale) {
  if (env.ctx.te_fp8) env.ctx.te_fp8->inv_scale[t.data] = 1.0f / scale;
}
float inv_of(const Env& env, const Tensor& t) {
  if (!env.ctx.te_fp8) return 1.0f;
  auto it = env.ctx.te_fp8->inv_scale.find(t.data);
  if (it == env.ctx.te_fp8->inv_scale.end()) fail("float8 tensor without its scale");
  return it->second;
}

// The weight's float8 copy (TE's cached workspace: the same within a step) and its scale.
std::pair<Mat, float> weight8(const Env& env, const Tensor& w) {
  Mat W = load_mat(w);
  const float s = scale_of(env, kWeight, amax_of(W), false);
  return {quantize(W, s, Dtype::kFp8E4m3), s};
}

// A float8 GEMM's fp32 product times its reciprocal scales (rounded when stored).
Mat scaled(Mat p, float inv) {
  p *= inv;
  return p;
}

}  // namespace

Tensor te_norm_output(const Env& env, const Mat& y, Dtype dtype) {
  const OpAttrs& a = env.attrs();
  const int64_t T = y.rows(), h = y.cols();
  Mat v = y;
  Tensor transposed;
  if (a.fp8 == Fp8Recipe::kTensorwise) {  // the bf16 norm output with its amax, then the cast
    Tensor hp = env.workspace({T, h}, dtype);
    store_mat(hp, y);
    v = load_mat(hp);
    if (a.fp8_transpose) transposed = env.workspace({h, T}, Dtype::kFp8E4m3);
  }
  // Under SP the shard is all-gathered in float8: its amax is reduced over TP.
  const float s = scale_of(env, kInput, amax_of(v), !a.fp8_transpose);
  Tensor out = env.output({T, h}, Dtype::kFp8E4m3);
  quantize(v, s, Dtype::kFp8E4m3, out, transposed);
  set_inv(env, out, s);
  return out;
}

void te_gathered(const Env& env, const Tensor& from, const Tensor& to) {
  if (env.ctx.te_fp8) set_inv(env, to, 1.0f / inv_of(env, from));
}

// qkv and fc1 on the norm's float8 output (gathered under SP).
Outs te_column_linear_forward(const Env& env, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "TE linear input");
  const OpAttrs& a = env.attrs();
  const int64_t R = dim(x, 0), K = row_width(x);
  if (a.fp8_transpose) copy_codes(x, env.workspace({R, K}, Dtype::kFp8E4m3), false);
  const Mat X8 = decode(x);
  auto [W8, sw] = weight8(env, need(w, 0, "TE linear weight"));
  check(W8.cols() == K, "TE linear: weight and input widths differ");
  Mat Y = scaled(X8 * W8.transpose(), inv_of(env, x) / sw);
  if (w.size() > 1) {
    Mat B = load_vec(need(w, 1, "TE linear bias"));
    for (int64_t t = 0; t < R; ++t) Y.row(t) += B.row(0);
  }
  Tensor out = env.output({R, W8.rows()}, env.act);
  store_mat(out, Y);
  return {out};
}

void te_column_linear_backward(const Env& env, const BackwardArgs& b) {
  const OpAttrs& a = env.attrs();
  const Tensor& x = need(b.inputs, 0, "TE linear input");
  const Tensor& wt = need(b.weights, 0, "TE linear weight");
  const Mat G = load_mat(need(b.grad_outputs, 0, "TE linear output gradient"));
  const int64_t R = dim(x, 0), K = row_width(x), N = G.cols();
  const float sg = scale_of(env, kGrad, amax_of(G), false);
  Tensor g8 = env.workspace({R, N}, Dtype::kFp8E5m2), g8t = env.workspace({N, R}, Dtype::kFp8E5m2);
  const Mat G8 = quantize(G, sg, Dtype::kFp8E5m2, g8, g8t);
  if (!a.fp8_transpose) copy_codes(x, env.workspace({K, R}, Dtype::kFp8E4m3), true);
  Tensor dense = a.dense_wgrad ? env.workspace(wt.type.shape, env.act) : Tensor{};
  auto [W8, sw] = weight8(env, wt);
  Mat DX = scaled(G8 * W8, 1.0f / (sg * sw));
  if (env.ctx.op->bwd_collective == "all_reduce") {
    Tensor view{DX.data(), {{DX.rows(), DX.cols()}, Dtype::kFp32}};
    env.comm().all_reduce(view);
  }
  grad_input(env, b, 0, {x.type.shape, env.act}, DX);
  add_linear_grads(b, scaled(G8.transpose() * decode(x), inv_of(env, x) / sg), dense, G);
}

// proj and fc2: the bf16 input cast here, the product reduced over TP.
Outs te_row_linear_forward(const Env& env, Ins in, Ins w) {
  const OpAttrs& a = env.attrs();
  const Mat X = load_mat(need(in, 0, "TE linear input"));
  const int64_t R = X.rows(), K = X.cols(), g = a.group;
  const float sx = scale_of(env, kInput, amax_of(X), false);
  Tensor rowwise = env.workspace({R, K}, Dtype::kFp8E4m3);
  Tensor partial = g > 1 ? env.workspace({R, a.features}, env.act) : Tensor{};
  Tensor y = env.output({R / g, a.features}, env.act);
  Tensor kept = env.output({K, R}, Dtype::kFp8E4m3);
  const Mat X8 = quantize(X, sx, Dtype::kFp8E4m3, rowwise, kept);
  set_inv(env, kept, sx);
  auto [W8, sw] = weight8(env, need(w, 0, "TE linear weight"));
  check(W8.cols() == K, "TE linear: weight and input widths differ");
  Mat Y = scaled(X8 * W8.transpose(), 1.0f / (sx * sw));
  if (w.size() > 1 && env.ctx.tp_rank == 0) {  // the bias once over the partial sums
    Mat B = load_vec(need(w, 1, "TE linear bias"));
    for (int64_t t = 0; t < R; ++t) Y.row(t) += B.row(0);
  }
  if (g > 1) {
    store_mat(partial, Y);
    env.comm().reduce_scatter(partial, y);
  } else {
    store_mat(y, Y);
    if (env.ctx.op->fwd_collective == "all_reduce") env.comm().all_reduce(y);
  }
  return {y, kept};
}

void te_row_linear_backward(const Env& env, const BackwardArgs& b) {
  const OpAttrs& a = env.attrs();
  const Tensor& kept = need(b.outputs, 1, "TE linear float8 input");
  const Tensor& wt = need(b.weights, 0, "TE linear weight");
  const Mat G = load_mat(need(b.grad_outputs, 0, "TE linear output gradient"));
  const int64_t g = a.group, R = G.rows() * g, N = G.cols(), K = dim(kept, 0);
  // Under SP the output gradient's shard: its amax reduced over TP, cast, all-gathered as float8.
  const float sg = scale_of(env, kGrad, amax_of(G), g > 1);
  Mat G8;
  if (g > 1) {
    Tensor shard = env.workspace({R / g, N}, Dtype::kFp8E5m2);
    Tensor full = env.workspace({R, N}, Dtype::kFp8E5m2), t = env.workspace({N, R}, Dtype::kFp8E5m2);
    quantize(G, sg, Dtype::kFp8E5m2, shard);
    env.comm().all_gather(shard, full);
    copy_codes(full, t, true);
    G8 = decode(full);
  } else {
    Tensor g8 = env.workspace({R, N}, Dtype::kFp8E5m2), g8t = env.workspace({N, R}, Dtype::kFp8E5m2);
    G8 = quantize(G, sg, Dtype::kFp8E5m2, g8, g8t);
  }
  Tensor dense = a.dense_wgrad ? env.workspace(wt.type.shape, env.act) : Tensor{};
  auto [W8, sw] = weight8(env, wt);
  grad_input(env, b, 0, {{R, K}, env.act}, scaled(G8 * W8, 1.0f / (sg * sw)));
  // The bias gradient from the dequantized float8 gradient (under SP the gathered one).
  add_linear_grads(b, scaled(G8.transpose() * decode(kept, true), inv_of(env, kept) / sg), dense,
                   scaled(G8, 1.0f / sg));
}

}  // namespace np::exec::cpu
