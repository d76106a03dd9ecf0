// Causal self-attention over the full sequence, scale 1/sqrt(head_dim), GQA: FlashAttention (keeps
// output and logsumexp, recomputes the probabilities in backward) and the eager ops (scores Q K^T,
// masked softmax, probs V). qkv rows are [q heads | k heads | v heads], row t = pos*b + batch.
#include <cmath>
#include <limits>

#include "executor/cpu/kernels.hpp"

namespace np::exec::cpu {

namespace {

// Shapes of one attention op and the column of each head in a qkv row.
struct Geo {
  int64_t b, s, hq, hkv, d, width;
  float scale;
  Geo(const Env& env, const Tensor& qkv) {
    const OpAttrs& a = env.attrs();
    b = a.batch, s = a.seq, hq = a.heads, hkv = a.kv_heads, d = a.head_dim;
    check(b > 0 && s > 0 && hq > 0 && hkv > 0 && d > 0 && hq % hkv == 0,
          "attention: bad batch/seq/heads/head_dim attrs");
    width = (hq + 2 * hkv) * d;
    check(dim(qkv, 0) == b * s && row_width(qkv) == width,
          "attention: qkv is not {s*b, (heads + 2 kv_heads) head_dim}");
    scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  }
  int64_t row(int64_t bi, int64_t pos) const { return pos * b + bi; }
  int64_t kv(int64_t h) const { return h / (hq / hkv); }
  int64_t q_col(int64_t h) const { return h * d; }
  int64_t k_col(int64_t h) const { return (hq + kv(h)) * d; }
  int64_t v_col(int64_t h) const { return (hq + hkv + kv(h)) * d; }
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

Outs flash_attention_forward(const Env& env, Ins in, Ins) {
  const Tensor& qkv = need(in, 0, "attention qkv");
  Geo g(env, qkv);
  Mat X = load_mat(qkv), O = Mat::Zero(g.b * g.s, g.hq * g.d);
  Tensor out = env.output({g.b * g.s, g.hq * g.d}, env.act),
         lse = env.output({g.b, g.hq, g.s}, Dtype::kFp32);
  std::vector<float> sc(g.s);
  for (int64_t bi = 0; bi < g.b; ++bi)
    for (int64_t h = 0; h < g.hq; ++h)
      for (int64_t i = 0; i < g.s; ++i) {
        int64_t ti = g.row(bi, i);
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          sc[j] = g.scale * dot(&X(ti, g.q_col(h)), &X(g.row(bi, j), g.k_col(h)), g.d);
          m = std::max(m, sc[j]);
        }
        double l = 0;
        for (int64_t j = 0; j <= i; ++j) l += sc[j] = std::exp(sc[j] - m);
        float inv = static_cast<float>(1.0 / l);
        for (int64_t j = 0; j <= i; ++j)
          axpy(sc[j] * inv, &X(g.row(bi, j), g.v_col(h)), &O(ti, g.q_col(h)), g.d);
        lse.as<float>()[g.stat(bi, h, i)] = m + static_cast<float>(std::log(l));
      }
  store_mat(out, O);
  return {out, lse};
}

// FlashAttention-2 backward: D = rowsum(dO * O); P = exp(scale q.k - lse); dV += P dO;
// dS = P (dO.v - D); dQ += scale dS k (fp32 workspace); dK += scale dS q.
void flash_attention_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& qkv = need(a.inputs, 0, "attention qkv");
  Geo g(env, qkv);
  Mat X = load_mat(qkv), O = load_mat(need(a.outputs, 0, "attention output"));
  Mat dO = load_mat(need(a.grad_outputs, 0, "attention output gradient"));
  const float* lse = need(a.outputs, 1, "attention logsumexp").as<float>();
  int64_t T = g.b * g.s;
  Tensor dq = env.workspace({T, g.hq * g.d}, Dtype::kFp32),
         rs = env.workspace({g.b, g.hq, g.s}, Dtype::kFp32);
  float* dQ = dq.as<float>();
  float* D = rs.as<float>();
  std::fill(dQ, dQ + T * g.hq * g.d, 0.0f);
  Mat dX = Mat::Zero(T, g.width);  // k and v columns accumulate here; q columns from dQ at the end
  for (int64_t bi = 0; bi < g.b; ++bi)
    for (int64_t h = 0; h < g.hq; ++h) {
      for (int64_t i = 0; i < g.s; ++i) {
        int64_t ti = g.row(bi, i);
        D[g.stat(bi, h, i)] = dot(&dO(ti, g.q_col(h)), &O(ti, g.q_col(h)), g.d);
      }
      for (int64_t i = 0; i < g.s; ++i) {
        int64_t ti = g.row(bi, i);
        const float* q = &X(ti, g.q_col(h));
        const float* go = &dO(ti, g.q_col(h));
        float* dq_i = dQ + ti * g.hq * g.d + g.q_col(h);
        for (int64_t j = 0; j <= i; ++j) {
          int64_t tj = g.row(bi, j);
          const float* k = &X(tj, g.k_col(h));
          float p = std::exp(g.scale * dot(q, k, g.d) - lse[g.stat(bi, h, i)]);
          axpy(p, go, &dX(tj, g.v_col(h)), g.d);
          float ds = p * (dot(go, &X(tj, g.v_col(h)), g.d) - D[g.stat(bi, h, i)]);
          axpy(g.scale * ds, k, dq_i, g.d);
          axpy(g.scale * ds, q, &dX(tj, g.k_col(h)), g.d);
        }
      }
    }
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < g.hq * g.d; ++c) dX(t, c) = dQ[t * g.hq * g.d + c];
  grad_input(env, a, 0, qkv.type, dX);
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

Outs softmax_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "softmax input");
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
  Tensor out = env.output(x.type.shape, x.type.dtype);
  store_mat(out, P);
  return {out};
}

// dx = scale * p * (g - sum_j p g): reads the output only.
void softmax_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& p = need(a.outputs, 0, "softmax output");
  int64_t s = dim(p, 3);
  float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(env.attrs().head_dim)));
  Mat P = load_rows(p, p.numel() / s, s),
      G = load_rows(need(a.grad_outputs, 0, "softmax gradient"), p.numel() / s, s);
  for (int64_t r = 0; r < P.rows(); ++r) {
    double dotpg = 0;
    for (int64_t j = 0; j < s; ++j) dotpg += double(P(r, j)) * G(r, j);
    for (int64_t j = 0; j < s; ++j)
      G(r, j) = scale * P(r, j) * (G(r, j) - static_cast<float>(dotpg));
  }
  grad_input(env, a, 0, p.type, G);
}

// ---- Eager: context = probs V over j <= i (probs above the diagonal are not read)
// -----------------

Outs attn_context_forward(const Env& env, Ins in, Ins) {
  const Tensor& probs = need(in, 0, "attention probs");
  const Tensor& qkv = need(in, 1, "attention qkv");
  Geo g(env, qkv);
  check(probs.numel() == g.b * g.hq * g.s * g.s, "attn_context: probs are not {b, heads, s, s}");
  Mat X = load_mat(qkv), P = load_rows(probs, g.b * g.hq * g.s, g.s),
      O = Mat::Zero(g.b * g.s, g.hq * g.d);
  const float* pp = P.data();
  for (int64_t bi = 0; bi < g.b; ++bi)
    for (int64_t h = 0; h < g.hq; ++h)
      for (int64_t i = 0; i < g.s; ++i)
        for (int64_t j = 0; j <= i; ++j)
          axpy(pp[g.score(bi, h, i, j)], &X(g.row(bi, j), g.v_col(h)), &O(g.row(bi, i), g.q_col(h)),
               g.d);
  Tensor out = env.output({g.b * g.s, g.hq * g.d}, env.act);
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
          dp[k] = dot(&dO(ti, g.q_col(h)), &X(tj, g.v_col(h)), g.d);
          axpy(pp[k], &dO(ti, g.q_col(h)), &dX(tj, g.v_col(h)), g.d);
        }
  grad_input(env, a, 0, probs.type, dP);
  grad_input(env, a, 1, qkv.type, dX);
}

}  // namespace np::exec::cpu
