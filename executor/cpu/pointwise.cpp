// Row-wise and element-wise ops: RmsNorm and LayerNorm (statistics kept as outputs or recomputed in
// backward), RoPE, dropout (counter-based mask), SwiGLU (fused, or act and product), GeLU (tanh)
// and the residual add.
#include <cmath>

#include "executor/cpu/kernels.hpp"

namespace np::exec::cpu {

namespace {
constexpr double kEps = kNormEps;
// The norm kinds that keep their statistics as outputs (the profile's variant).
bool keeps_stats(const Env& env) {
  return env.ctx.op->kind == OpKind::kRmsNormStats || env.ctx.op->kind == OpKind::kLayerNormStats;
}
// The norm's output y of the input's type, or in float8 before a TE LayerNorm-linear (te_fp8).
Tensor norm_output(const Env& env, const Mat& y, const TensorType& x) {
  if (env.attrs().fp8 != Fp8Recipe::kNone) return te_norm_output(env, y, x.dtype);
  Tensor out = env.output(x.shape, x.dtype);
  store_mat(out, y);
  return out;
}
}  // namespace

// ---- RmsNorm: y = x * rsqrt(mean(x^2) + eps) * w ------------------------------------------------
// kRmsNormStats keeps each row's fp32 1/rms as a second output, which its backward reads; kRmsNorm
// recomputes it there (into the op table's backward workspace).

Outs rmsnorm_forward(const Env& env, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "rmsnorm input");
  Mat X = load_mat(x), W = load_vec(need(w, 0, "rmsnorm weight"));
  int64_t T = X.rows(), h = X.cols();
  Mat Y(T, h), R(T, 1);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t c = 0; c < h; ++c) ss += double(X(t, c)) * X(t, c);
    float r = static_cast<float>(1.0 / std::sqrt(ss / h + kEps));
    R(t, 0) = r;
    for (int64_t c = 0; c < h; ++c) Y(t, c) = X(t, c) * r * W(0, c);
  }
  Tensor out = norm_output(env, Y, x.type);
  if (!keeps_stats(env)) return {out};
  Tensor rstd = env.output({T}, Dtype::kFp32);
  store_mat(rstd, R);
  return {out, rstd};
}

void rmsnorm_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& x = need(a.inputs, 0, "rmsnorm input");
  Mat X = load_mat(x), G = load_mat(need(a.grad_outputs, 0, "rmsnorm output gradient"));
  Mat W = load_vec(need(a.weights, 0, "rmsnorm weight"));
  int64_t T = X.rows(), h = X.cols();
  // The per-row 1/rms: kept by the forward, or recomputed into the op table's workspace.
  bool kept = keeps_stats(env);
  float* rstd = kept ? need(a.outputs, 1, "rmsnorm rstd").as<float>()
                     : env.workspace({T}, Dtype::kFp32).as<float>();
  Mat DX(T, h), DW(T, h);  // DW: per-row contributions, summed over rows below
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0, gwx = 0;
    for (int64_t c = 0; c < h; ++c)
      ss += double(X(t, c)) * X(t, c), gwx += double(G(t, c)) * W(0, c) * X(t, c);
    double r = kept ? double(rstd[t]) : 1.0 / std::sqrt(ss / h + kEps);
    rstd[t] = static_cast<float>(r);
    double k = r * r * r * gwx / h;
    for (int64_t c = 0; c < h; ++c) {
      DX(t, c) = static_cast<float>(r * G(t, c) * W(0, c) - k * X(t, c));
      DW(t, c) = static_cast<float>(G(t, c) * X(t, c) * r);
    }
  }
  grad_input(env, a, 0, x.type, DX);
  add_mat(need(a.weight_grads, 0, "rmsnorm weight gradient"), column_sums(DW));
}

// ---- RmsNorm as PyTorch ops (Hugging Face's LlamaRMSNorm)
// ------------------------------------------ a = fp32(x) (kept), r = rsqrt(mean(a^2) + eps) (kept),
// b = a * r (fp32 scratch), c = bf16(b) (kept), y = w * c. Backward: dc = dy * w, db = fp32(dc) and
// da = db * r - a r^3 mean(db * a) in the two fp32 workspaces, dx = da; dw = column sums of dy * c.

Outs rmsnorm_hf_forward(const Env& env, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "rmsnorm input");
  Mat X = load_mat(x), W = load_vec(need(w, 0, "rmsnorm weight"));
  int64_t T = X.rows(), h = X.cols();
  Tensor y = env.output(x.type.shape, x.type.dtype), a = env.output(x.type.shape, Dtype::kFp32),
         r = env.output({T}, Dtype::kFp32), c = env.output(x.type.shape, x.type.dtype);
  Tensor b = env.workspace(x.type.shape, Dtype::kFp32);
  store_mat(a, X);
  Mat R(T, 1);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t k = 0; k < h; ++k) ss += double(X(t, k)) * X(t, k);
    R(t, 0) = static_cast<float>(1.0 / std::sqrt(ss / h + kEps));
  }
  store_mat(r, R);
  Mat B = X.array().colwise() * R.col(0).array();
  store_mat(b, B);
  store_mat(c, B);  // rounded to the activation dtype once
  Mat C = load_mat(c);
  Mat Y = C.array().rowwise() * W.row(0).array();
  store_mat(y, Y);
  return {y, a, r, c, b};
}

void rmsnorm_hf_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& at = need(a.outputs, 1, "rmsnorm fp32 input");
  Mat A = load_mat(at), R = load_rows(need(a.outputs, 2, "rmsnorm rstd"), dim(at, 0), 1),
      C = load_mat(need(a.outputs, 3, "rmsnorm normalized"));
  Mat G = load_mat(need(a.grad_outputs, 0, "rmsnorm output gradient"));
  Mat W = load_vec(need(a.weights, 0, "rmsnorm weight"));
  int64_t T = A.rows(), h = A.cols();
  Tensor db = env.workspace(at.type.shape, Dtype::kFp32),
         da = env.workspace(at.type.shape, Dtype::kFp32);
  Mat DB = G.array().rowwise() * W.row(0).array();
  store_mat(db, DB);
  Mat DA(T, h);
  for (int64_t t = 0; t < T; ++t) {
    double dot = 0;
    for (int64_t k = 0; k < h; ++k) dot += double(DB(t, k)) * A(t, k);
    double r = R(t, 0), k3 = r * r * r * dot / h;
    for (int64_t k = 0; k < h; ++k) DA(t, k) = static_cast<float>(DB(t, k) * r - A(t, k) * k3);
  }
  store_mat(da, DA);
  grad_input(env, a, 0, {at.type.shape, need(a.outputs, 3, "rmsnorm normalized").type.dtype}, DA);
  add_mat(need(a.weight_grads, 0, "rmsnorm weight gradient"),
          column_sums(Mat(G.array() * C.array())));
}

// ---- LayerNorm: y = (x - mu) * rsqrt(var + eps) * w + bias --------------------------------------

Outs layernorm_forward(const Env& env, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "layernorm input");
  Mat X = load_mat(x), W = load_vec(need(w, 0, "layernorm weight")),
      B = load_vec(need(w, 1, "layernorm bias"));
  int64_t T = X.rows(), h = X.cols();
  Mat Y(T, h), M(T, 1), R(T, 1);
  for (int64_t t = 0; t < T; ++t) {
    double mu = 0, var = 0;
    for (int64_t c = 0; c < h; ++c) mu += X(t, c);
    mu /= h;
    for (int64_t c = 0; c < h; ++c) var += (X(t, c) - mu) * (X(t, c) - mu);
    double r = 1.0 / std::sqrt(var / h + kEps);
    M(t, 0) = static_cast<float>(mu), R(t, 0) = static_cast<float>(r);
    for (int64_t c = 0; c < h; ++c)
      Y(t, c) = static_cast<float>((X(t, c) - mu) * r) * W(0, c) + B(0, c);
  }
  Tensor out = norm_output(env, Y, x.type);
  if (!keeps_stats(env)) return {out};
  Tensor mean = env.output({T}, Dtype::kFp32), rstd = env.output({T}, Dtype::kFp32);
  store_mat(mean, M);
  store_mat(rstd, R);
  return {out, mean, rstd};
}

void layernorm_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& x = need(a.inputs, 0, "layernorm input");
  Mat X = load_mat(x), G = load_mat(need(a.grad_outputs, 0, "layernorm output gradient"));
  Mat W = load_vec(need(a.weights, 0, "layernorm weight"));
  int64_t T = X.rows(), h = X.cols();
  // The per-row statistics, mean then 1/std: kept by the forward, or recomputed into the op
  // table's workspaces.
  bool kept = keeps_stats(env);
  float* mean = kept ? need(a.outputs, 1, "layernorm mean").as<float>()
                     : env.workspace({T}, Dtype::kFp32).as<float>();
  float* rstd = kept ? need(a.outputs, 2, "layernorm rstd").as<float>()
                     : env.workspace({T}, Dtype::kFp32).as<float>();
  Mat DX(T, h), DW(T, h);
  std::vector<double> xh(h);
  for (int64_t t = 0; t < T; ++t) {
    double mu = 0, var = 0;
    for (int64_t c = 0; c < h; ++c) mu += X(t, c);
    mu /= h;
    for (int64_t c = 0; c < h; ++c) var += (X(t, c) - mu) * (X(t, c) - mu);
    double r = 1.0 / std::sqrt(var / h + kEps), mg = 0, mgx = 0;
    if (kept) mu = mean[t], r = rstd[t];
    mean[t] = static_cast<float>(mu), rstd[t] = static_cast<float>(r);
    for (int64_t c = 0; c < h; ++c) {
      xh[c] = (X(t, c) - mu) * r;
      double gh = double(G(t, c)) * W(0, c);
      mg += gh, mgx += gh * xh[c];
    }
    mg /= h, mgx /= h;
    for (int64_t c = 0; c < h; ++c) {
      DX(t, c) = static_cast<float>(r * (double(G(t, c)) * W(0, c) - mg - xh[c] * mgx));
      DW(t, c) = static_cast<float>(G(t, c) * xh[c]);
    }
  }
  grad_input(env, a, 0, x.type, DX);
  add_mat(need(a.weight_grads, 0, "layernorm weight gradient"), column_sums(DW));
  add_mat(need(a.weight_grads, 1, "layernorm bias gradient"), column_sums(G));
}
// ---- q/k norms: RmsNorm of each query and key head of a [q | k | v] row over head_dim -----------
// The q heads take q_weight, the k heads k_weight; v passes through. Each head's fp32 1/rms is
// kept ([rows, heads + kv_heads]) and read by the backward with the input.

namespace {
struct QkHeads {
  int64_t q, k, d;  // this rank's query and key heads, head_dim
};
QkHeads qk_heads(const Env& env, const Tensor& x) {
  const OpAttrs& a = env.ctx.op->attrs;
  check(x.type.shape.at(1) == (a.heads + 2 * a.kv_heads) * a.head_dim,
        "qk_norm: the row is not [q | k | v] of this rank's heads");
  return {a.heads, a.kv_heads, a.head_dim};
}
}  // namespace

namespace {

// RMSNorm of each of the first n.q + n.k heads (n.d features) of X's rows, the q heads by Wq and
// the k heads by Wk: Y (the rest of each row passed through) and R, one 1/rms per row and head.
void norm_heads(const Mat& X, const QkHeads& n, const Mat& Wq, const Mat& Wk, Mat& Y, Mat& R) {
  const int64_t T = X.rows();
  Y = X, R.resize(T, n.q + n.k);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < n.q + n.k; ++j) {
      const Mat& W = j < n.q ? Wq : Wk;
      double ss = 0;
      for (int64_t c = 0; c < n.d; ++c) ss += double(X(t, j * n.d + c)) * X(t, j * n.d + c);
      float r = static_cast<float>(1.0 / std::sqrt(ss / n.d + kEps));
      R(t, j) = r;
      for (int64_t c = 0; c < n.d; ++c) Y(t, j * n.d + c) = X(t, j * n.d + c) * r * W(0, c);
    }
}

// Its backward: DX (the rest of each row's gradient passed through) and, per row and head in
// (token, head) order, the weight gradients' contributions DWq and DWk (summed by the caller).
void norm_heads_grad(const Mat& X, const Mat& G, const Mat& R, const QkHeads& n, const Mat& Wq,
                     const Mat& Wk, Mat& DX, Mat& DWq, Mat& DWk) {
  const int64_t T = X.rows();
  DX = G, DWq.resize(T * n.q, n.d), DWk.resize(T * n.k, n.d);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < n.q + n.k; ++j) {
      bool q = j < n.q;
      const Mat& W = q ? Wq : Wk;
      double gwx = 0, r = R(t, j);
      for (int64_t c = 0; c < n.d; ++c)
        gwx += double(G(t, j * n.d + c)) * W(0, c) * X(t, j * n.d + c);
      double k3 = r * r * r * gwx / n.d;
      Mat& DW = q ? DWq : DWk;
      int64_t row = q ? t * n.q + j : t * n.k + (j - n.q);
      for (int64_t c = 0; c < n.d; ++c) {
        int64_t i = j * n.d + c;
        DX(t, i) = static_cast<float>(r * G(t, i) * W(0, c) - k3 * X(t, i));
        DW(row, c) = static_cast<float>(G(t, i) * X(t, i) * r);
      }
    }
}

// The forward and backward of the fused head norms: the q heads by weight 0, the k heads by the
// last weight (qk_norm's two; head_rmsnorm's one, its heads all q heads).
Outs norm_heads_op(const Env& env, const Tensor& x, Ins w, const QkHeads& n) {
  Mat X = load_mat(x), Wq = load_vec(need(w, 0, "head norm weight")),
      Wk = load_vec(need(w, w.size() - 1, "head norm weight")), Y, R;
  norm_heads(X, n, Wq, Wk, Y, R);
  Tensor out = env.output(x.type.shape, x.type.dtype),
         rstd = env.output({X.rows(), n.q + n.k}, Dtype::kFp32);
  store_mat(out, Y);
  store_mat(rstd, R);
  return {out, rstd};
}

void norm_heads_op_grad(const Env& env, const BackwardArgs& a, const Tensor& x, const QkHeads& n) {
  Mat X = load_mat(x), G = load_mat(need(a.grad_outputs, 0, "head norm output gradient"));
  Mat R = load_mat(need(a.outputs, 1, "head norm rstd"));
  Mat Wq = load_vec(need(a.weights, 0, "head norm weight")),
      Wk = load_vec(need(a.weights, a.weights.size() - 1, "head norm weight")), DX, DWq, DWk;
  norm_heads_grad(X, G, R, n, Wq, Wk, DX, DWq, DWk);
  grad_input(env, a, 0, x.type, DX);
  add_mat(need(a.weight_grads, 0, "head norm weight gradient"), column_sums(DWq));
  if (a.weight_grads.size() > 1)
    add_mat(need(a.weight_grads, 1, "head norm k weight gradient"), column_sums(DWk));
}

}  // namespace

Outs qk_norm_forward(const Env& env, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "qk_norm input");
  return norm_heads_op(env, x, w, qk_heads(env, x));
}

void qk_norm_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& x = need(a.inputs, 0, "qk_norm input");
  norm_heads_op_grad(env, a, x, qk_heads(env, x));
}

// ---- nn.RMSNorm(head_dim) on one tensor of heads (torchtitan's qwen3 q_norm, k_norm) --------

namespace {
QkHeads one_norm_heads(const Env& env, const Tensor& x) {
  const OpAttrs& a = env.attrs();
  check(a.head_dim > 0 && x.type.shape.at(1) == a.heads * a.head_dim,
        "head_rmsnorm: the row is not this rank's heads x head_dim");
  return {a.heads, 0, a.head_dim};
}
}  // namespace

Outs head_rmsnorm_forward(const Env& env, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "head_rmsnorm input");
  return norm_heads_op(env, x, w, one_norm_heads(env, x));
}

void head_rmsnorm_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& x = need(a.inputs, 0, "head_rmsnorm input");
  norm_heads_op_grad(env, a, x, one_norm_heads(env, x));
}

// ---- q/k norms as PyTorch ops (transformers' Qwen3RMSNorm per head) -----------------------------
// Per q and k head of each row, as rmsnorm_hf: a = fp32(x) (kept, [rows, (q + k) x d]), r = 1/rms
// (kept, [rows, q + k]), b = a r (fp32 scratch), c = bf16(b) (kept), y = w c; v passed through.

Outs qk_norm_hf_forward(const Env& env, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "qk_norm input");
  const QkHeads n = qk_heads(env, x);
  Mat X = load_mat(x), Wq = load_vec(need(w, 0, "qk_norm q weight")),
      Wk = load_vec(need(w, 1, "qk_norm k weight"));
  const int64_t T = X.rows(), nh = n.q + n.k, width = nh * n.d;
  Tensor y = env.output(x.type.shape, x.type.dtype), a = env.output({T, width}, Dtype::kFp32),
         r = env.output({T, nh}, Dtype::kFp32), c = env.output({T, width}, x.type.dtype);
  Tensor b = env.workspace({T, width}, Dtype::kFp32);
  Mat A = X.leftCols(width), R(T, nh), B(T, width);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < nh; ++j) {
      double ss = 0;
      for (int64_t k = 0; k < n.d; ++k) ss += double(A(t, j * n.d + k)) * A(t, j * n.d + k);
      R(t, j) = static_cast<float>(1.0 / std::sqrt(ss / n.d + kEps));
      for (int64_t k = 0; k < n.d; ++k) B(t, j * n.d + k) = A(t, j * n.d + k) * R(t, j);
    }
  store_mat(a, A);
  store_mat(r, R);
  store_mat(b, B);
  store_mat(c, B);  // rounded to the activation dtype once
  Mat C = load_mat(c), Y = X;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < nh; ++j)
      for (int64_t k = 0; k < n.d; ++k)
        Y(t, j * n.d + k) = (j < n.q ? Wq : Wk)(0, k) * C(t, j * n.d + k);
  store_mat(y, Y);
  return {y, a, r, c, b};
}

void qk_norm_hf_backward(const Env& env, const BackwardArgs& a) {
  // The input is not read (its fp32 copy is): the gradient has its shape.
  const Tensor& g = need(a.grad_outputs, 0, "qk_norm output gradient");
  const QkHeads n = qk_heads(env, g);
  const Tensor& at = need(a.outputs, 1, "qk_norm fp32 input");
  Mat A = load_mat(at), R = load_mat(need(a.outputs, 2, "qk_norm rstd")),
      C = load_mat(need(a.outputs, 3, "qk_norm normalized"));
  Mat G = load_mat(g);
  Mat Wq = load_vec(need(a.weights, 0, "qk_norm q weight")),
      Wk = load_vec(need(a.weights, 1, "qk_norm k weight"));
  const int64_t T = A.rows(), nh = n.q + n.k, width = nh * n.d;
  Tensor db = env.workspace(at.type.shape, Dtype::kFp32),
         da = env.workspace(at.type.shape, Dtype::kFp32);
  Mat DB(T, width), DA(T, width), DX = G;  // the values' gradient passes through
  Mat DWq(T * n.q, n.d), DWk(T * n.k, n.d);  // per head row, (token, head) order
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < nh; ++j) {
      const bool q = j < n.q;
      const Mat& W = q ? Wq : Wk;
      double dot = 0, r = R(t, j);
      for (int64_t k = 0; k < n.d; ++k) {
        int64_t i = j * n.d + k;
        DB(t, i) = G(t, i) * W(0, k);
        dot += double(DB(t, i)) * A(t, i);
      }
      double k3 = r * r * r * dot / n.d;
      Mat& DW = q ? DWq : DWk;
      int64_t row = q ? t * n.q + j : t * n.k + (j - n.q);
      for (int64_t k = 0; k < n.d; ++k) {
        int64_t i = j * n.d + k;
        DA(t, i) = static_cast<float>(DB(t, i) * r - A(t, i) * k3);
        DX(t, i) = DA(t, i);
        DW(row, k) = G(t, i) * C(t, i);
      }
    }
  store_mat(db, DB);
  store_mat(da, DA);
  grad_input(env, a, 0, g.type, DX);
  add_mat(need(a.weight_grads, 0, "qk_norm q weight gradient"), column_sums(DWq));
  add_mat(need(a.weight_grads, 1, "qk_norm k weight gradient"), column_sums(DWk));
}

// ---- RoPE (rotate-half, theta 10000) on the q and k heads of each qkv row; v passes through -----

namespace {

// The cos and +-sin of each rotated pair of a `d`-wide head at position pos (rotate-half, theta
// 10000): pair i is (i, i + d/2).
void rope_angles(double pos, int64_t d, double sign, std::vector<float>& cs,
                 std::vector<float>& sn) {
  int64_t half = d / 2;
  cs.resize(half), sn.resize(half);
  for (int64_t i = 0; i < half; ++i) {
    double ang = pos * std::pow(10000.0, -2.0 * i / d);
    cs[i] = static_cast<float>(std::cos(ang)), sn[i] = static_cast<float>(sign * std::sin(ang));
  }
}
// y = x rotated, over one head of 2 cs.size() features.
void rotate_head(const float* x, float* y, const std::vector<float>& cs,
                 const std::vector<float>& sn) {
  const size_t half = cs.size();
  for (size_t i = 0; i < half; ++i) {
    float x0 = x[i], x1 = x[i + half];
    y[i] = x0 * cs[i] - x1 * sn[i];
    y[i + half] = x1 * cs[i] + x0 * sn[i];
  }
}
// Position of row t of a token tensor of T rows.
double row_position(const Env& env, int64_t T, int64_t t) {
  return static_cast<double>(global_token_row(env.ctx, env.first_row(T) + t) / env.batch());
}

// Rotates the q and k heads of every row by +angle (forward) or -angle (backward).
Mat rope_apply(const Env& env, const Mat& X, double sign) {
  const ModelSpec& m = *env.ctx.model;
  int64_t tp = env.ctx.setup->tp, d = m.head_dim, rotated = m.heads / tp + m.kv_heads / tp;
  check(d % 2 == 0, "rope: head_dim must be even");
  check(X.cols() == (m.heads / tp + 2 * (m.kv_heads / tp)) * d,
        "rope: the row is not [q | k | v] of this rank's heads");
  Mat Y = X;
  std::vector<float> cs, sn;
  for (int64_t t = 0; t < X.rows(); ++t) {
    rope_angles(row_position(env, X.rows(), t), d, sign, cs, sn);
    for (int64_t hd = 0; hd < rotated; ++hd) rotate_head(&X(t, hd * d), &Y(t, hd * d), cs, sn);
  }
  return Y;
}

// MLA's geometry (the op's attrs): h heads of q/k width dqk, of which the last r features are the
// rotated part (dn = dqk - r content features), and v heads of width dv. The kv up-projection's
// rows are [k content of the h heads | v of the h heads] (its two column-parallel sections).
struct MlaGeo {
  int64_t h, dqk, r, dn, dv;
  explicit MlaGeo(const OpAttrs& a)
      : h(a.heads), dqk(a.head_dim), r(a.rope_dim), dn(a.head_dim - a.rope_dim),
        dv(a.v_head_dim) {
    check(h > 0 && r > 0 && r % 2 == 0 && dn > 0 && dv > 0,
          "mla_rope: bad heads/head_dim/rope_dim/v_head_dim attrs");
  }
  int64_t k_off() const { return h * dqk; }
  int64_t v_off() const { return 2 * h * dqk; }
};

}  // namespace

Outs rope_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "rope input");
  Tensor out = env.output(x.type.shape, x.type.dtype);
  store_mat(out, rope_apply(env, load_mat(x), 1.0));
  return {out};
}

void rope_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "rope output gradient");
  grad_input(env, a, 0, g.type, rope_apply(env, load_mat(g), -1.0));
}

// ---- torchtitan's RoPE (apply_rotary_emb): q and k as complex numbers of adjacent feature pairs
// (2i, 2i + 1) in fp32, times e^(i pos theta_i), cast back. Scratch as the op table lists it: fp32
// q and k (the casts), then fp32 q and k again (the products). Backward: the gradient times
// e^(-i pos theta_i), in the table's two fp32 workspaces. -----------------------------------------

namespace {
// Rotates every head of d features of each row of X by sign x the position's angles, pairing
// features 2i and 2i + 1.
Mat rope_pairs(const Env& env, const Mat& X, int64_t d, double sign) {
  check(d > 0 && d % 2 == 0 && X.cols() % d == 0, "rope_qk: rows are not heads of even head_dim");
  Mat Y(X.rows(), X.cols());
  std::vector<float> cs, sn;
  for (int64_t t = 0; t < X.rows(); ++t) {
    rope_angles(row_position(env, X.rows(), t), d, sign, cs, sn);
    for (int64_t c = 0; c < X.cols(); c += 2) {
      const size_t i = static_cast<size_t>((c % d) / 2);
      const float re = X(t, c), im = X(t, c + 1);
      Y(t, c) = re * cs[i] - im * sn[i];
      Y(t, c + 1) = re * sn[i] + im * cs[i];
    }
  }
  return Y;
}
}  // namespace

Outs rope_qk_forward(const Env& env, Ins in, Ins) {
  const Tensor& q = need(in, 0, "rope_qk queries");
  const Tensor& k = need(in, 1, "rope_qk keys");
  const int64_t d = env.attrs().head_dim;
  check(dim(q, 0) == dim(k, 0), "rope_qk: q and k rows differ");
  Tensor qo = env.output(q.type.shape, q.type.dtype), ko = env.output(k.type.shape, k.type.dtype);
  Tensor qf = env.workspace(q.type.shape, Dtype::kFp32), kf = env.workspace(k.type.shape, Dtype::kFp32),
         qp = env.workspace(q.type.shape, Dtype::kFp32), kp = env.workspace(k.type.shape, Dtype::kFp32);
  Mat Q = load_mat(q), K = load_mat(k);
  store_mat(qf, Q), store_mat(kf, K);
  Mat QR = rope_pairs(env, Q, d, 1.0), KR = rope_pairs(env, K, d, 1.0);
  store_mat(qp, QR), store_mat(kp, KR);
  store_mat(qo, QR), store_mat(ko, KR);
  return {qo, ko, qf, kf, qp, kp};
}

void rope_qk_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& gq = need(a.grad_outputs, 0, "rope_qk q gradient");
  const Tensor& gk = need(a.grad_outputs, 1, "rope_qk k gradient");
  const int64_t d = env.attrs().head_dim;
  const Tensor& big = gq.numel() >= gk.numel() ? gq : gk;
  Tensor w0 = env.workspace(big.type.shape, Dtype::kFp32), w1 = env.workspace(big.type.shape, Dtype::kFp32);
  (void)w1;
  Mat GQ = load_mat(gq), GK = load_mat(gk);
  store_mat(w0, gq.numel() >= gk.numel() ? GQ : GK);
  grad_input(env, a, 0, gq.type, rope_pairs(env, GQ, d, -1.0));
  grad_input(env, a, 1, gk.type, rope_pairs(env, GK, d, -1.0));
}

// ---- torchtitan's qwen3 RoPE: (x cos) + (rotate_half(x) sin) of q and k in bf16 ops, rotate_half
// pairing features i and i + head_dim / 2 (rotate_head's convention). Scratch as the op table
// lists it: the two products of the larger input, in forward and in backward. -------------------

namespace {
// Rotates every head of X's rows by sign x the position's angles, the half convention.
Mat rope_halves(const Env& env, const Mat& X, int64_t d, double sign) {
  check(d > 0 && d % 2 == 0 && X.cols() % d == 0,
        "rope_half_qk: rows are not heads of even head_dim");
  Mat Y(X.rows(), X.cols());
  std::vector<float> cs, sn;
  for (int64_t t = 0; t < X.rows(); ++t) {
    rope_angles(row_position(env, X.rows(), t), d, sign, cs, sn);
    for (int64_t h = 0; h < X.cols() / d; ++h) rotate_head(&X(t, h * d), &Y(t, h * d), cs, sn);
  }
  return Y;
}
}  // namespace

Outs rope_half_qk_forward(const Env& env, Ins in, Ins) {
  const Tensor& q = need(in, 0, "rope_half_qk queries");
  const Tensor& k = need(in, 1, "rope_half_qk keys");
  const int64_t d = env.attrs().head_dim;
  check(dim(q, 0) == dim(k, 0), "rope_half_qk: q and k rows differ");
  Tensor qo = env.output(q.type.shape, q.type.dtype), ko = env.output(k.type.shape, k.type.dtype);
  const Tensor& big = q.numel() >= k.numel() ? q : k;
  Tensor cos_part = env.workspace(big.type.shape, big.type.dtype),
         sin_part = env.workspace(big.type.shape, big.type.dtype);
  Mat Q = load_mat(q), K = load_mat(k), QR = rope_halves(env, Q, d, 1.0),
      KR = rope_halves(env, K, d, 1.0);
  // The larger input's two products: x cos, and the rest of the sum, rotate_half(x) sin.
  const Mat& X = q.numel() >= k.numel() ? Q : K;
  const Mat& XR = q.numel() >= k.numel() ? QR : KR;
  Mat C(X.rows(), X.cols());
  std::vector<float> cs, sn;
  for (int64_t t = 0; t < X.rows(); ++t) {
    rope_angles(row_position(env, X.rows(), t), d, 1.0, cs, sn);
    for (int64_t c = 0; c < X.cols(); ++c) C(t, c) = X(t, c) * cs[static_cast<size_t>(c % d % (d / 2))];
  }
  store_mat(cos_part, C);
  store_mat(sin_part, XR - C);
  store_mat(qo, QR);
  store_mat(ko, KR);
  return {qo, ko, cos_part, sin_part};
}

void rope_half_qk_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& gq = need(a.grad_outputs, 0, "rope_half_qk q gradient");
  const Tensor& gk = need(a.grad_outputs, 1, "rope_half_qk k gradient");
  const int64_t d = env.attrs().head_dim;
  const Tensor& big = gq.numel() >= gk.numel() ? gq : gk;
  env.workspace(big.type.shape, big.type.dtype);
  env.workspace(big.type.shape, big.type.dtype);
  grad_input(env, a, 0, gq.type, rope_halves(env, load_mat(gq), d, -1.0));
  grad_input(env, a, 1, gk.type, rope_halves(env, load_mat(gk), d, -1.0));
}

// ---- MLA's query, key and value rows: q's rope part rotated, k = [k content | rotated k_pe] per
// head, v copied -------------------------------------------------------------------------------

Outs mla_rope_forward(const Env& env, Ins in, Ins) {
  MlaGeo g(env.attrs());
  const Tensor& q = need(in, 0, "mla_rope queries");
  const Tensor& kv = need(in, 1, "mla_rope kv up-projection");
  const Tensor& pe = need(in, 2, "mla_rope keys' rope part");
  const int64_t T = dim(q, 0);
  check(row_width(q) == g.h * g.dqk && dim(kv, 0) == T && row_width(kv) == g.h * (g.dn + g.dv) &&
            dim(pe, 0) == T && row_width(pe) == g.r,
        "mla_rope: inputs are not [T, heads head_dim], [T, heads (nope + v)], [T, rope_dim]");
  Mat Q = load_mat(q), KV = load_mat(kv), PE = load_mat(pe), Y(T, g.v_off() + g.h * g.dv);
  std::vector<float> cs, sn;
  for (int64_t t = 0; t < T; ++t) {
    rope_angles(row_position(env, T, t), g.r, 1.0, cs, sn);
    for (int64_t hd = 0; hd < g.h; ++hd) {
      const int64_t qc = hd * g.dqk, kc = g.k_off() + hd * g.dqk;
      Y.row(t).segment(qc, g.dn) = Q.row(t).segment(qc, g.dn);
      rotate_head(&Q(t, qc + g.dn), &Y(t, qc + g.dn), cs, sn);
      Y.row(t).segment(kc, g.dn) = KV.row(t).segment(hd * g.dn, g.dn);
      rotate_head(&PE(t, 0), &Y(t, kc + g.dn), cs, sn);
      Y.row(t).segment(g.v_off() + hd * g.dv, g.dv) =
          KV.row(t).segment(g.h * g.dn + hd * g.dv, g.dv);
    }
  }
  Tensor out = env.output({T, Y.cols()}, q.type.dtype);
  store_mat(out, Y);
  return {out};
}

// The transpose: rotations by -angle, the heads' k_pe gradients summed in head order (all-reduced
// over TP when the op's backward collective says so: TP without SP).
void mla_rope_backward(const Env& env, const BackwardArgs& a) {
  MlaGeo g(env.attrs());
  Mat G = load_mat(need(a.grad_outputs, 0, "mla_rope output gradient"));
  const int64_t T = G.rows();
  Mat DQ(T, g.h * g.dqk), DKV(T, g.h * (g.dn + g.dv)), DPE = Mat::Zero(T, g.r);
  std::vector<float> r(static_cast<size_t>(g.r));
  std::vector<float> cs, sn;
  for (int64_t t = 0; t < T; ++t) {
    rope_angles(row_position(env, T, t), g.r, -1.0, cs, sn);
    for (int64_t hd = 0; hd < g.h; ++hd) {
      const int64_t qc = hd * g.dqk, kc = g.k_off() + hd * g.dqk;
      DQ.row(t).segment(qc, g.dn) = G.row(t).segment(qc, g.dn);
      rotate_head(&G(t, qc + g.dn), &DQ(t, qc + g.dn), cs, sn);
      DKV.row(t).segment(hd * g.dn, g.dn) = G.row(t).segment(kc, g.dn);
      rotate_head(&G(t, kc + g.dn), r.data(), cs, sn);
      for (int64_t i = 0; i < g.r; ++i) DPE(t, i) += r[static_cast<size_t>(i)];
      DKV.row(t).segment(g.h * g.dn + hd * g.dv, g.dv) =
          G.row(t).segment(g.v_off() + hd * g.dv, g.dv);
    }
  }
  if (env.ctx.op->bwd_collective == "all_reduce") {
    Tensor view{DPE.data(), {{DPE.rows(), DPE.cols()}, Dtype::kFp32}};
    env.comm().all_reduce(view);
  }
  const Dtype dt = need(a.grad_outputs, 0, "mla_rope output gradient").type.dtype;
  grad_input(env, a, 0, {{T, DQ.cols()}, dt}, DQ);
  grad_input(env, a, 1, {{T, DKV.cols()}, dt}, DKV);
  grad_input(env, a, 2, {{T, g.r}, dt}, DPE);
}

// ---- Dropout: keep iff counter_uniform(...) >= p; out = x / (1 - p) where kept ------------------
// Both comparisons and the division are in fp32: keep = u >= (float)p, out = x / (1.0f - (float)p).

Outs dropout_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "dropout input");
  const OpContext& ctx = env.ctx;
  float p = static_cast<float>(ctx.model->dropout), q = 1.0f - p;
  uint64_t stream = dropout_stream(ctx) ^ (static_cast<uint64_t>(ctx.mb) * 0x9E3779B97F4A7C15ull);
  Tensor out = env.output(x.type.shape, x.type.dtype), mask = env.output(x.type.shape, Dtype::kU8);
  uint8_t* mk = mask.as<uint8_t>();
  const std::vector<int64_t>& sh = x.type.shape;
  // Global element index: independent of the TP rank (heads) and of the SP shard (rows).
  auto index = [&](int64_t i) -> uint64_t {
    if (sh.size() == 4) {  // attention probs {b, heads_local, s, s}
      int64_t hl = sh[1], s = sh[2], j = i % s, r = i / s, row = r % s, hb = r / s, h = hb % hl,
              bi = hb / hl;
      int64_t H = hl * ctx.setup->tp;
      return static_cast<uint64_t>(((bi * H + ctx.tp_rank * hl + h) * s + row) * s + j);
    }
    int64_t f = row_width(x);
    return static_cast<uint64_t>(global_token_row(ctx, env.first_row(sh[0]) + i / f) * f + i % f);
  };
  for (int64_t i = 0; i < x.numel(); ++i) {
    bool keep = counter_uniform(ctx.seed, stream, index(i)) >= p;
    mk[i] = keep ? 1 : 0;
    store(out, i, keep ? load(x, i) / q : 0.0f);
  }
  return {out, mask};
}

void dropout_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "dropout output gradient");
  const Tensor& mask = need(a.outputs, 1, "dropout mask");
  float q = 1.0f - static_cast<float>(env.ctx.model->dropout);
  Mat G = load_mat(g);
  const uint8_t* mk = mask.as<uint8_t>();
  float* d = G.data();
  for (int64_t i = 0; i < G.size(); ++i) d[i] = mk[i] ? d[i] / q : 0.0f;
  grad_input(env, a, 0, g.type, G);
}

// ---- SwiGLU: input [gate | up], out = silu(gate) * up
// ---------------------------------------------

namespace {
// silu(gate) * up of each row of x = [gate | up], or (times_up false) silu(gate) alone.
Mat silu_gate(const Mat& X, bool times_up) {
  int64_t T = X.rows(), f = X.cols() / 2;
  check(X.cols() == 2 * f, "swiglu: the input width must be even");
  Mat Y(T, f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < f; ++c) {
      float gt = X(t, c), sg = 1.0f / (1.0f + std::exp(-gt));
      Y(t, c) = gt * sg * (times_up ? X(t, f + c) : 1.0f);
    }
  return Y;
}
// Its gradient with respect to x for the output gradient G: the gate half, and the up half
// (0 when times_up is false: the product's backward gives it).
Mat silu_gate_grad(const Mat& X, const Mat& G, bool times_up) {
  int64_t T = X.rows(), f = X.cols() / 2;
  Mat D = Mat::Zero(T, 2 * f);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < f; ++c) {
      float gt = X(t, c), up = times_up ? X(t, f + c) : 1.0f, sg = 1.0f / (1.0f + std::exp(-gt));
      D(t, c) = G(t, c) * up * (sg + gt * sg * (1.0f - sg));
      if (times_up) D(t, f + c) = G(t, c) * gt * sg;
    }
  return D;
}
Outs silu_gate_forward(const Env& env, Ins in, bool times_up) {
  Mat Y = silu_gate(load_mat(need(in, 0, times_up ? "swiglu input" : "glu_act input")), times_up);
  Tensor out = env.output({Y.rows(), Y.cols()}, env.act);
  store_mat(out, Y);
  return {out};
}
void silu_gate_backward(const Env& env, const BackwardArgs& a, bool times_up) {
  const Tensor& x = need(a.inputs, 0, times_up ? "swiglu input" : "glu_act input");
  Mat G = load_mat(need(a.grad_outputs, 0, "swiglu output gradient"));
  grad_input(env, a, 0, x.type, silu_gate_grad(load_mat(x), G, times_up));
}
}  // namespace

Outs swiglu_forward(const Env& env, Ins in, Ins) {
  return silu_gate_forward(env, in, true);
}

void swiglu_backward(const Env& env, const BackwardArgs& a) {
  silu_gate_backward(env, a, true);
}

// ---- The unfused GLU: a = silu(gate) of x = [gate | up], kept; then y = a * up ---------------

Outs glu_act_forward(const Env& env, Ins in, Ins) {
  return silu_gate_forward(env, in, false);
}

// The gate half of dx only; the up half's gradient comes from the product (0 here).
void glu_act_backward(const Env& env, const BackwardArgs& a) {
  silu_gate_backward(env, a, false);
}

Outs glu_mul_forward(const Env& env, Ins in, Ins) {
  const Tensor& act = need(in, 0, "glu_mul activation");
  const Tensor& x = need(in, 1, "glu_mul input");
  Mat A = load_mat(act), X = load_mat(x);
  int64_t T = A.rows(), f = A.cols();
  check(X.rows() == T && X.cols() == 2 * f, "glu_mul: the input is not [gate | up] of the act");
  Mat Y = A.array() * X.rightCols(f).array();
  Tensor out = env.output({T, f}, env.act);
  store_mat(out, Y);
  return {out};
}

void glu_mul_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& act = need(a.inputs, 0, "glu_mul activation");
  const Tensor& x = need(a.inputs, 1, "glu_mul input");
  Mat A = load_mat(act), X = load_mat(x),
      G = load_mat(need(a.grad_outputs, 0, "glu_mul output gradient"));
  int64_t T = A.rows(), f = A.cols();
  Mat DA = G.array() * X.rightCols(f).array();
  Mat DX = Mat::Zero(T, 2 * f);
  DX.rightCols(f) = G.array() * A.array();
  grad_input(env, a, 0, act.type, DA);
  grad_input(env, a, 1, x.type, DX);
}

// ---- F.silu and the elementwise product as PyTorch ops (torchtitan's FeedForward) ------------

namespace {
// An elementwise op's result: Y in a new output of x's shape and dtype.
Outs output_like(const Env& env, const Tensor& x, const Mat& Y) {
  Tensor out = env.output(x.type.shape, x.type.dtype);
  store_mat(out, Y);
  return {out};
}
}  // namespace

Outs silu_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "silu input");
  Mat X = load_mat(x);
  return output_like(env, x, X.array() / (1.0f + (-X.array()).exp()));
}

void silu_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& x = need(a.inputs, 0, "silu input");
  Mat X = load_mat(x), G = load_mat(need(a.grad_outputs, 0, "silu output gradient"));
  Mat S = 1.0f / (1.0f + (-X.array()).exp());
  Mat D = G.array() * (S.array() + X.array() * S.array() * (1.0f - S.array()));
  grad_input(env, a, 0, x.type, D);
}

Outs mul_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "mul input");
  const Tensor& y = need(in, 1, "mul input");
  check(x.numel() == y.numel() && dim(x, 0) == dim(y, 0), "mul: the inputs' shapes differ");
  return output_like(env, x, load_mat(x).array() * load_mat(y).array());
}

void mul_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& x = need(a.inputs, 0, "mul input");
  const Tensor& y = need(a.inputs, 1, "mul input");
  Mat G = load_mat(need(a.grad_outputs, 0, "mul output gradient"));
  Mat DX = G.array() * load_mat(y).array(), DY = G.array() * load_mat(x).array();
  grad_input(env, a, 0, x.type, DX);
  grad_input(env, a, 1, y.type, DY);
}

// ---- GeLU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// ---------------------

namespace {
constexpr float kGeluC = 0.7978845608028654f, kGeluA = 0.044715f;
}

Outs gelu_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "gelu input");
  Mat X = load_mat(x);
  float* d = X.data();
  for (int64_t i = 0; i < X.size(); ++i) {
    float v = d[i];
    d[i] = 0.5f * v * (1.0f + std::tanh(kGeluC * (v + kGeluA * v * v * v)));
  }
  return output_like(env, x, X);
}

void gelu_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& x = need(a.inputs, 0, "gelu input");
  Mat X = load_mat(x), G = load_mat(need(a.grad_outputs, 0, "gelu output gradient"));
  float* d = X.data();
  const float* g = G.data();
  for (int64_t i = 0; i < X.size(); ++i) {
    float v = d[i], th = std::tanh(kGeluC * (v + kGeluA * v * v * v));
    float dy =
        0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    d[i] = g[i] * dy;
  }
  grad_input(env, a, 0, x.type, X);
}

// ---- Add: out = a + b; both inputs get the output gradient
// ----------------------------------------

Outs add_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "add input a");
  const Tensor& y = need(in, 1, "add input b");
  check(x.numel() == y.numel(), "add: the inputs differ in size");
  Tensor out = env.output(x.type.shape, x.type.dtype);
  for (int64_t i = 0; i < x.numel(); ++i) store(out, i, load(x, i) + load(y, i));
  return {out};
}

void add_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "add output gradient");
  Mat G = load_mat(g);
  grad_input(env, a, 0, g.type, G);
  grad_input(env, a, 1, g.type, G);
}

// [a | b] along the features (multi-token prediction's concatenation); backward splits the
// gradient.
Outs concat_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "concat input a");
  const Tensor& y = need(in, 1, "concat input b");
  check(dim(x, 0) == dim(y, 0) && x.type.dtype == y.type.dtype,
        "concat: the inputs differ in rows or dtype");
  const int64_t T = dim(x, 0), a = row_width(x), b = row_width(y);
  check(env.attrs().features == a, "concat: features must give the first input's width");
  Tensor out = env.output({T, a + b}, x.type.dtype);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < a; ++j) store(out, t * (a + b) + j, load(x, t * a + j));
    for (int64_t j = 0; j < b; ++j) store(out, t * (a + b) + a + j, load(y, t * b + j));
  }
  return {out};
}

void concat_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "concat output gradient");
  const int64_t T = dim(g, 0), w0 = env.attrs().features;  // the first input's
  check(w0 > 0 && w0 < row_width(g), "concat: features must give the first input's width");
  Mat G = load_mat(g);
  Mat A = G.leftCols(w0), B = G.rightCols(G.cols() - w0);
  grad_input(env, a, 0, {{T, w0}, g.type.dtype}, A);
  grad_input(env, a, 1, {{T, G.cols() - w0}, g.type.dtype}, B);
}

}  // namespace np::exec::cpu
