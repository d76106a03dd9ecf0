// Mixture-of-experts routing: top-k of the router logits (softmax over the k), the expert-major
// dispatch of token rows, the probability-weighted combine, and the shared-expert sigmoid gate.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "executor/cpu/kernels.hpp"

namespace np::exec::cpu {


// ---- TopK: per row the top_k logits (ties: lower expert first), softmax over the selected -------

Outs topk_forward(const Env& env, Ins in, Ins) {
  const Tensor& logits = need(in, 0, "router logits");
  Mat L = load_mat(logits);
  int64_t T = L.rows(), E = L.cols(), k = env.attrs().top_k;
  check(k > 0 && k <= E, "topk: top_k must be in [1, experts]");
  Tensor probs = env.output({T, k}, Dtype::kFp32), idx = env.output({T, k}, Dtype::kI64);
  std::vector<int64_t> order(E);
  for (int64_t t = 0; t < T; ++t) {
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t x, int64_t y) {
      return L(t, x) > L(t, y) || (L(t, x) == L(t, y) && x < y);
    });
    float m = L(t, order[0]);
    double z = 0;
    for (int64_t j = 0; j < k; ++j) z += std::exp(L(t, order[j]) - m);
    for (int64_t j = 0; j < k; ++j) {
      idx.as<int64_t>()[t * k + j] = order[j];
      probs.as<float>()[t * k + j] = static_cast<float>(std::exp(L(t, order[j]) - m) / z);
    }
  }
  return {probs, idx};
}

// grad_logits[t, idx[t,j]] = p_j (g_j - sum_i p_i g_i); 0 for experts not selected.
void topk_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& probs = need(a.outputs, 0, "topk probs");
  const Tensor& idx = need(a.outputs, 1, "topk indices");
  Mat P = load_mat(probs), G = load_mat(need(a.grad_outputs, 0, "topk probs gradient"));
  int64_t T = P.rows(), k = P.cols();
  const Tensor& x = a.inputs[0];
  int64_t E = x && x.type.shape.size() == 2 ? x.type.shape[1]
              : env.ctx.model->moe          ? env.ctx.model->moe->num_experts
                                            : 0;
  check(E >= k,
        "topk backward: the number of experts is unknown (no logits shape, no MoE in the model)");
  Mat D = Mat::Zero(T, E);
  const int64_t* id = idx.as<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    double pg = 0;
    for (int64_t j = 0; j < k; ++j) pg += double(P(t, j)) * G(t, j);
    for (int64_t j = 0; j < k; ++j) {
      check(id[t * k + j] >= 0 && id[t * k + j] < E,
            "topk backward: an index is outside the experts");
      D(t, id[t * k + j]) = P(t, j) * (G(t, j) - static_cast<float>(pg));
    }
  }
  grad_input(env, a, 0, {{T, E}, Dtype::kFp32}, D);
}

// ---- RouteScores: sigmoid, or softmax over the experts, of each row of fp32 logits --------------

Outs route_scores_forward(const Env& env, Ins in, Ins) {
  const Tensor& logits = need(in, 0, "router logits");
  check(logits.type.dtype == Dtype::kFp32 && logits.type.shape.size() == 2,
        "route scores: the logits are fp32 [tokens, experts]");
  Mat L = load_mat(logits);
  int64_t T = L.rows(), E = L.cols();
  Tensor out = env.output({T, E}, Dtype::kFp32);
  float* s = out.as<float>();
  for (int64_t t = 0; t < T; ++t) {
    if (env.attrs().router.sigmoid) {
      for (int64_t e = 0; e < E; ++e) s[t * E + e] = static_cast<float>(1.0 / (1.0 + std::exp(-double(L(t, e)))));
      continue;
    }
    double m = L.row(t).maxCoeff(), z = 0;
    for (int64_t e = 0; e < E; ++e) z += std::exp(double(L(t, e)) - m);
    for (int64_t e = 0; e < E; ++e) s[t * E + e] = static_cast<float>(std::exp(double(L(t, e)) - m) / z);
  }
  return {out};
}

// sigmoid: dl = g s (1 - s); softmax: dl = s (g - sum_e g_e s_e).
void route_scores_backward(const Env& env, const BackwardArgs& a) {
  Mat S = load_mat(need(a.outputs, 0, "route scores")), G = load_mat(need(a.grad_outputs, 0, "route scores gradient"));
  Mat D(S.rows(), S.cols());
  for (int64_t t = 0; t < S.rows(); ++t) {
    double gs = 0;
    if (!env.attrs().router.sigmoid)
      for (int64_t e = 0; e < S.cols(); ++e) gs += double(G(t, e)) * S(t, e);
    for (int64_t e = 0; e < S.cols(); ++e) {
      double s = S(t, e), g = G(t, e);
      D(t, e) = static_cast<float>(env.attrs().router.sigmoid ? g * s * (1.0 - s) : s * (g - gs));
    }
  }
  grad_input(env, a, 0, {{S.rows(), S.cols()}, Dtype::kFp32}, D);
}

// ---- RouteTopK: the group-limited top-k of the scores (plus the bias), renormalised and scaled --

void route_choose(const float* scores, const float* bias, int64_t E, int64_t k,
                  const RouterSpec& r, int64_t* chosen, float* group_mask) {
  auto c = [&](int64_t e) { return double(scores[e]) + (bias ? double(bias[e]) : 0.0); };
  std::vector<char> eligible(E, 1);
  if (r.groups > 1) {
    int64_t n = E / r.groups, best = k / r.topk_groups;
    std::vector<double> group(r.groups);
    std::vector<double> top(n);
    for (int64_t g = 0; g < r.groups; ++g) {
      for (int64_t i = 0; i < n; ++i) top[i] = c(g * n + i);
      std::partial_sort(top.begin(), top.begin() + best, top.end(), std::greater<double>());
      group[g] = std::accumulate(top.begin(), top.begin() + best, 0.0);
    }
    std::vector<int64_t> order(r.groups);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t x, int64_t y) { return group[x] > group[y]; });
    std::fill(eligible.begin(), eligible.end(), 0);
    for (int64_t j = 0; j < r.topk_groups; ++j)
      std::fill(eligible.begin() + order[j] * n, eligible.begin() + (order[j] + 1) * n, 1);
  }
  std::vector<int64_t> order;
  for (int64_t e = 0; e < E; ++e) {
    if (eligible[e]) order.push_back(e);
    if (group_mask) group_mask[e] = eligible[e] ? 1.0f : 0.0f;
  }
  check(static_cast<int64_t>(order.size()) >= k, "route top-k: fewer eligible experts than top_k");
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int64_t x, int64_t y) {
    return c(x) > c(y) || (c(x) == c(y) && x < y);
  });
  std::copy(order.begin(), order.begin() + k, chosen);
}

Outs route_topk_forward(const Env& env, Ins in, Ins) {
  const Tensor& scores = need(in, 0, "route scores");
  check(scores.type.dtype == Dtype::kFp32 && scores.type.shape.size() == 2,
        "route top-k: the scores are fp32 [tokens, experts]");
  const OpAttrs& at = env.attrs();
  const RouterSpec& r = at.router;
  int64_t T = dim(scores, 0), E = dim(scores, 1), k = at.top_k;
  check(k > 0 && k <= E && r.groups >= 1 && E % r.groups == 0,
        "route top-k: top_k and the groups do not fit the experts");
  Tensor probs = env.output({T, k}, Dtype::kFp32), idx = env.output({T, k}, Dtype::kI64);
  // The scratch the frameworks allocate (ops.cpp): the biased scores (the expert bias is zero
  // here, as both frameworks initialise it; route_choose takes any), the group mask expanded to
  // the experts, the masked scores.
  const float* s = scores.as<float>();
  Tensor biased, mask, masked;
  if (at.bias) biased = env.workspace({T, E}, Dtype::kFp32);
  if (r.groups > 1)
    mask = env.workspace({T, E}, Dtype::kFp32), masked = env.workspace({T, E}, Dtype::kFp32);
  int64_t* id = idx.as<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    if (biased) std::copy(s + t * E, s + (t + 1) * E, biased.as<float>() + t * E);
    route_choose(s + t * E, nullptr, E, k, r, id + t * k, mask ? mask.as<float>() + t * E : nullptr);
    for (int64_t e = 0; masked && e < E; ++e)
      masked.as<float>()[t * E + e] = mask.as<float>()[t * E + e] != 0 ? s[t * E + e] : -INFINITY;
    double z = 1e-20;
    for (int64_t j = 0; j < k; ++j) z += s[t * E + id[t * k + j]];
    for (int64_t j = 0; j < k; ++j) {
      double w = s[t * E + id[t * k + j]];
      probs.as<float>()[t * k + j] = static_cast<float>((r.normalize ? w / z : w) * r.scaling);
    }
  }
  Outs out = {probs, idx};  // then the forward's workspaces, in the op table's order
  for (const Tensor& w : {biased, mask, masked})
    if (w) out.push_back(w);
  return out;
}

// p_j = c s_j / Z (Z = sum of the chosen + 1e-20) when normalized, else c s_j: ds_i = c (g_j / Z -
// sum_l g_l s_l / Z^2), else c g_j, at the chosen experts; 0 elsewhere.
void route_topk_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& scores = need(a.inputs, 0, "route scores");
  const Tensor& idx = need(a.outputs, 1, "route indices");
  Mat G = load_mat(need(a.grad_outputs, 0, "route probs gradient"));
  const RouterSpec& r = env.attrs().router;
  int64_t T = G.rows(), k = G.cols(), E = dim(scores, 1);
  const float* s = scores.as<float>();
  const int64_t* id = idx.as<int64_t>();
  Mat D = Mat::Zero(T, E);
  for (int64_t t = 0; t < T; ++t) {
    double z = 1e-20, gs = 0;
    for (int64_t j = 0; j < k; ++j) {
      check(id[t * k + j] >= 0 && id[t * k + j] < E, "route top-k backward: an index is outside the experts");
      z += s[t * E + id[t * k + j]], gs += double(G(t, j)) * s[t * E + id[t * k + j]];
    }
    for (int64_t j = 0; j < k; ++j)
      D(t, id[t * k + j]) = static_cast<float>(
          r.scaling * (r.normalize ? double(G(t, j)) / z - gs / (z * z) : double(G(t, j))));
  }
  grad_input(env, a, 0, {{T, E}, Dtype::kFp32}, D);
}

// ---- MoeDispatch: send[row(t,j)] = x[t] (unused slots zero), then over ep > 1 the all-to-all
// (the send buffer is the op's workspace) -----------------------------------------------------

Outs moe_dispatch_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "dispatch tokens");
  Routing r = routing(env, need(in, 1, "routing indices"));
  int64_t T = dim(x, 0), h = dim(x, 1);
  check(r.tokens == T, "dispatch: tokens and routing indices differ in rows");
  Mat X = load_mat(x), Y = Mat::Zero(r.rows, h);
  for (int64_t i = 0; i < T * r.k; ++i)
    if (r.row[i] >= 0) Y.row(r.row[i]) = X.row(i / r.k);
  Tensor out = env.output({r.rows, h}, env.act);
  if (env.attrs().group == 1) {
    store_mat(out, Y);
    return {out};
  }
  Tensor send = env.workspace({r.rows, h}, env.act);
  store_mat(send, Y);
  env.comm().ep_all_to_all(send, out);
  return {out, send};
}

// grad_x[t] = sum_j grad_send[row(t,j)], j ascending (over ep > 1 the gradient comes back through
// the all-to-all into the op's workspace first).
void moe_dispatch_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "dispatch gradient");
  Routing r = routing(env, need(a.inputs, 1, "routing indices"));
  Tensor back = g;
  if (env.attrs().group > 1) {
    back = env.workspace(g.type.shape, g.type.dtype);
    env.comm().ep_all_to_all(g, back);
  }
  Mat G = load_mat(back), D = Mat::Zero(r.tokens, G.cols());
  for (int64_t i = 0; i < r.tokens * r.k; ++i)
    if (r.row[i] >= 0) D.row(i / r.k) += G.row(r.row[i]);
  grad_input(env, a, 0, {{r.tokens, G.cols()}, g.type.dtype}, D);
}

// ---- MoeCombine: y[t] = sum_j probs[t,j] ye[row(t,j)] over the kept choices (over ep > 1 the
// expert outputs come back through the all-to-all into the op's workspace first) ---------------

namespace {
// The expert outputs in the send layout: ye itself, or received from the experts' ranks.
Tensor outputs_back(const Env& env, const Tensor& ye) {
  if (env.attrs().group == 1) return ye;
  Tensor back = env.workspace(ye.type.shape, ye.type.dtype);
  env.comm().ep_all_to_all(ye, back);
  return back;
}
}  // namespace

Outs moe_combine_forward(const Env& env, Ins in, Ins) {
  const Tensor& ye = need(in, 0, "expert outputs");
  Mat P = load_mat(need(in, 1, "routing probs"));
  Routing r = routing(env, need(in, 2, "routing indices"));
  check(P.rows() == r.tokens && P.cols() == r.k && dim(ye, 0) == r.rows,
        "combine: shapes differ from the routing");
  Tensor back = outputs_back(env, ye);
  Mat Y = load_mat(back), O = Mat::Zero(r.tokens, Y.cols());
  for (int64_t i = 0; i < r.tokens * r.k; ++i)
    if (r.row[i] >= 0) O.row(i / r.k) += P(i / r.k, i % r.k) * Y.row(r.row[i]);
  Tensor out = env.output({r.tokens, Y.cols()}, env.act);
  store_mat(out, O);
  if (back.data == ye.data) return {out};
  return {out, back};
}

// grad_send[row(t,j)] = probs[t,j] g[t]; grad_probs[t,j] = <ye[row(t,j)], g[t]> (0 if dropped).
// Over ep > 1 the expert outputs are exchanged again, and the gradient goes to the experts' ranks
// through the all-to-all from the same workspace.
void moe_combine_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& ye = need(a.inputs, 0, "expert outputs");
  const Tensor& probs = need(a.inputs, 1, "routing probs");
  Routing r = routing(env, need(a.inputs, 2, "routing indices"));
  Tensor back = outputs_back(env, ye);
  Mat P = load_mat(probs), Y = load_mat(back),
      G = load_mat(need(a.grad_outputs, 0, "combine gradient"));
  Mat DY = Mat::Zero(Y.rows(), Y.cols()), DP = Mat::Zero(r.tokens, r.k);
  for (int64_t i = 0; i < r.tokens * r.k; ++i) {
    int64_t t = i / r.k, j = i % r.k, row = r.row[i];
    if (row < 0) continue;
    DY.row(row) = P(t, j) * G.row(t);
    double acc = 0;
    for (int64_t c = 0; c < Y.cols(); ++c) acc += double(Y(row, c)) * G(t, c);
    DP(t, j) = static_cast<float>(acc);
  }
  // Input gradients in input order (the contract's allocation order).
  if (back.data == ye.data) {
    grad_input(env, a, 0, ye.type, DY);
  } else if (Tensor& dst = a.grad_inputs[0]; !dst) {
    store_mat(back, DY);
    dst = env.alloc(ye.type, AllocRole::kGradInput);
    env.comm().ep_all_to_all(back, dst);
  } else {
    store_mat(back, DY);
    Scratch received(ye.type);  // an existing gradient: received into staging, then added
    env.comm().ep_all_to_all(back, received.t);
    grad_input_tensor(env, a, 0, received.t);
  }
  grad_input(env, a, 1, probs.type, DP);
}

// ---- SharedGate: out = sigmoid(x . w) * y
// ----------------------------------------------------------

Outs shared_gate_forward(const Env& env, Ins in, Ins w) {
  Mat X = load_mat(need(in, 0, "gate input")), W = load_mat(need(w, 0, "gate weight"));
  const Tensor& y = need(in, 1, "shared expert output");
  Mat Y = load_mat(y);
  check(X.rows() == Y.rows() && W.cols() == X.cols(), "shared_gate: shapes differ");
  for (int64_t t = 0; t < X.rows(); ++t) {
    double z = 0;
    for (int64_t c = 0; c < X.cols(); ++c) z += double(X(t, c)) * W(0, c);
    float sg = static_cast<float>(1.0 / (1.0 + std::exp(-z)));
    Y.row(t) *= sg;
  }
  Tensor out = env.output(y.type.shape, y.type.dtype);
  store_mat(out, Y);
  return {out};
}

// dy = s g; dz = (g . y) s (1 - s); dx = dz w; dw += sum_t dz x.
void shared_gate_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& x = need(a.inputs, 0, "gate input");
  const Tensor& y = need(a.inputs, 1, "shared expert output");
  Mat X = load_mat(x), Y = load_mat(y), W = load_mat(need(a.weights, 0, "gate weight"));
  Mat G = load_mat(need(a.grad_outputs, 0, "gate gradient"));
  int64_t T = X.rows(), h = X.cols();
  Mat DX(T, h), DY(T, Y.cols()), DWr(T, h);
  float* dzs = env.workspace({T}, Dtype::kFp32).as<float>();  // the op table's per-row dz
  for (int64_t t = 0; t < T; ++t) {
    double z = 0, gy = 0;
    for (int64_t c = 0; c < h; ++c) z += double(X(t, c)) * W(0, c);
    for (int64_t c = 0; c < Y.cols(); ++c) gy += double(G(t, c)) * Y(t, c);
    float sg = static_cast<float>(1.0 / (1.0 + std::exp(-z)));
    float dz = dzs[t] = static_cast<float>(gy * sg * (1.0 - sg));
    DY.row(t) = sg * G.row(t);
    DX.row(t) = dz * W.row(0);
  }
  for (int64_t t = 0; t < T; ++t) DWr.row(t) = dzs[t] * X.row(t);
  grad_input(env, a, 0, x.type, DX);
  grad_input(env, a, 1, y.type, DY);
  add_mat(need(a.weight_grads, 0, "gate weight gradient"), column_sums(DWr));
}

}  // namespace np::exec::cpu
