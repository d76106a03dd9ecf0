// Vocabulary and position tables: vocab-parallel token embedding, learned position embedding, and
// the vocab-parallel cross-entropy loss (max, sum of exp and target logit reduced over TP).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "executor/cpu/kernels.hpp"

namespace np::exec::cpu {

// ---- Embedding: out[t] = W[id - shard start] if the id is in this rank's shard, else 0
// -----------

Outs embedding_forward(const Env& env, Ins in, Ins w) {
  const Tensor& ids = need(in, 0, "embedding ids");
  const Tensor& W = need(w, 0, "embedding weight");
  check(ids.type.dtype == Dtype::kI64, "embedding ids must be i64");
  int64_t T = dim(ids, 0), V = dim(W, 0), h = dim(W, 1), lo = env.ctx.tp_rank * V;
  Tensor out = env.output({T, h}, env.act);
  const int64_t* id = ids.as<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    int64_t r = id[t] - lo;
    bool here = r >= 0 && r < V;
    for (int64_t c = 0; c < h; ++c) store(out, t * h + c, here ? load(W, r * h + c) : 0.0f);
  }
  return {out};
}

void embedding_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& ids = need(a.inputs, 0, "embedding ids");
  const Tensor& g = need(a.grad_outputs, 0, "embedding output gradient");
  const Tensor& dW = need(a.weight_grads, 0, "embedding weight gradient");
  int64_t T = dim(ids, 0), V = dim(dW, 0), h = dim(dW, 1), lo = env.ctx.tp_rank * V;
  const int64_t* id = ids.as<int64_t>();
  // Tokens grouped by table row, in token order within a row: each row's sum rounds once.
  std::vector<std::pair<int64_t, int64_t>> hits;
  for (int64_t t = 0; t < T; ++t)
    if (id[t] - lo >= 0 && id[t] - lo < V) hits.emplace_back(id[t] - lo, t);
  std::sort(hits.begin(), hits.end());
  // dense_wgrad: the whole table's gradient in bf16 first, then added into the buffer.
  Tensor dense = env.ctx.op->attrs.dense_wgrad ? env.workspace({V, h}, env.act) : Tensor{};
  const Tensor& into = dense ? dense : dW;
  if (dense) std::memset(dense.data, 0, static_cast<size_t>(dense.bytes()));
  std::vector<float> sum(h);
  for (size_t i = 0; i < hits.size();) {
    int64_t r = hits[i].first;
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (; i < hits.size() && hits[i].first == r; ++i)
      for (int64_t c = 0; c < h; ++c) sum[c] += load(g, hits[i].second * h + c);
    for (int64_t c = 0; c < h; ++c) accumulate(into, r * h + c, sum[c]);
  }
  if (dense)
    for (int64_t e = 0; e < V * h; ++e) accumulate(dW, e, load(dense, e));
}

// ---- PosEmbedding: out[t] = x[t] + W[(first_row + t) / b] ---------------------------------------

Outs pos_embedding_forward(const Env& env, Ins in, Ins w) {
  const Tensor& x = need(in, 0, "pos_embedding input");
  const Tensor& W = need(w, 0, "pos_embedding weight");
  int64_t T = dim(x, 0), h = dim(x, 1), first = env.first_row(T), b = env.batch();
  check(dim(W, 1) == h, "pos_embedding: weight width differs from the hidden size");
  Tensor out = env.output({T, h}, x.type.dtype);
  for (int64_t t = 0; t < T; ++t) {
    int64_t pos = global_token_row(env.ctx, first + t) / b;
    check(pos < dim(W, 0), "pos_embedding: position beyond the table");
    for (int64_t c = 0; c < h; ++c)
      store(out, t * h + c, load(x, t * h + c) + load(W, pos * h + c));
  }
  return {out};
}

void pos_embedding_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "pos_embedding output gradient");
  const Tensor& dW = need(a.weight_grads, 0, "pos_embedding weight gradient");
  int64_t T = dim(g, 0), h = dim(g, 1), first = env.first_row(T), b = env.batch();
  Mat G = load_mat(g);
  grad_input(env, a, 0, g.type, G);
  // Rows of one position are consecutive (t = pos*b + bi): sum them, then round once.
  std::vector<float> sum(h);
  for (int64_t t = 0; t < T;) {
    int64_t pos = global_token_row(env.ctx, first + t) / b;
    std::fill(sum.begin(), sum.end(), 0.0f);
    for (; t < T && global_token_row(env.ctx, first + t) / b == pos; ++t)
      for (int64_t c = 0; c < h; ++c) sum[c] += G(t, c);
    for (int64_t c = 0; c < h; ++c) accumulate(dW, pos * h + c, sum[c]);
  }
}

// ---- CrossEntropy over the vocab shard [tp_rank*V, (tp_rank+1)*V) -------------------------------
// loss[t] = log(sum_v exp(l - max)) + max - l[target]; softmax kept in fp32 for the backward
// (log_softmax_loss: the log-probabilities l - max - log(sum) instead).

// Each row's max over the whole vocabulary into mx: this shard's, then over the TP ranks (in
// place, Megatron's all-reduce with MAX).
static float* row_max(const Env& env, const Mat& L, const Tensor& mx) {
  int64_t T = L.rows(), V = L.cols(), tp = env.tp_size();
  float* m = mx.as<float>();
  for (int64_t t = 0; t < T; ++t) {
    float v = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < V; ++j) v = std::max(v, L(t, j));
    m[t] = v;
  }
  if (tp > 1) env.comm().all_reduce_max(mx);
  return m;
}

// Each row's sum of exp(logit - max) into se (and each exp into S unless null) and the target's
// logit into tg on the rank whose shard holds it, both then summed over the TP ranks.
static void exp_sums(const Env& env, const Mat& L, const float* m, const Tensor& targets,
                     const Tensor& se, const Tensor& tg, float* S) {
  int64_t T = L.rows(), V = L.cols(), lo = env.ctx.tp_rank * V;
  float *s = se.as<float>(), *x = tg.as<float>();
  const int64_t* tgt = targets.as<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    double acc = 0;
    for (int64_t j = 0; j < V; ++j) {
      float e = std::exp(L(t, j) - m[t]);
      if (S) S[t * V + j] = e;
      acc += e;
    }
    s[t] = static_cast<float>(acc);
    int64_t r = tgt[t] - lo;
    x[t] = r >= 0 && r < V ? L(t, r) : 0.0f;
  }
  if (env.tp_size() > 1) {
    env.comm().all_reduce(se);
    env.comm().all_reduce(tg);
  }
}

Outs cross_entropy_forward(const Env& env, Ins in, Ins) {
  const Tensor& logits = need(in, 0, "cross_entropy logits");
  const Tensor& targets = need(in, 1, "cross_entropy targets");
  check(targets.type.dtype == Dtype::kI64, "cross_entropy targets must be i64");
  int64_t T = dim(logits, 0), V = dim(logits, 1);
  check(dim(targets, 0) == T, "cross_entropy: targets and logits differ in tokens");
  Tensor loss = env.output({T}, Dtype::kFp32), sm = env.output({T, V}, Dtype::kFp32);
  // fp32_copy: the logits cast to an fp32 tensor first, the loss computed from the copy.
  Tensor copy = env.ctx.op->attrs.fp32_copy ? env.workspace({T, V}, Dtype::kFp32) : Tensor{};
  Tensor mx = env.workspace({T}, Dtype::kFp32), se = env.workspace({T}, Dtype::kFp32),
         tg = env.workspace({T}, Dtype::kFp32);
  if (copy) store_mat(copy, load_mat(logits));
  Mat L = load_mat(copy ? copy : logits);
  float* m = row_max(env, L, mx);
  float* S = sm.as<float>();
  exp_sums(env, L, m, targets, se, tg, S);
  const float *s = se.as<float>(), *x = tg.as<float>();
  float* out = loss.as<float>();
  bool log_probs = env.ctx.op->kind == OpKind::kLogSoftmaxLoss;
  for (int64_t t = 0; t < T; ++t) {
    out[t] = std::log(s[t]) + m[t] - x[t];
    float ls = std::log(s[t]);
    for (int64_t j = 0; j < V; ++j)
      S[t * V + j] = log_probs ? L(t, j) - m[t] - ls : S[t * V + j] / s[t];
  }
  if (copy) return {loss, sm, copy, mx, se, tg};
  return {loss, sm, mx, se, tg};
}

void cross_entropy_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& targets = need(a.inputs, 1, "cross_entropy targets");
  const Tensor& sm = need(a.outputs, 1, "cross_entropy softmax");
  int64_t T = dim(sm, 0), V = dim(sm, 1), lo = env.ctx.tp_rank * V;
  float scale = env.ctx.loss_scale;
  Mat G = load_mat(sm);
  const int64_t* tgt = targets.as<int64_t>();
  bool log_probs = env.ctx.op->kind == OpKind::kLogSoftmaxLoss;
  if (log_probs) {
    // As PyTorch's: the NLL's gradient per logit (-scale at the target, a workspace), then the
    // log-softmax's input gradient g - exp(log p) sum(g), sum(g) = -scale over the vocabulary.
    float* nll = env.workspace({T, V}, Dtype::kFp32).as<float>();
    for (int64_t t = 0; t < T; ++t) {
      int64_t r = tgt[t] - lo;
      for (int64_t j = 0; j < V; ++j) {
        nll[t * V + j] = j == r ? -scale : 0.0f;
        G(t, j) = nll[t * V + j] + std::exp(G(t, j)) * scale;
      }
    }
  } else {
    for (int64_t t = 0; t < T; ++t) {
      int64_t r = tgt[t] - lo;
      for (int64_t j = 0; j < V; ++j) G(t, j) = (G(t, j) - (j == r ? 1.0f : 0.0f)) * scale;
    }
  }
  Dtype dt = log_probs                                        ? Dtype::kFp32
             : a.inputs[0] && !a.inputs[0].type.shape.empty() ? a.inputs[0].type.dtype
                                                              : env.act;
  // fp32_grad: the gradient in a fresh fp32 buffer first (before the input gradient, in the op
  // table's order), then cast from it.
  if (env.ctx.op->attrs.fp32_grad) {
    Tensor fp32 = env.workspace({T, V}, Dtype::kFp32);
    store_mat(fp32, G);
    G = load_mat(fp32);
  }
  grad_input(env, a, 0, {{T, V}, dt}, G);
}

// ---- Transformer Engine's parallel cross-entropy ------------------------------------------------
// No softmax is stored: each row's fp32 max and log-sum-exp (output 1) and the bf16 logits, which
// backward reads, give the gradient softmax - onehot. TE writes that gradient into the logits in
// forward and returns them as it; here the gradient is a new tensor, so the backward holds one
// more bf16 [rows, V] than TE's (docs/accuracy.md).

Outs cross_entropy_te_forward(const Env& env, Ins in, Ins) {
  const Tensor& logits = need(in, 0, "cross_entropy_te logits");
  const Tensor& targets = need(in, 1, "cross_entropy_te targets");
  check(targets.type.dtype == Dtype::kI64, "cross_entropy_te targets must be i64");
  int64_t T = dim(logits, 0);
  check(dim(targets, 0) == T, "cross_entropy_te: targets and logits differ in tokens");
  Tensor loss = env.output({T}, Dtype::kFp32), stats = env.output({T, 2}, Dtype::kFp32);
  Tensor mx = env.workspace({T}, Dtype::kFp32), se = env.workspace({T}, Dtype::kFp32),
         tg = env.workspace({T}, Dtype::kFp32);
  Mat L = load_mat(logits);
  float* m = row_max(env, L, mx);
  exp_sums(env, L, m, targets, se, tg, nullptr);
  const float *s = se.as<float>(), *x = tg.as<float>();
  float *out = loss.as<float>(), *st = stats.as<float>();
  for (int64_t t = 0; t < T; ++t) {
    out[t] = std::log(s[t]) + m[t] - x[t];
    st[2 * t] = m[t];
    st[2 * t + 1] = std::log(s[t]);
  }
  return {loss, stats, mx, se, tg};
}

void cross_entropy_te_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& logits = need(a.inputs, 0, "cross_entropy_te logits");
  const Tensor& targets = need(a.inputs, 1, "cross_entropy_te targets");
  const Tensor& stats = need(a.outputs, 1, "cross_entropy_te row statistics");
  int64_t T = dim(logits, 0), V = dim(logits, 1), lo = env.ctx.tp_rank * V;
  float scale = env.ctx.loss_scale;
  Mat G = load_mat(logits);
  const float* st = stats.as<float>();
  const int64_t* tgt = targets.as<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    int64_t r = tgt[t] - lo;
    for (int64_t j = 0; j < V; ++j)
      G(t, j) = (std::exp(G(t, j) - st[2 * t] - st[2 * t + 1]) - (j == r ? 1.0f : 0.0f)) * scale;
  }
  grad_input(env, a, 0, {{T, V}, logits.type.dtype}, G);
}

// ---- Hugging Face's loss: logits.float() as its own op ------------------------------------------

Outs cast_fp32_forward(const Env& env, Ins in, Ins) {
  const Tensor& x = need(in, 0, "cast input");
  Tensor y = env.output(x.type.shape, Dtype::kFp32);
  store_mat(y, load_mat(x));
  return {y};
}

// The gradient cast back to the input's dtype (the activation dtype: the logits).
void cast_fp32_backward(const Env& env, const BackwardArgs& a) {
  const Tensor& g = need(a.grad_outputs, 0, "cast gradient");
  grad_input(env, a, 0, {g.type.shape, env.act}, load_mat(g));
}

Outs log_softmax_loss_forward(const Env& env, Ins in, Ins w) {
  need(in, 2, "the bf16 logits the loss outlives");
  return cross_entropy_forward(env, in.first(2), w);
}

void log_softmax_loss_backward(const Env& env, const BackwardArgs& a) {
  cross_entropy_backward(env, a);
}

}  // namespace np::exec::cpu
