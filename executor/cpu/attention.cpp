// Causal self-attention over the full sequence, scale 1/sqrt(head_dim), GQA: FlashAttention (keeps
// output and logsumexp, recomputes the probabilities in backward) and the eager ops (scores Q K^T,
// masked softmax, probs V). qkv rows are [q heads | k heads | v heads], row t = pos*b + batch;
// q and k heads are head_dim wide, v heads dv (the attrs' v_head_dim, MLA's; else head_dim).
#include <cmath>
#include <limits>

#include "executor/cpu/kernels.hpp"

namespace np::exec::cpu {

namespace {

// Shapes of one attention op and the column of each head in a qkv row.
struct Geo {
  int64_t b, s, hq, hkv, d, dv, width;
  float scale;
  Geo(const Env& env, const Tensor& qkv) {
    const OpAttrs& a = env.attrs();
    b = a.batch, s = a.seq, hq = a.heads, hkv = a.kv_heads, d = a.head_dim, dv = a.v_dim();
    check(b > 0 && s > 0 && hq > 0 && hkv > 0 && d > 0 && hq % hkv == 0,
          "attention: bad batch/seq/heads/head_dim attrs");
    width = (hq + hkv) * d + hkv * dv;
    check(dim(qkv, 0) == b * s && row_width(qkv) == width,
          "attention: qkv is not {s*b, (heads + kv_heads) head_dim + kv_heads v_head_dim}");
    scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  }
  int64_t row(int64_t bi, int64_t pos) const { return pos * b + bi; }
  int64_t kv(int64_t h) const { return h / (hq / hkv); }
  int64_t q_col(int64_t h) const { return h * d; }
  int64_t k_col(int64_t h) const { return (hq + kv(h)) * d; }
  int64_t v_col(int64_t h) const { return (hq + hkv) * d + kv(h) * dv; }
  int64_t o_col(int64_t h) const { return h * dv; }
  int64_t score(int64_t bi, int64_t h, int64_t i, int64_t j) const {
    return ((bi * hq + h) * s + i) * s + j;
  }
  int64_t stat(int64_t bi, int64_t h, int64_t i) const { return (bi * hq + h) * s + i; }
};

float dot(const float* x, const float* y, int64_t n) {
  float acc = 0;
  for (int64_t c = 0; c < n; ++c) acc += x[c] * y[c];
  return acc;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t c = 0; c < n; ++c) y[c] += a * x[c];
}

}  // namespace

// ---- FlashAttention
// ------------------------------------------------------------------------------
// One implementation for the full sequence and for context parallelism: queries are rows
// u*b + bi of X (q heads at columns h*d), keys and values rows of K (the full-sequence kernel: X
// itself, K/V after the q heads; under CP: the gathered K/V), visited in global position order
// through key_row; a query at global position i sees keys 0..i.

namespace {
struct Flash {
  int64_t b, s, sl, hq, hkv, d, dv;  // sl: this rank's positions per sequence (s / cp)
  int64_t kv_off;                // column of the first K head in K's rows
  float scale;
  std::vector<int64_t> key_row;  // global position p -> K's row for batch 0 (add bi)
  std::vector<int64_t> q_pos;    // local position u -> its global position
  // rows x width: the queries' tensor ([q | k | v] rows without CP).
  Flash(const Env& env, int64_t rows, int64_t width, const Tensor* kv) {
    const OpAttrs& a = env.attrs();
    int64_t cp = kv ? a.group : 1;
    b = a.batch, s = a.seq, hq = a.heads, hkv = a.kv_heads, d = a.head_dim, dv = a.v_dim();
    check(b > 0 && s > 0 && hq > 0 && hkv > 0 && d > 0 && hq % hkv == 0 && cp > 0 &&
              (cp == 1 || s % (2 * cp) == 0),
          "attention: bad batch/seq/heads/head_dim/group attrs");
    sl = s / cp;
    check(rows == b * sl && width == (hq + hkv) * d + hkv * dv,
          "attention: qkv is not {s/cp*b, (heads + kv_heads) head_dim + kv_heads v_head_dim}");
    check(!kv || (dim(*kv, 0) == b * s && row_width(*kv) == hkv * (d + dv)),
          "attention: the gathered kv is not {s*b, kv_heads (head_dim + v_head_dim)}");
    kv_off = kv ? 0 : hq * d;
    scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
    key_row.assign(static_cast<size_t>(s), 0);
    q_pos.assign(static_cast<size_t>(sl), 0);
    OpContext pos = env.ctx;
    for (int64_t c = 0; c < cp; ++c) {
      pos.cp_rank = c;
      for (int64_t u = 0; u < sl; ++u)
        key_row[global_token_row(pos, u * b) / b] = c * b * sl + u * b;
    }
    for (int64_t u = 0; u < sl; ++u) q_pos[u] = kv ? global_token_row(env.ctx, u * b) / b : u;
  }
  int64_t k_col(int64_t h) const { return kv_off + (h / (hq / hkv)) * d; }
  int64_t v_col(int64_t h) const { return kv_off + hkv * d + (h / (hq / hkv)) * dv; }
  int64_t stat(int64_t bi, int64_t h, int64_t u) const { return (bi * hq + h) * sl + u; }

  void forward(const Mat& X, const Mat& K, Mat& O, float* lse) const {
    std::vector<float> sc(s);
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t u = 0; u < sl; ++u) {
          int64_t ti = u * b + bi, i = q_pos[u];
          float m = -std::numeric_limits<float>::infinity();
          for (int64_t j = 0; j <= i; ++j) {
            sc[j] = scale * dot(&X(ti, h * d), &K(key_row[j] + bi, k_col(h)), d);
            m = std::max(m, sc[j]);
          }
          double l = 0;
          for (int64_t j = 0; j <= i; ++j) l += sc[j] = std::exp(sc[j] - m);
          float inv = static_cast<float>(1.0 / l);
          for (int64_t j = 0; j <= i; ++j)
            axpy(sc[j] * inv, &K(key_row[j] + bi, v_col(h)), &O(ti, h * dv), dv);
          lse[stat(bi, h, u)] = m + static_cast<float>(std::log(l));
        }
  }

  // FlashAttention-2 backward: D = rowsum(dO * O); P = exp(scale q.k - lse); dV += P dO;
  // dS = P (dO.v - D); dQ += scale dS k (fp32 workspace dQ); dK += scale dS q. dK has K's shape.
  void backward(const Mat& X, const Mat& K, const Mat& O, const Mat& dO, const float* lse,
                float* dQ, float* D, Mat& dK) const {
    int64_t T = b * sl;
    std::fill(dQ, dQ + T * hq * d, 0.0f);
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t h = 0; h < hq; ++h) {
        for (int64_t u = 0; u < sl; ++u) {
          int64_t ti = u * b + bi;
          D[stat(bi, h, u)] = dot(&dO(ti, h * dv), &O(ti, h * dv), dv);
        }
        for (int64_t u = 0; u < sl; ++u) {
          int64_t ti = u * b + bi, i = q_pos[u];
          const float* q = &X(ti, h * d);
          const float* go = &dO(ti, h * dv);
          float* dq_i = dQ + ti * hq * d + h * d;
          for (int64_t j = 0; j <= i; ++j) {
            int64_t tj = key_row[j] + bi;
            const float* k = &K(tj, k_col(h));
            float p = std::exp(scale * dot(q, k, d) - lse[stat(bi, h, u)]);
            axpy(p, go, &dK(tj, v_col(h)), dv);
            float ds = p * (dot(go, &K(tj, v_col(h)), dv) - D[stat(bi, h, u)]);
            axpy(scale * ds, k, dq_i, d);
            axpy(scale * ds, q, &dK(tj, k_col(h)), d);
          }
        }
      }
  }
};

Outs flash_forward(const Env& env, const Tensor& qkv, const Tensor* kv) {
  Flash f(env, dim(qkv, 0), row_width(qkv), kv);
  Mat X = load_mat(qkv), O = Mat::Zero(f.b * f.sl, f.hq * f.dv);
  Tensor out = env.output({f.b * f.sl, f.hq * f.dv}, env.act),
         lse = env.output({f.b, f.hq, f.sl}, Dtype::kFp32);
  if (kv)
    f.forward(X, load_mat(*kv), O, lse.as<float>());
  else
    f.forward(X, X, O, lse.as<float>());
  store_mat(out, O);
  return {out, lse};
}

void flash_backward(const Env& env, const BackwardArgs& a, bool cp) {
  const Tensor& qkv = need(a.inputs, 0, "attention qkv");
  const Tensor* kv = cp ? &need(a.inputs, 1, "gathered kv") : nullptr;
  Flash f(env, dim(qkv, 0), row_width(qkv), kv);
  Mat X = load_mat(qkv), O = load_mat(need(a.outputs, 0, "attention output"));
  Mat dO = load_mat(need(a.grad_outputs, 0, "attention output gradient"));
  Mat K = kv ? load_mat(*kv) : Mat();
  const float* lse = need(a.outputs, 1, "attention logsumexp").as<float>();
  int64_t T = f.b * f.sl;
  Tensor dq = env.workspace({T, f.hq * f.d}, Dtype::kFp32),
         rs = env.workspace({f.b, f.hq, f.sl}, Dtype::kFp32);
  // Full sequence: the K/V columns of the qkv gradient accumulate in dK = dX; under CP they go to
  // the gathered K/V's gradient and dX keeps the Q columns only.
  Mat dK = Mat::Zero(kv ? K.rows() : T, kv ? K.cols() : X.cols());
  f.backward(X, kv ? K : X, O, dO, lse, dq.as<float>(), rs.as<float>(), dK);
  Mat dX = kv ? Mat::Zero(T, X.cols()) : std::move(dK);
  const float* dQ = dq.as<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < f.hq * f.d; ++c) dX(t, c) = dQ[t * f.hq * f.d + c];
  grad_input(env, a, 0, qkv.type, dX);
  if (kv) grad_input(env, a, 1, kv->type, dK);
}

// SDPA on separate q, k, v (the torchtitan profile): their rows side by side as one [q | k | v]
// staging matrix for the same kernel.
Mat side_by_side(Ins in) {
  const Tensor& q = need(in, 0, "sdpa queries");
  const Tensor& k = need(in, 1, "sdpa keys");
  const Tensor& v = need(in, 2, "sdpa values");
  check(dim(k, 0) == dim(q, 0) && dim(v, 0) == dim(q, 0), "sdpa: q, k and v rows differ");
  Mat X(dim(q, 0), row_width(q) + row_width(k) + row_width(v));
  X << load_mat(q), load_mat(k), load_mat(v);
  return X;
}

}  // namespace

Outs sdpa_forward(const Env& env, Ins in, Ins) {
  Mat X = side_by_side(in);
  Flash f(env, X.rows(), X.cols(), nullptr);
  Mat O = Mat::Zero(X.rows(), f.hq * f.dv);
  Tensor out = env.output({X.rows(), f.hq * f.dv}, env.act),
         lse = env.output({f.b, f.hq, f.sl}, Dtype::kFp32);
  f.forward(X, X, O, lse.as<float>());
  store_mat(out, O);
  return {out, lse};
}

// The op table's scratch: the fp32 dQ accumulator and rowsum(dO * O), and under GQA dK and dV of
// every query head (FlashAttention-2's dk_expanded, dv_expanded), summed per K/V head here.
void sdpa_backward(const Env& env, const BackwardArgs& a) {
  Mat X = side_by_side(a.inputs);
  Flash f(env, X.rows(), X.cols(), nullptr);
  const int64_t T = X.rows();
  Mat O = load_mat(need(a.outputs, 0, "sdpa output"));
  Mat dO = load_mat(need(a.grad_outputs, 0, "sdpa output gradient"));
  const float* lse = need(a.outputs, 1, "sdpa logsumexp").as<float>();
  Tensor dq = env.workspace({T, f.hq * f.d}, Dtype::kFp32),
         rs = env.workspace({f.b, f.hq, f.sl}, Dtype::kFp32);
  if (f.hkv < f.hq) {
    env.workspace({T, f.hq * f.d}, env.act);
    env.workspace({T, f.hq * f.dv}, env.act);
  }
  Mat dX = Mat::Zero(T, X.cols());
  f.backward(X, X, O, dO, lse, dq.as<float>(), rs.as<float>(), dX);
  const float* dQ = dq.as<float>();
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < f.hq * f.d; ++c) dX(t, c) = dQ[t * f.hq * f.d + c];
  const int64_t wq = f.hq * f.d, wk = f.hkv * f.d, wv = f.hkv * f.dv;
  grad_input(env, a, 0, a.inputs[0].type, dX.leftCols(wq));
  grad_input(env, a, 1, a.inputs[1].type, dX.middleCols(wq, wk));
  grad_input(env, a, 2, a.inputs[2].type, dX.rightCols(wv));
}

Outs flash_attention_forward(const Env& env, Ins in, Ins) {
  return flash_forward(env, need(in, 0, "attention qkv"), nullptr);
}
void flash_attention_backward(const Env& env, const BackwardArgs& a) {
  flash_backward(env, a, false);
}

// Context parallelism: this rank's queries (global positions from global_token_row) against the
// K/V of every CP rank (rank-major rows, each rank's in its local order).
Outs flash_attention_cp_forward(const Env& env, Ins in, Ins) {
  return flash_forward(env, need(in, 0, "attention qkv"), &need(in, 1, "gathered kv"));
}
void flash_attention_cp_backward(const Env& env, const BackwardArgs& a) {
  flash_backward(env, a, true);
}

// ---- Eager: scores = Q K^T (unscaled; entries above the diagonal are 0 and carry no gradient)
// ------

Outs attn_scores_forward(const Env& env, Ins in, Ins) {
  const Tensor& qkv = need(in, 0, "attention qkv");
  Geo g(env, qkv);
  Mat X = load_mat(qkv), S = Mat::Zero(g.b * g.hq * g.s, g.s);
  float* sp = S.data();
  for (int64_t bi = 0; bi < g.b; ++bi)
    for (int64_t h = 0; h < g.hq; ++h)
      for (int64_t i = 0; i < g.s; ++i)
        for (int64_t j = 0; j <= i; ++j)
          sp[g.score(bi, h, i, j)] =
              dot(&X(g.row(bi, i), g.q_col(h)), &X(g.row(bi, j), g.k_col(h)), g.d);
  Tensor out = env.output({g.b, g.hq, g.s, g.s}, env.act);
  store_mat(out, S);
  return {out};
}

void attn_scores_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& qkv = need(a.inputs, 0, "attention qkv");
  Geo g(env, qkv);
  Mat X = load_mat(qkv), G = load_mat(need(a.grad_outputs, 0, "scores gradient"));
  const float* gp = G.data();
  Mat dX = Mat::Zero(g.b * g.s, g.width);
  for (int64_t bi = 0; bi < g.b; ++bi)
    for (int64_t h = 0; h < g.hq; ++h)
      for (int64_t i = 0; i < g.s; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          float gs = gp[g.score(bi, h, i, j)];
          int64_t ti = g.row(bi, i), tj = g.row(bi, j);
          axpy(gs, &X(tj, g.k_col(h)), &dX(ti, g.q_col(h)), g.d);
          axpy(gs, &X(ti, g.q_col(h)), &dX(tj, g.k_col(h)), g.d);
        }
  grad_input(env, a, 0, qkv.type, dX);
}

// ---- Eager: probs = causal softmax(scale * scores) along the last dim
// -----------------------------

namespace {
// The causal softmax of scale * scores, one row of P per (batch, head, query), in fp32.
Mat causal_softmax(const Env& env, const Tensor& x) {
  int64_t s = dim(x, 3), d = env.attrs().head_dim;
  check(d > 0 && dim(x, 2) == s, "softmax: needs {b, heads, s, s} scores and head_dim");
  float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  Mat P = load_rows(x, x.numel() / s, s);
  for (int64_t r = 0; r < P.rows(); ++r) {
    int64_t i = r % s;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j <= i; ++j) m = std::max(m, scale * P(r, j));
    double z = 0;
    for (int64_t j = 0; j <= i; ++j) z += P(r, j) = std::exp(scale * P(r, j) - m);
    float inv = static_cast<float>(1.0 / z);
    for (int64_t j = 0; j < s; ++j) P(r, j) = j <= i ? P(r, j) * inv : 0.0f;
  }
  return P;
}
// G becomes the scores' gradient: scale * p * (g - sum_j p g), per row.
void softmax_grad(const Mat& P, Mat& G, const Env& env) {
  float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(env.attrs().head_dim)));
  for (int64_t r = 0; r < P.rows(); ++r) {
    double dotpg = 0;
    for (int64_t j = 0; j < P.cols(); ++j) dotpg += double(P(r, j)) * G(r, j);
    for (int64_t j = 0; j < P.cols(); ++j)
      G(r, j) = scale * P(r, j) * (G(r, j) - static_cast<float>(dotpg));
  }
}
}  // namespace

Outs softmax_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "softmax input");
  Mat P = causal_softmax(env, x);
  Tensor out = env.output(x.type.shape, x.type.dtype);
  store_mat(out, P);
  return {out};
}

// dx = scale * p * (g - sum_j p g): reads the output only.
void softmax_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& p = need(a.outputs, 0, "softmax output");
  int64_t s = dim(p, 3);
  Mat P = load_rows(p, p.numel() / s, s),
      G = load_rows(need(a.grad_outputs, 0, "softmax gradient"), p.numel() / s, s);
  softmax_grad(P, G, env);
  grad_input(env, a, 0, p.type, G);
}

// ---- Eager, Hugging Face's: the softmax in fp32 (kept), then its cast (the context's input)
// ------

Outs softmax_fp32_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "softmax input");
  Mat P = causal_softmax(env, x);
  Tensor cast = env.output(x.type.shape, x.type.dtype), f = env.output(x.type.shape, Dtype::kFp32);
  store_mat(f, P);
  store_mat(cast, P);  // one rounding of the fp32 probabilities
  return {cast, f};
}

// dx = scale * p * (g - sum_j p g) from the kept fp32 p and the gradient cast to fp32.
void softmax_fp32_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& p = need(a.outputs, 1, "softmax fp32 output");
  int64_t s = dim(p, 3);
  const Tensor& gin = need(a.grad_outputs, 0, "softmax gradient");
  Tensor g32 = env.workspace(p.type.shape, Dtype::kFp32);
  store_mat(g32, load_rows(gin, p.numel() / s, s));
  Mat P = load_rows(p, p.numel() / s, s), G = load_rows(g32, p.numel() / s, s);
  softmax_grad(P, G, env);
  grad_input(env, a, 0, gin.type, G);
}

// ---- Hugging Face's repeat_kv: [q | k | v] -> [q | k repeated | v repeated] per query head -----

Outs repeat_kv_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "repeat_kv input");
  const OpAttrs& at = env.attrs();
  int64_t hq = at.heads, hkv = at.kv_heads, d = at.head_dim, T = dim(x, 0);
  check(hq > 0 && hkv > 0 && hq % hkv == 0 && row_width(x) == (hq + 2 * hkv) * d,
        "repeat_kv: the rows are not [q | k | v] of the attrs' heads");
  Mat X = load_mat(x), Y(T, 3 * hq * d);
  for (int64_t t = 0; t < T; ++t) {
    Y.row(t).head(hq * d) = X.row(t).head(hq * d);
    for (int64_t h = 0; h < hq; ++h) {
      int64_t g = h / (hq / hkv);
      Y.row(t).segment((hq + h) * d, d) = X.row(t).segment((hq + g) * d, d);
      Y.row(t).segment((2 * hq + h) * d, d) = X.row(t).segment((hq + hkv + g) * d, d);
    }
  }
  Tensor y = env.output({T, 3 * hq * d}, x.type.dtype);
  store_mat(y, Y);
  return {y};
}

void repeat_kv_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& gy = need(a.grad_outputs, 0, "repeat_kv gradient");
  const OpAttrs& at = env.attrs();
  int64_t hq = at.heads, hkv = at.kv_heads, d = at.head_dim, T = dim(gy, 0);
  Mat G = load_mat(gy), D = Mat::Zero(T, (hq + 2 * hkv) * d);
  for (int64_t t = 0; t < T; ++t) {
    D.row(t).head(hq * d) = G.row(t).head(hq * d);
    for (int64_t h = 0; h < hq; ++h) {  // the repeats summed in head order
      int64_t g = h / (hq / hkv);
      D.row(t).segment((hq + g) * d, d) += G.row(t).segment((hq + h) * d, d);
      D.row(t).segment((hq + hkv + g) * d, d) += G.row(t).segment((2 * hq + h) * d, d);
    }
  }
  grad_input(env, a, 0, {{T, (hq + 2 * hkv) * d}, gy.type.dtype}, D);
}

// ---- Eager: context = probs V over j <= i (probs above the diagonal are not read)
// -----------------

Outs attn_context_forward(const Env& env, Ins in, Ins) {
  const Tensor& probs = need(in, 0, "attention probs");
  const Tensor& qkv = need(in, 1, "attention qkv");
  Geo g(env, qkv);
  check(probs.numel() == g.b * g.hq * g.s * g.s, "attn_context: probs are not {b, heads, s, s}");
  Mat X = load_mat(qkv), P = load_rows(probs, g.b * g.hq * g.s, g.s),
      O = Mat::Zero(g.b * g.s, g.hq * g.dv);
  const float* pp = P.data();
  for (int64_t bi = 0; bi < g.b; ++bi)
    for (int64_t h = 0; h < g.hq; ++h)
      for (int64_t i = 0; i < g.s; ++i)
        for (int64_t j = 0; j <= i; ++j)
          axpy(pp[g.score(bi, h, i, j)], &X(g.row(bi, j), g.v_col(h)), &O(g.row(bi, i), g.o_col(h)),
               g.dv);
  Tensor out = env.output({g.b * g.s, g.hq * g.dv}, env.act);
  store_mat(out, O);
  return {out};
}

// dP_ij = dO_i . v_j (j <= i, else 0); dV_j += P_ij dO_i; q and k get no gradient here.
void attn_context_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& probs = need(a.inputs, 0, "attention probs");
  const Tensor& qkv = need(a.inputs, 1, "attention qkv");
  Geo g(env, qkv);
  Mat X = load_mat(qkv), P = load_rows(probs, g.b * g.hq * g.s, g.s);
  Mat dO = load_mat(need(a.grad_outputs, 0, "context gradient"));
  Mat dP = Mat::Zero(g.b * g.hq * g.s, g.s), dX = Mat::Zero(g.b * g.s, g.width);
  const float* pp = P.data();
  float* dp = dP.data();
  for (int64_t bi = 0; bi < g.b; ++bi)
    for (int64_t h = 0; h < g.hq; ++h)
      for (int64_t i = 0; i < g.s; ++i)
        for (int64_t j = 0; j <= i; ++j) {
          int64_t ti = g.row(bi, i), tj = g.row(bi, j), k = g.score(bi, h, i, j);
          dp[k] = dot(&dO(ti, g.o_col(h)), &X(tj, g.v_col(h)), g.dv);
          axpy(pp[k], &dO(ti, g.o_col(h)), &dX(tj, g.v_col(h)), g.dv);
        }
  grad_input(env, a, 0, probs.type, dP);
  grad_input(env, a, 1, qkv.type, dX);
}

}  // namespace np::exec::cpu
