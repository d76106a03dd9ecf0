// torchao's Float8Linear (planner/graph/float8.cpp has its eager code's steps, which this kernel
// takes in the same order with the same allocations): each cast to float8 with its temporaries
// (|x|, its max, the fp32 scale, the fp32 copy and its scaled product, the saturating clamp, the
// float8 result: executor/fp8.hpp), and _scaled_mm as an fp32 GEMM of the float8 values times
// the reciprocal scales, rounded to bf16. Rowwise backward GEMMs: the raw product in bf16, then
// multiplied in place by the fp32 outer product of the reciprocal scales (addmm_float8_unwrapped
// without fast accumulation).
#include <cmath>

#include "executor/cpu/kernels.hpp"
#include "executor/fp8.hpp"

namespace np::exec::cpu {
namespace {

// The next step (a context without steps, an op test's, runs them as one).
void next(const Env& env) {
  if (env.ctx.step) env.ctx.step();
}

// The scale's axis: none (one per tensor), per row ([rows, 1]), per column ([1, cols]).
enum class Axis { kTensor, kRows, kCols };

struct Fp8 {
  Mat value;  // the float8 values, decoded (rows x cols)
  Mat inv;    // the reciprocal scales: 1 x 1, rows x 1 or 1 x cols
};

std::vector<int64_t> scale_shape(Axis a, int64_t rows, int64_t cols) {
  return a == Axis::kTensor ? std::vector<int64_t>{}
         : a == Axis::kRows ? std::vector<int64_t>{rows, 1}
                            : std::vector<int64_t>{1, cols};
}

// One hp_tensor_to_float8_dynamic of x (bf16 values), as four steps; the first begins the
// kernel's current step (the caller steps before it when something came before).
Fp8 cast(const Env& env, const Mat& x, Dtype to, Axis axis, bool pow2) {
  const int64_t R = x.rows(), C = x.cols(), n = R * C;
  const float fmax = fp8_format(to).max;
  const std::vector<int64_t> ss = scale_shape(axis, R, C);
  auto scale_index = [&](int64_t r, int64_t c) {
    return axis == Axis::kTensor ? 0 : axis == Axis::kRows ? r : c;
  };
  // abs and its max (bf16: exact for bf16 values).
  // Tensorwise takes torch.max (aten.max), whose result per-op checkpointing keeps.
  Tensor abs = env.workspace({R, C}, env.act),
         amax = axis == Axis::kTensor ? env.kept(ss, env.act) : env.workspace(ss, env.act);
  std::vector<float> most(static_cast<size_t>(amax.numel()), 0.0f);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      float a = std::fabs(x(r, c));
      store(abs, r * C + c, a);
      float& m = most[static_cast<size_t>(scale_index(r, c))];
      m = std::fmax(m, load(abs, r * C + c));
    }
  for (size_t i = 0; i < most.size(); ++i) store(amax, static_cast<int64_t>(i), most[i]);
  next(env);
  // amax_to_scale: max / clamp(amax, 1e-12) in fp64, to fp32; rowwise rounds it down to 2^k.
  Tensor scale = env.workspace(ss, Dtype::kFp32);
  Mat inv(axis == Axis::kRows ? R : 1, axis == Axis::kCols ? C : 1);
  for (int64_t i = 0; i < scale.numel(); ++i) {
    float s = static_cast<float>(double(fmax) / std::fmax(double(load(amax, i)), 1e-12));
    if (pow2) s = pow2_floor(s);
    scale.as<float>()[i] = s;
    inv.data()[i] = 1.0f / s;  // _scaled_mm's scale_a / scale_b (a_scale.reciprocal())
  }
  next(env);
  Tensor f32 = env.workspace({R, C}, Dtype::kFp32), scaled = env.workspace({R, C}, Dtype::kFp32);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      f32.as<float>()[r * C + c] = x(r, c);
      scaled.as<float>()[r * C + c] = x(r, c) * scale.as<float>()[scale_index(r, c)];
    }
  next(env);
  Tensor clamped = env.workspace({R, C}, Dtype::kFp32), q = env.workspace({R, C}, to);
  Fp8 out{Mat(R, C), inv};
  for (int64_t i = 0; i < n; ++i) {
    float v = std::fmin(std::fmax(scaled.as<float>()[i], -fmax), fmax);
    clamped.as<float>()[i] = v;
    q.as<uint8_t>()[i] = f32_to_fp8(v, to);
    out.value.data()[i] = fp8_to_f32(q.as<uint8_t>()[i], to);
  }
  return out;
}

// The reciprocal scales _scaled_mm takes (fp32, the scales' shapes).
void reciprocals(const Env& env, const Mat& a_inv, const Mat& b_inv, bool row) {
  env.workspace(row ? std::vector<int64_t>{a_inv.rows(), 1} : std::vector<int64_t>{}, Dtype::kFp32);
  env.workspace(row ? std::vector<int64_t>{1, b_inv.cols()} : std::vector<int64_t>{},
                Dtype::kFp32);
}

// a (m x k) b (k x n) scaled by the reciprocal scales, as bf16 values: tensorwise, rounded once;
// rowwise, the raw product rounded, then times the fp32 outer product (`post`), rounded again.
Mat scaled_product(const Mat& a, const Mat& b, const Mat& a_inv, const Mat& b_inv, bool row,
                   const Tensor& post) {
  Mat d = a * b;
  for (int64_t i = 0; i < d.rows(); ++i)
    for (int64_t j = 0; j < d.cols(); ++j) {
      float sa = a_inv(a_inv.rows() > 1 ? i : 0, 0), sb = b_inv(0, b_inv.cols() > 1 ? j : 0);
      if (!row) {
        d(i, j) = bf16_to_f32(f32_to_bf16(d(i, j) * sa * sb));
      } else {
        float p = sa * sb;
        post.as<float>()[i * d.cols() + j] = p;
        d(i, j) = bf16_to_f32(f32_to_bf16(bf16_to_f32(f32_to_bf16(d(i, j))) * p));
      }
    }
  return d;
}

// A weight FSDP's float8 all-gather made (OpAttrs::fp8_gathered): its e4m3 values, and the
// reciprocal of its scale, the 0-dim fp32 tensor bound after the weights.
Fp8 gathered_weight(Ins w) {
  const Tensor& t = need(w, 0, "float8 linear weight");
  check(t.type.dtype == Dtype::kFp8E4m3 && w.size() >= 2 && w.back().numel() == 1,
        "float8 linear: the gathered weight is not e4m3 with its scale");
  const int64_t rows = t.type.shape.at(0), cols = t.numel() / rows;
  Fp8 out{Mat(rows, cols), Mat(1, 1)};
  for (int64_t i = 0; i < rows * cols; ++i)
    out.value.data()[i] = fp8_to_f32(t.as<uint8_t>()[i], Dtype::kFp8E4m3);
  out.inv(0, 0) = 1.0f / w.back().as<float>()[0];
  return out;
}

}  // namespace

Outs float8_linear_forward(const Env& env, Ins in, Ins w) {
  const Fp8Recipe r = env.attrs().fp8;
  // rowwise_with_gw_hp's forward is rowwise's.
  const bool row = r != Fp8Recipe::kTensorwise, gathered = env.attrs().fp8_gathered;
  Mat X = load_mat(need(in, 0, "float8 linear input"));
  Fp8 x8 = cast(env, X, Dtype::kFp8E4m3, row ? Axis::kRows : Axis::kTensor, row);
  if (env.ctx.cached_output) {  // per-op checkpointing's recompute of a kept linear: the casts
    if (!gathered) {
      next(env);
      cast(env, load_mat(need(w, 0, "float8 linear weight")), Dtype::kFp8E4m3,
           row ? Axis::kRows : Axis::kTensor, row);
    }
    return {};
  }
  next(env);
  // W^T's cast: per output feature under rowwise (W's rows); none for a gathered weight.
  Fp8 w8 = gathered ? gathered_weight(w) : Fp8{};
  if (!gathered) {
    w8 = cast(env, load_mat(need(w, 0, "float8 linear weight")), Dtype::kFp8E4m3,
              row ? Axis::kRows : Axis::kTensor, row);
    next(env);
  }
  const Mat& W = w8.value;
  check(W.cols() == X.cols(), "float8 linear: weight and input widths differ");
  reciprocals(env, x8.inv, w8.inv.transpose(), row);
  Tensor out = env.output({X.rows(), W.rows()}, env.act);
  store_mat(out, scaled_product(x8.value, w8.value.transpose(), x8.inv, w8.inv.transpose(), false, {}));
  return {out};
}

void float8_linear_backward(const Env& env, const BackwardArgs& a) {
  const Fp8Recipe r = env.attrs().fp8;
  const bool row = r != Fp8Recipe::kTensorwise, hp = r == Fp8Recipe::kRowwiseGwHp;
  const Dtype grad = row ? Dtype::kFp8E4m3 : Dtype::kFp8E5m2;
  const Tensor& x = need(a.inputs, 0, "float8 linear input");
  Mat X = load_mat(x), G = load_mat(need(a.grad_outputs, 0, "float8 linear output gradient"));
  const bool gathered = env.attrs().fp8_gathered;
  const Tensor& wt = need(a.weights, 0, "float8 linear weight");
  const int64_t R = X.rows(), K = X.cols(), N = wt.type.shape.at(0);
  // grad_input = g8 @ W8: g per row, W^T per input feature (W's columns); rowwise_with_gw_hp
  // casts W with one scale (power of 2), repeated along K for _scaled_mm.
  Fp8 g8 = cast(env, G, grad, row ? Axis::kRows : Axis::kTensor, row);
  next(env);
  Fp8 w8 = gathered ? gathered_weight(a.weights) : Fp8{};
  if (!gathered) {
    w8 = cast(env, load_mat(wt), Dtype::kFp8E4m3, row && !hp ? Axis::kCols : Axis::kTensor, row);
    next(env);
  }
  env.workspace({N, K}, Dtype::kFp8E4m3);  // W8^T made column-major for _scaled_mm
  if (hp) {
    env.workspace({K}, Dtype::kFp32);  // b_scale.repeat(K)
    w8.inv = Mat::Constant(1, K, w8.inv(0, 0));
  }
  reciprocals(env, g8.inv, w8.inv, row);
  Tensor post = row ? env.workspace({R, K}, Dtype::kFp32) : Tensor{};
  Mat DX = scaled_product(g8.value, w8.value, g8.inv, w8.inv, row, post);
  if (row) {
    next(env);
    env.workspace({}, Dtype::kFp32), env.workspace({}, Dtype::kFp32);  // the 0-dim ones
  }
  grad_input(env, a, 0, x.type, DX);
  next(env);
  if (hp) {  // grad_weight = g^T @ x in bf16, as a bf16 linear's
    add_mat(need(a.weight_grads, 0, "float8 linear weight gradient"), G.transpose() * X);
    return;
  }
  // grad_weight = g8^T @ x8, each scaled per column (per output and input feature) under rowwise.
  Fp8 gc = cast(env, G, grad, row ? Axis::kCols : Axis::kTensor, row);
  next(env);
  Fp8 xc = cast(env, X, Dtype::kFp8E4m3, row ? Axis::kCols : Axis::kTensor, row);
  next(env);
  env.workspace({N, R}, grad);             // g8^T made row-major
  env.workspace({R, K}, Dtype::kFp8E4m3);  // x8 made column-major
  Mat ga_inv = gc.inv.transpose();         // [N, 1]
  reciprocals(env, ga_inv, xc.inv, row);
  Tensor wpost = row ? env.workspace({N, K}, Dtype::kFp32) : Tensor{};
  Mat DW = scaled_product(gc.value.transpose(), xc.value, ga_inv, xc.inv, row, wpost);
  if (row) {
    next(env);
    env.workspace({}, Dtype::kFp32), env.workspace({}, Dtype::kFp32);
  }
  add_mat(need(a.weight_grads, 0, "float8 linear weight gradient"), DW);
}

}  // namespace np::exec::cpu
