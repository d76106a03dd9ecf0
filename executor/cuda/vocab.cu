// Vocabulary and position tables: the token embedding (forward, deterministic backward), the
// learned position embedding
// (forward, deterministic backward), and the cross-entropy loss in the
// stages between which the caller reduces over the TP group (max, then sum of exponentials and
// target logit), as the CPU reference does.
#include "executor/cuda/common.cuh"

namespace np::cuda {
namespace {

// out[t] = W[id - lo] when this rank's shard holds the id, else 0.
__global__ void embedding_forward_kernel(const long long* ids, View w, View out, long long rows,
                                         long long vocab, long long h, long long lo) {
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= rows * h) return;
  long long t = e / h, c = e % h, r = ids[t] - lo;
  st(out, e, r >= 0 && r < vocab ? ld(w, r * h + c) : 0.0f);
}

// dW[r] += the sum of dy over the tokens whose id is this shard's row r, in token order: a block
// per table row scans the ids a tile at a time and adds the matching rows for its columns, in
// chunks of kCols columns per thread. Deterministic, no atomics, no workspace.
constexpr int kCols = 16;
__global__ void embedding_backward_kernel(const long long* ids, View dy, View dw, long long rows,
                                          long long vocab, long long h, long long lo) {
  unsigned char* hit = np_shared<unsigned char>();
  for (long long r = blockIdx.x; r < vocab; r += gridDim.x)
    for (long long c0 = 0; c0 < h; c0 += static_cast<long long>(kThreads) * kCols) {
      float acc[kCols];
      for (int k = 0; k < kCols; ++k) acc[k] = 0;
      for (long long t0 = 0; t0 < rows; t0 += kThreads) {
        long long t = t0 + threadIdx.x;
        hit[threadIdx.x] = t < rows && ids[t] - lo == r;
        __syncthreads();
        for (int k = 0; k < kThreads; ++k) {
          if (!hit[k]) continue;
          for (int j = 0; j < kCols; ++j) {
            long long c = c0 + static_cast<long long>(j) * kThreads + threadIdx.x;
            if (c < h) acc[j] += ld(dy, (t0 + k) * h + c);
          }
        }
        __syncthreads();
      }
      for (int j = 0; j < kCols; ++j) {
        long long c = c0 + static_cast<long long>(j) * kThreads + threadIdx.x;
        if (c < h) st(dw, r * h + c, ld(dw, r * h + c) + acc[j]);
      }
    }
}

// out[t] = x[t] + W[(first + t) / batch].
__global__ void pos_embedding_forward_kernel(View x, View w, View out, long long rows, long long h,
                                             long long first, long long batch) {
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= rows * h) return;
  long long t = e / h, c = e % h;
  st(out, e, ld(x, e) + ld(w, ((first + t) / batch) * h + c));
}

// dW[pos][c] += the sum of the rows of that position (consecutive: t = pos * batch + b), in row
// order: one thread per (position, column) of the rows present, no atomics.
__global__ void pos_embedding_backward_kernel(View dy, View dw, long long rows, long long h,
                                              long long first, long long batch) {
  long long first_pos = first / batch, last_pos = (first + rows - 1) / batch;
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= (last_pos - first_pos + 1) * h) return;
  long long pos = first_pos + e / h, c = e % h;
  long long t0 = pos * batch - first, t1 = t0 + batch;
  if (t0 < 0) t0 = 0;
  if (t1 > rows) t1 = rows;
  float s = 0;
  for (long long t = t0; t < t1; ++t) s += ld(dy, t * h + c);
  st(dw, pos * h + c, ld(dw, pos * h + c) + s);
}

// A block per row: the row's maximum logit.
__global__ void row_max_kernel(View logits, float* mx, long long v) {
  long long t = blockIdx.x;
  float m = -INFINITY;
  for (long long j = threadIdx.x; j < v; j += kThreads) m = fmaxf(m, ld(logits, t * v + j));
  m = block_max(m);
  if (threadIdx.x == 0) mx[t] = m;
}

// A block per row: S = exp(logit - max) (unless S is null: Transformer Engine's loss keeps no
// softmax), its sum, and the target's logit on the owning rank.
__global__ void exp_sum_kernel(View logits, const long long* targets, const float* mx, float* S,
                               float* se, float* tg, long long v, long long lo) {
  long long t = blockIdx.x;
  float acc = 0;
  for (long long j = threadIdx.x; j < v; j += kThreads) {
    float e = __expf(ld(logits, t * v + j) - mx[t]);
    if (S) S[t * v + j] = e;
    acc += e;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    se[t] = acc;
    long long r = targets[t] - lo;
    tg[t] = r >= 0 && r < v ? ld(logits, t * v + r) : 0.0f;
  }
}

// S becomes the softmax, or (log_probs) logits - mx - log(sum).
__global__ void finalize_kernel(float* S, const float* se, const float* mx, const float* tg,
                                float* loss, long long rows, long long v, View logits,
                                bool log_probs) {
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= rows * v) return;
  long long t = e / v;
  S[e] = log_probs ? ld(logits, e) - mx[t] - __logf(se[t]) : S[e] / se[t];
  if (e % v == 0) loss[t] = __logf(se[t]) + mx[t] - tg[t];
}

// From the softmax S: (S - onehot) * scale. From log-probabilities (nll non-null): the NLL's
// gradient per logit nll = -scale at the target, then nll + exp(S) * scale, as PyTorch's.
__global__ void ce_grad_kernel(const float* S, const long long* targets, View dlogits, bool acc,
                               long long rows, long long v, long long lo, float scale,
                               float* nll) {
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= rows * v) return;
  long long t = e / v, j = e % v;
  float hot = j == targets[t] - lo ? 1.0f : 0.0f, g;
  if (nll) {
    nll[e] = -hot * scale;
    g = nll[e] + __expf(S[e]) * scale;
  } else {
    g = (S[e] - hot) * scale;
  }
  st(dlogits, e, acc ? ld(dlogits, e) + g : g);
}

// A thread per row: the loss and the row's statistics {max, log sum} (Transformer Engine's loss).
__global__ void te_finalize_kernel(const float* se, const float* mx, const float* tg, float* loss,
                                   float* stats, long long rows) {
  long long t = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= rows) return;
  float lse = __logf(se[t]);
  loss[t] = lse + mx[t] - tg[t];
  stats[2 * t] = mx[t];
  stats[2 * t + 1] = lse;
}

// From the logits and the row statistics: (exp(logit - max - log sum) - onehot) * scale.
__global__ void te_grad_kernel(View logits, const float* stats, const long long* targets,
                               View dlogits, bool acc, long long rows, long long v, long long lo,
                               float scale) {
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= rows * v) return;
  long long t = e / v, j = e % v;
  float hot = j == targets[t] - lo ? 1.0f : 0.0f;
  float g = (__expf(ld(logits, e) - stats[2 * t] - stats[2 * t + 1]) - hot) * scale;
  st(dlogits, e, acc ? ld(dlogits, e) + g : g);
}

void check_ids(const Tensor& ids, long long rows) {
  need(ids.type.dtype == Dtype::kI64 && ids.numel() == rows, "token ids must be i64, one per row");
}

}  // namespace

void embedding_forward(const Tensor& ids, const Tensor& w, const Tensor& out, long long tp_rank,
                       cudaStream_t stream) {
  long long vocab = w.type.shape.at(0), h = w.type.shape.at(1), rows = ids.numel();
  check_ids(ids, rows);
  need(out.numel() == rows * h, "embedding: output is not [rows, h]");
  if (rows * h == 0) return;
  np_launch(embedding_forward_kernel, dim3(blocks_for(rows * h)), dim3(kThreads), 0, stream,
            static_cast<const long long*>(ids.data), view(w), view(out), rows, vocab, h,
            tp_rank * vocab);
  NP_CUDA_CHECK_LAUNCH();
}

void embedding_backward(const Tensor& ids, const Tensor& dy, const Tensor& dw, long long tp_rank,
                        cudaStream_t stream) {
  long long vocab = dw.type.shape.at(0), h = dw.type.shape.at(1), rows = ids.numel();
  check_ids(ids, rows);
  need(dy.numel() == rows * h, "embedding backward: dy is not [rows, h]");
  if (vocab * h == 0) return;
  unsigned blocks = static_cast<unsigned>(vocab < 65535 ? vocab : 65535);
  np_launch(embedding_backward_kernel, dim3(blocks), dim3(kThreads), kThreads, stream,
            static_cast<const long long*>(ids.data), view(dy), view(dw), rows, vocab, h,
            tp_rank * vocab);
  NP_CUDA_CHECK_LAUNCH();
}

void pos_embedding_forward(const Tensor& x, const Tensor& w, const Tensor& out, long long first_row,
                           long long batch, cudaStream_t stream) {
  long long h = w.type.shape.at(1), rows = h ? x.numel() / h : 0;
  need(rows * h == x.numel() && out.numel() == x.numel() && batch > 0 &&
           (rows == 0 || (first_row + rows - 1) / batch < w.type.shape.at(0)),
       "pos_embedding: shapes, or a position beyond the table");
  if (rows * h == 0) return;
  np_launch(pos_embedding_forward_kernel, dim3(blocks_for(rows * h)), dim3(kThreads), 0, stream,
            view(x), view(w), view(out), rows, h, first_row, batch);
  NP_CUDA_CHECK_LAUNCH();
}

void pos_embedding_backward(const Tensor& dy, const Tensor& dw, long long first_row,
                            long long batch, cudaStream_t stream) {
  long long h = dw.type.shape.at(1), rows = h ? dy.numel() / h : 0;
  need(rows * h == dy.numel() && batch > 0, "pos_embedding backward: shapes");
  if (rows * h == 0) return;
  long long positions = (first_row + rows - 1) / batch - first_row / batch + 1;
  np_launch(pos_embedding_backward_kernel, dim3(blocks_for(positions * h)), dim3(kThreads), 0,
            stream, view(dy), view(dw), rows, h, first_row, batch);
  NP_CUDA_CHECK_LAUNCH();
}

void cross_entropy_max(const Tensor& logits, const Tensor& mx, cudaStream_t stream) {
  long long rows = mx.numel(), v = rows ? logits.numel() / rows : 0;
  need(rows * v == logits.numel() && mx.type.dtype == Dtype::kFp32, "cross-entropy max: shapes");
  if (rows == 0) return;
  np_launch(row_max_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), kReduceShared,
            stream, view(logits), mx.as<float>(), v);
  NP_CUDA_CHECK_LAUNCH();
}

void cross_entropy_exp_sum(const Tensor& logits, const Tensor& targets, const Tensor& mx,
                           const Tensor& softmax, const Tensor& sum, const Tensor& target_logit,
                           long long tp_rank, cudaStream_t stream) {
  long long rows = mx.numel(), v = rows ? logits.numel() / rows : 0;
  check_ids(targets, rows);
  need((!softmax.data || softmax.numel() == logits.numel()) && sum.numel() == rows &&
           target_logit.numel() == rows,
       "cross-entropy: shapes");
  if (rows == 0) return;
  np_launch(exp_sum_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), kReduceShared,
            stream, view(logits), static_cast<const long long*>(targets.data),
            static_cast<const float*>(mx.data),
            softmax.data ? softmax.as<float>() : static_cast<float*>(nullptr), sum.as<float>(),
            target_logit.as<float>(), v, tp_rank * v);
  NP_CUDA_CHECK_LAUNCH();
}

void cross_entropy_finalize(const Tensor& softmax, const Tensor& sum, const Tensor& mx,
                            const Tensor& target_logit, const Tensor& loss,
                            const Tensor* log_probs_of, cudaStream_t stream) {
  long long rows = loss.numel(), v = rows ? softmax.numel() / rows : 0;
  need(!log_probs_of || log_probs_of->numel() == softmax.numel(),
       "cross-entropy: the logits and the softmax differ in size");
  if (rows * v == 0) return;
  np_launch(finalize_kernel, dim3(blocks_for(rows * v)), dim3(kThreads), 0, stream,
            softmax.as<float>(), static_cast<const float*>(sum.data),
            static_cast<const float*>(mx.data), static_cast<const float*>(target_logit.data),
            loss.as<float>(), rows, v, log_probs_of ? view(*log_probs_of) : view(softmax),
            log_probs_of != nullptr);
  NP_CUDA_CHECK_LAUNCH();
}

void cross_entropy_te_finalize(const Tensor& sum, const Tensor& mx, const Tensor& target_logit,
                               const Tensor& loss, const Tensor& stats, cudaStream_t stream) {
  long long rows = loss.numel();
  need(sum.numel() == rows && mx.numel() == rows && target_logit.numel() == rows &&
           stats.numel() == 2 * rows && stats.type.dtype == Dtype::kFp32,
       "cross-entropy (TE): shapes");
  if (rows == 0) return;
  np_launch(te_finalize_kernel, dim3(blocks_for(rows)), dim3(kThreads), 0, stream,
            static_cast<const float*>(sum.data), static_cast<const float*>(mx.data),
            static_cast<const float*>(target_logit.data), loss.as<float>(), stats.as<float>(),
            rows);
  NP_CUDA_CHECK_LAUNCH();
}

void cross_entropy_te_backward(const Tensor& logits, const Tensor& stats, const Tensor& targets,
                               const Tensor& dlogits, bool accumulate, long long tp_rank,
                               float loss_scale, cudaStream_t stream) {
  long long rows = targets.numel(), v = rows ? logits.numel() / rows : 0;
  check_ids(targets, rows);
  need(dlogits.numel() == logits.numel() && stats.numel() == 2 * rows,
       "cross-entropy (TE) backward: shapes");
  if (rows * v == 0) return;
  np_launch(te_grad_kernel, dim3(blocks_for(rows * v)), dim3(kThreads), 0, stream, view(logits),
            static_cast<const float*>(stats.data), static_cast<const long long*>(targets.data),
            view(dlogits), accumulate, rows, v, tp_rank * v, loss_scale);
  NP_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(const Tensor& softmax, const Tensor& targets, const Tensor& dlogits,
                            bool accumulate, long long tp_rank, float loss_scale,
                            const Tensor* nll_grad, cudaStream_t stream) {
  long long rows = targets.numel(), v = rows ? softmax.numel() / rows : 0;
  check_ids(targets, rows);
  need(dlogits.numel() == softmax.numel() &&
           (!nll_grad || (nll_grad->numel() == softmax.numel() &&
                          nll_grad->type.dtype == Dtype::kFp32)),
       "cross-entropy backward: shapes");
  if (rows * v == 0) return;
  np_launch(ce_grad_kernel, dim3(blocks_for(rows * v)), dim3(kThreads), 0, stream,
            static_cast<const float*>(softmax.data), static_cast<const long long*>(targets.data),
            view(dlogits), accumulate, rows, v, tp_rank * v, loss_scale,
            nll_grad ? nll_grad->as<float>() : static_cast<float*>(nullptr));
  NP_CUDA_CHECK_LAUNCH();
}

}  // namespace np::cuda
