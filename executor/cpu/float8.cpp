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
using Axis = Fp8ScaleAxis;

struct Fp8 {
  Mat value;  // the float8 values, decoded (rows x cols)
  Mat inv;    // the reciprocal scales: 1 x 1, rows x 1 or 1 x cols
};

std::vector<int64_t> scale_shape(Axis a, int64_t rows, int64_t cols) {
  return a == Axis::kTensor ? std::vector<int64_t>{}
         : a == Axis::kRows ? std::vector<int64_t>{rows, 1}
                            : std::vector<int64_t>{1, cols};
}

// Where a cast's scale and float8 tensor go: workspaces, or the op's outputs (torchao's float8
// TP, whose casts make tensors the op keeps or passes on); and whether the max runs over a
// dimension split over TP, so is all-reduced (a DTensor's partial max; fp8_max_over_tp).
struct CastTo {
  bool reduce = false, scale_out = false, q_out = false;
  Tensor* scale = nullptr;  // the scale tensor, when wanted
  Tensor* q = nullptr;      // the float8 tensor, when wanted
};

// A scale all-reduced over TP, element by element (one per tensor, row or column).
// amax_to_scale is monotonic (decreasing in the max, rounded to fp32 and to a power of 2
// monotonically), so the scale of the largest max is the least scale: the fp32 scales negated,
// all-reduced with max in place, negated back, exactly the scale of the all-reduced max, with no
// tensor beyond the scale.
void reduce_scale(const Env& env, const Tensor& scale) {
  if (env.tp_size() == 1) return;
  float* s = scale.as<float>();
  for (int64_t i = 0; i < scale.numel(); ++i) s[i] = -s[i];
  env.comm().all_reduce_max(scale);
  for (int64_t i = 0; i < scale.numel(); ++i) s[i] = -s[i];
}

// One hp_tensor_to_float8_dynamic of x (bf16 values), as four steps; the first begins the
// kernel's current step (the caller steps before it when something came before).
Fp8 cast(const Env& env, const Mat& x, Dtype to, Axis axis, bool pow2, CastTo into = {}) {
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
  Tensor scale = into.scale_out ? env.output(ss, Dtype::kFp32) : env.workspace(ss, Dtype::kFp32);
  Mat inv(axis == Axis::kRows ? R : 1, axis == Axis::kCols ? C : 1);
  for (int64_t i = 0; i < scale.numel(); ++i) {
    float s = static_cast<float>(double(fmax) / std::fmax(double(load(amax, i)), 1e-12));
    if (pow2) s = pow2_floor(s);
    scale.as<float>()[i] = s;
  }
  if (into.reduce) reduce_scale(env, scale);
  for (int64_t i = 0; i < scale.numel(); ++i)
    inv.data()[i] = 1.0f / scale.as<float>()[i];  // _scaled_mm's scale_a / scale_b
  if (into.scale) *into.scale = scale;
  next(env);
  Tensor f32 = env.workspace({R, C}, Dtype::kFp32), scaled = env.workspace({R, C}, Dtype::kFp32);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      f32.as<float>()[r * C + c] = x(r, c);
      scaled.as<float>()[r * C + c] = x(r, c) * scale.as<float>()[scale_index(r, c)];
    }
  next(env);
  Tensor clamped = env.workspace({R, C}, Dtype::kFp32),
         q = into.q_out ? env.output({R, C}, to) : env.workspace({R, C}, to);
  if (into.q) *into.q = q;
  Fp8 out{Mat(R, C), inv};
  for (int64_t i = 0; i < n; ++i) {
    float v = std::fmin(std::fmax(scaled.as<float>()[i], -fmax), fmax);
    clamped.as<float>()[i] = v;
    q.as<uint8_t>()[i] = f32_to_fp8(v, to);
    out.value.data()[i] = fp8_to_f32(q.as<uint8_t>()[i], to);
  }
  return out;
}

// A plain float8 linear's cast of `operand` with scales along `axis`: at tp > 1 (plain TP: the
// LM head; every linear under the rowwise recipes) its operands are TP shards, and a max over a
// split dimension is all-reduced (fp8_max_over_tp).
CastTo across(const Env& env, Fp8Operand operand, Axis axis) {
  return {.reduce = fp8_max_over_tp(env.ctx.op->kind, env.tp_size(), operand, axis)};
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
  const Axis per_row = row ? Axis::kRows : Axis::kTensor;
  Mat X = load_mat(need(in, 0, "float8 linear input"));
  Fp8 x8 = cast(env, X, Dtype::kFp8E4m3, per_row, row, across(env, Fp8Operand::kInput, per_row));
  if (env.ctx.cached_output) {  // per-op checkpointing's recompute of a kept linear: the casts
    if (!gathered) {
      next(env);
      cast(env, load_mat(need(w, 0, "float8 linear weight")), Dtype::kFp8E4m3, per_row, row,
           across(env, Fp8Operand::kWeight, per_row));
    }
    return {};
  }
  next(env);
  // W^T's cast: per output feature under rowwise (W's rows); none for a gathered weight.
  Fp8 w8 = gathered ? gathered_weight(w) : Fp8{};
  if (!gathered) {
    w8 = cast(env, load_mat(need(w, 0, "float8 linear weight")), Dtype::kFp8E4m3, per_row, row,
              across(env, Fp8Operand::kWeight, per_row));
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
  const Axis g_axis = row ? Axis::kRows : Axis::kTensor,
             w_axis = row && !hp ? Axis::kCols : Axis::kTensor;
  Fp8 g8 = cast(env, G, grad, g_axis, row, across(env, Fp8Operand::kGradOutput, g_axis));
  next(env);
  Fp8 w8 = gathered ? gathered_weight(a.weights) : Fp8{};
  if (!gathered) {
    w8 = cast(env, load_mat(wt), Dtype::kFp8E4m3, w_axis, row,
              across(env, Fp8Operand::kWeight, w_axis));
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
  const Axis per_col = row ? Axis::kCols : Axis::kTensor;
  Fp8 gc = cast(env, G, grad, per_col, row, across(env, Fp8Operand::kGradOutput, per_col));
  next(env);
  Fp8 xc = cast(env, X, Dtype::kFp8E4m3, per_col, row, across(env, Fp8Operand::kInput, per_col));
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

// --- torchao's float8 tensor parallelism (tensorwise; planner/graph/float8.cpp's steps) ---------

namespace {

// A float8 tensor's values and the reciprocal of its 0-dim scale.
Fp8 decode(const Tensor& q, const Tensor& scale) {
  const int64_t rows = q.type.shape.at(0), cols = q.numel() / std::max<int64_t>(rows, 1);
  Fp8 out{Mat(rows, cols), Mat(1, 1)};
  for (int64_t i = 0; i < rows * cols; ++i)
    out.value.data()[i] = fp8_to_f32(q.as<uint8_t>()[i], q.type.dtype);
  out.inv(0, 0) = 1.0f / scale.as<float>()[0];
  return out;
}

// The float8 TP linears' weight: cast (its max all-reduced over TP), ending the step; or, under
// FSDP's float8 all-gather, as it arrived, cast per TP rank over its shard group.
Fp8 tp_weight(const Env& env, Ins w) {
  if (env.attrs().fp8_gathered) return gathered_weight(w);
  Fp8 w8 = cast(env, load_mat(need(w, 0, "float8 linear weight")), Dtype::kFp8E4m3,
                Axis::kTensor, false, {.reduce = true});
  next(env);
  return w8;
}

// The linear's backward on a float8 output gradient g8 [R, N] (its scale live) and float8 input
// x8 [R, K]: W^T cast again (its max all-reduced), the input gradient's GEMM (W8 copied
// transposed), the weight gradient's (g8^T made row-major, x8 column-major). The input gradient
// is bf16 (`x_type`).
void fp8_tp_linear_backward(const Env& env, const BackwardArgs& a, const Fp8& g8, const Fp8& x8,
                            const TensorType& x_type) {
  const Tensor& wt = need(a.weights, 0, "float8 linear weight");
  const int64_t R = x8.value.rows(), K = x8.value.cols(), N = wt.type.shape.at(0);
  Fp8 w8 = tp_weight(env, a.weights);
  env.workspace({N, K}, Dtype::kFp8E4m3);
  reciprocals(env, g8.inv, w8.inv, false);
  grad_input(env, a, 0, x_type, scaled_product(g8.value, w8.value, g8.inv, w8.inv, false, {}));
  next(env);
  env.workspace({N, R}, Dtype::kFp8E5m2);
  env.workspace({R, K}, Dtype::kFp8E4m3);
  reciprocals(env, g8.inv, x8.inv, false);
  add_mat(need(a.weight_grads, 0, "float8 linear weight gradient"),
          scaled_product(g8.value.transpose(), x8.value, g8.inv, x8.inv, false, {}));
}

}  // namespace

// PrepareFloat8ModuleInput: the shard cast (scale: output 1, its max all-reduced), the float8
// shard all-gathered over TP into output 0.
Outs fp8_all_gather_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "float8 all-gather input");
  Tensor scale, q;
  cast(env, load_mat(x), Dtype::kFp8E4m3, Axis::kTensor, false,
       {.reduce = true, .scale_out = true, .scale = &scale, .q = &q});
  next(env);
  Tensor out = env.output({x.type.shape.at(0) * env.tp_size(), x.type.shape.at(1)},
                          Dtype::kFp8E4m3);
  env.comm().all_gather(q, out);
  return {out, scale};
}

// Float8ColwiseParallel's linear on x8 (input 0) and its scale (input 1): W^T cast (max
// all-reduced) unless gathered in float8, then _scaled_mm.
Outs fp8_column_linear_forward(const Env& env, Ins in, Ins w) {
  Fp8 x8 = decode(need(in, 0, "float8 input"), need(in, 1, "float8 input scale"));
  Fp8 w8 = tp_weight(env, w);
  check(w8.value.cols() == x8.value.cols(), "float8 linear: weight and input widths differ");
  reciprocals(env, x8.inv, w8.inv, false);
  Tensor out = env.output({x8.value.rows(), w8.value.rows()}, env.act);
  store_mat(out, scaled_product(x8.value, w8.value.transpose(), x8.inv, w8.inv, false, {}));
  return {out};
}

// NoopFwToFloat8BwDynamic's cast of the bf16 output gradient (max all-reduced), then the linear's
// backward on float8 operands; the input's gradient bf16.
void fp8_column_linear_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& x = need(a.inputs, 0, "float8 input");
  Fp8 x8 = decode(x, need(a.inputs, 1, "float8 input scale"));
  Fp8 g8 = cast(env, load_mat(need(a.grad_outputs, 0, "float8 linear output gradient")),
                Dtype::kFp8E5m2, Axis::kTensor, false, {.reduce = true});
  next(env);
  fp8_tp_linear_backward(env, a, g8, x8, {x.type.shape, Dtype::kBf16});
}

// Float8RowwiseParallel's linear: x cast into outputs 2 (scale) and 1 (e4m3), max all-reduced;
// W^T cast; _scaled_mm into the bf16 partial product, reduce-scattered into output 0.
Outs fp8_row_linear_forward(const Env& env, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "float8 linear input");
  Tensor scale, q;
  Fp8 x8 = cast(env, load_mat(x), Dtype::kFp8E4m3, Axis::kTensor, false,
                {.reduce = true, .scale_out = true, .q_out = true, .scale = &scale, .q = &q});
  next(env);
  Fp8 w8 = tp_weight(env, w);
  check(w8.value.cols() == x8.value.cols(), "float8 linear: weight and input widths differ");
  reciprocals(env, x8.inv, w8.inv, false);
  const int64_t R = x8.value.rows(), N = w8.value.rows();
  Tensor partial = env.workspace({R, N}, env.act);
  store_mat(partial, scaled_product(x8.value, w8.value.transpose(), x8.inv, w8.inv, false, {}));
  next(env);
  Tensor out = env.output({R / env.tp_size(), N}, env.act);
  env.comm().reduce_scatter(partial, out);
  return {out, q, scale};
}

// The gradient shard cast to e5m2 (max all-reduced), all-gathered as float8, then the linear's
// backward on it and the kept float8 input (outputs 1 and 2).
void fp8_row_linear_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& q8 = need(a.outputs, 1, "float8 input");
  Fp8 x8 = decode(q8, need(a.outputs, 2, "float8 input scale"));
  const Tensor& g = need(a.grad_outputs, 0, "float8 linear output gradient");
  Tensor scale, shard;
  cast(env, load_mat(g), Dtype::kFp8E5m2, Axis::kTensor, false,
       {.reduce = true, .scale = &scale, .q = &shard});
  next(env);
  Tensor gathered = env.workspace({g.type.shape.at(0) * env.tp_size(), g.type.shape.at(1)},
                                  Dtype::kFp8E5m2);
  env.comm().all_gather(shard, gathered);
  next(env);
  fp8_tp_linear_backward(env, a, decode(gathered, scale), x8, {q8.type.shape, Dtype::kBf16});
}

}  // namespace np::exec::cpu
