// Mixture-of-experts: the router's backward, top-k routing, the expert-major dispatch of token
// rows and the probability-weighted combine, the grouped expert GEMMs (cuBLAS, one per expert),
// and the shared expert's sigmoid gate. Item i = t * top_k + j of the routing indices goes to
// row start[e] + (its rank among the items of expert e, ascending), e = idx[i]; with a capacity C,
// to row e C + rank while the rank is below C (dropped past it; the other slots stay zero): the
// CPU reference's layouts (executor/cpu/common.cpp, routing). No atomics: every output element has
// one writer, and sums run in a fixed order.
#include "executor/cuda/common.cuh"

namespace np::cuda {
namespace {

constexpr int kMaxTopK = 16;  // the largest top_k (the selection scans k x E per row)
constexpr int kWarps = kThreads / 32;

// Shared memory of for_each_routed: the chunk's items and rows, then one count per warp.
constexpr size_t kRoutedShared = 2 * kThreads * sizeof(long long) + kWarps * sizeof(int);

// The sum over the block of an int (every thread gets it); `slots` holds kWarps ints.
__device__ int block_count(int v, int* slots) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) slots[threadIdx.x / 32] = v;
  __syncthreads();
  int total = 0;
  for (int w = 0; w < kWarps; ++w) total += slots[w];
  __syncthreads();
  return total;
}

// Block e walks the items routed to expert e in ascending order, kThreads at a time: after each
// chunk, chunk(items, rows, count) runs on every thread of the block with the chunk's items and
// their expert-major rows in shared memory. Dropless (capacity 0), the first pass counts the
// items of experts before e; with a capacity, expert e's rows start at e x capacity and the walk
// stops at capacity items.
template <typename Chunk>
__device__ void for_each_routed(const long long* idx, long long n, long long e, long long capacity,
                                Chunk chunk) {
  long long* items = np_shared<long long>();
  long long* rows = items + kThreads;
  int* slots = reinterpret_cast<int*>(rows + kThreads);
  long long row = e * capacity, first = row;
  if (capacity == 0) {  // uniform over the block: every thread takes the same branch
    int before = 0;
    for (long long i = threadIdx.x; i < n; i += kThreads) before += idx[i] < e;
    row = block_count(before, slots);
  }
  int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (long long base = 0; base < n; base += kThreads) {
    long long i = base + threadIdx.x;
    bool mine = i < n && idx[i] == e;
    unsigned votes = __ballot_sync(0xffffffffu, mine);
    if (lane == 0) slots[warp] = __popc(votes);
    __syncthreads();
    int offset = 0, count = 0;
    for (int w = 0; w < kWarps; ++w) offset += w < warp ? slots[w] : 0, count += slots[w];
    if (mine) {
      int at = offset + __popc(votes & ((1u << lane) - 1u));
      items[at] = i, rows[at] = row + at;
    }
    __syncthreads();
    if (capacity > 0 && count > first + capacity - row) count = static_cast<int>(first + capacity - row);
    chunk(items, rows, count);
    __syncthreads();  // items, rows and slots are rewritten by the next chunk
    row += count;
    if (capacity > 0 && row == first + capacity) break;  // the same on every thread
  }
}

// Per row t of fp32 logits [T, E]: the top k (ties: the lower expert first) and the softmax over
// them. One thread per row; the experts chosen so far are read back from idx (a per-thread array
// would live in local memory, whose reservation the driver grows outside the allocator).
__global__ void topk_kernel(const float* logits, float* probs, long long* idx, long long T,
                            long long E, int k) {
  long long t = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= T) return;
  const float* l = logits + t * E;
  long long* chosen = idx + t * k;
  for (int j = 0; j < k; ++j) {
    long long best = -1;
    for (long long e = 0; e < E; ++e) {
      bool taken = false;
      for (int q = 0; q < j; ++q) taken |= chosen[q] == e;
      if (!taken && (best < 0 || l[e] > l[best])) best = e;
    }
    chosen[j] = best;
  }
  float m = l[chosen[0]], z = 0;
  for (int j = 0; j < k; ++j) z += expf(l[chosen[j]] - m);
  for (int j = 0; j < k; ++j) probs[t * k + j] = expf(l[chosen[j]] - m) / z;
}

// dlogits[t, idx[t,j]] = p_j (g_j - sum_i p_i g_i); 0 for the experts not chosen.
__global__ void topk_backward_kernel(const float* probs, const long long* idx, View dprobs,
                                     float* dlogits, bool acc, long long T, long long E, int k) {
  long long t = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= T) return;
  float pg = 0;
  for (int j = 0; j < k; ++j) pg += probs[t * k + j] * ld(dprobs, t * k + j);
  if (!acc)
    for (long long e = 0; e < E; ++e) dlogits[t * E + e] = 0.0f;
  for (int j = 0; j < k; ++j)
    dlogits[t * E + idx[t * k + j]] += probs[t * k + j] * (ld(dprobs, t * k + j) - pg);
}

// Per row of fp32 logits [T, E]: sigmoid of each, or the softmax over the row. One thread a row.
__global__ void route_scores_kernel(const float* logits, float* scores, long long T, long long E,
                                    bool sigmoid) {
  long long t = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= T) return;
  const float* l = logits + t * E;
  float* s = scores + t * E;
  if (sigmoid) {
    for (long long e = 0; e < E; ++e) s[e] = static_cast<float>(1.0 / (1.0 + exp(-double(l[e]))));
    return;
  }
  double m = l[0], z = 0;
  for (long long e = 1; e < E; ++e) m = fmax(m, double(l[e]));
  for (long long e = 0; e < E; ++e) z += exp(double(l[e]) - m);
  for (long long e = 0; e < E; ++e) s[e] = static_cast<float>(exp(double(l[e]) - m) / z);
}

// dl = g s (1 - s) (sigmoid), s (g - sum_e g_e s_e) (softmax); =, or += when acc.
__global__ void route_scores_backward_kernel(const float* scores, const float* g, float* dl,
                                             bool acc, long long T, long long E, bool sigmoid) {
  long long t = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= T) return;
  const float *s = scores + t * E, *gt = g + t * E;
  double gs = 0;
  if (!sigmoid)
    for (long long e = 0; e < E; ++e) gs += double(gt[e]) * s[e];
  for (long long e = 0; e < E; ++e) {
    float d = static_cast<float>(sigmoid ? double(gt[e]) * s[e] * (1.0 - s[e])
                                         : double(s[e]) * (gt[e] - gs));
    dl[t * E + e] = acc ? dl[t * E + e] + d : d;
  }
}

// (value, index) order of the routing choice: the larger value first, ties to the lower index.
__device__ bool route_before(double v, long long i, double w, long long j) {
  return v > w || (v == w && i < j);
}

// The routing of the CPU reference (executor/cpu/moe.cpp, route_choose), one thread a row:
// c = scores (+ bias); with groups, each group's score is the sum of its top `best` c, and the
// experts of the topk_groups best groups are eligible (mask row 1, else 0; masked row the score or
// -inf); the top k eligible c are chosen, best first (read back from idx, no per-thread array);
// probs are their scores, over their sum + 1e-20 when normalized, times scaling.
__global__ void route_topk_kernel(const float* scores, const float* bias, float* biased,
                                  float* mask, float* masked, float* probs, long long* idx,
                                  long long T, long long E, int k, long long groups, int topk_groups,
                                  bool normalize, float scaling) {
  long long t = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= T) return;
  const float* s = scores + t * E;
  auto c = [&](long long e) { return double(s[e]) + (bias ? double(bias[e]) : 0.0); };
  if (biased)
    for (long long e = 0; e < E; ++e) biased[t * E + e] = s[e];
  const long long n = E / groups;
  const int best = k / topk_groups;
  // Group g's score: the sum of its top `best` c, found as successive maxima in route order.
  auto group_score = [&](long long g) {
    double sum = 0, pv = 0;
    long long pi = -1;
    for (int q = 0; q < best; ++q) {
      double bv = 0;
      long long bi = -1;
      for (long long e = g * n; e < (g + 1) * n; ++e)
        if ((pi < 0 || route_before(pv, pi, c(e), e)) && (bi < 0 || route_before(c(e), e, bv, bi)))
          bv = c(e), bi = e;
      sum += bv, pv = bv, pi = bi;
    }
    return sum;
  };
  auto eligible = [&](long long e) { return groups == 1 || mask[t * E + e] != 0.0f; };
  if (groups > 1) {
    for (long long g = 0; g < groups; ++g) {
      double sg = group_score(g);
      long long ahead = 0;  // groups that beat g: g is eligible when fewer than topk_groups do
      for (long long h = 0; h < groups; ++h)
        if (h != g && route_before(group_score(h), h, sg, g)) ++ahead;
      for (long long e = g * n; e < (g + 1) * n; ++e) {
        mask[t * E + e] = ahead < topk_groups ? 1.0f : 0.0f;
        masked[t * E + e] = ahead < topk_groups ? s[e] : -INFINITY;
      }
    }
  }
  long long* chosen = idx + t * k;
  double z = 1e-20;
  for (int j = 0; j < k; ++j) {
    long long bi = -1;
    for (long long e = 0; e < E; ++e) {
      if (!eligible(e)) continue;
      bool taken = false;
      for (int q = 0; q < j; ++q) taken |= chosen[q] == e;
      if (!taken && (bi < 0 || route_before(c(e), e, c(bi), bi))) bi = e;
    }
    chosen[j] = bi;
    z += s[bi];
  }
  for (int j = 0; j < k; ++j)
    probs[t * k + j] =
        static_cast<float>((normalize ? double(s[chosen[j]]) / z : double(s[chosen[j]])) * scaling);
}

// ds at the chosen experts: c (g_j / Z - sum_l g_l s_l / Z^2) when normalized, else c g_j; 0
// elsewhere; =, or += when acc.
__global__ void route_topk_backward_kernel(const float* scores, const long long* idx, View dprobs,
                                           float* ds, bool acc, long long T, long long E, int k,
                                           bool normalize, float scaling) {
  long long t = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (t >= T) return;
  const float* s = scores + t * E;
  const long long* id = idx + t * k;
  double z = 1e-20, gs = 0;
  for (int j = 0; j < k; ++j) z += s[id[j]], gs += double(ld(dprobs, t * k + j)) * s[id[j]];
  if (!acc)
    for (long long e = 0; e < E; ++e) ds[t * E + e] = 0.0f;
  for (int j = 0; j < k; ++j) {
    double g = ld(dprobs, t * k + j);
    ds[t * E + id[j]] += static_cast<float>(scaling * (normalize ? g / z - gs / (z * z) : g));
  }
}

// The router's backward (its fp32 output gradient against bf16 weights, which cuBLAS does not
// mix): dx[t][c] (=, or +=) sum_e g[t][e] W[e][c]; dW[e][c] += sum_t g[t][e] x[t][c], t in order.
__global__ void router_dx_kernel(const float* g, View w, View dx, bool acc, long long T,
                                 long long E, long long h) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= T * h) return;
  long long t = i / h, c = i % h;
  float s = 0;
  for (long long e = 0; e < E; ++e) s += g[t * E + e] * ld(w, e * h + c);
  st(dx, i, acc ? ld(dx, i) + s : s);
}
__global__ void router_dw_kernel(const float* g, View x, View dw, long long T, long long E,
                                 long long h) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= E * h) return;
  long long e = i / h, c = i % h;
  float s = 0;
  for (long long t = 0; t < T; ++t) s += g[t * E + e] * ld(x, t * h + c);
  st(dw, i, ld(dw, i) + s);
}

// xe[row(t, j)] = x[t]: block e copies its chunk's rows cooperatively.
__global__ void dispatch_kernel(View x, const long long* idx, View xe, long long n, int k,
                                long long h, long long capacity) {
  for_each_routed(idx, n, blockIdx.x, capacity, [&](const long long* items, const long long* rows, int count) {
    for (long long p = threadIdx.x; p < count * h; p += kThreads) {
      long long q = p / h, c = p % h;
      st(xe, rows[q] * h + c, ld(x, items[q] / k * h + c));
    }
  });
}

// Pass j of a per-token sum over the k routed rows (j ascending, one pass per launch, so that
// each output row has one writer at a time): out[t] (= when j is 0 and not acc, else +=)
// scale(t, j) * rows_src[row(t, j)], with scale the routing probability (combine) or 1
// (the dispatch's backward).
__global__ void gather_pass_kernel(View src, const long long* idx, const float* probs, View out,
                                   bool assign, long long n, int k, int j, long long h,
                                   long long capacity) {
  for_each_routed(idx, n, blockIdx.x, capacity, [&](const long long* items, const long long* rows, int count) {
    for (long long p = threadIdx.x; p < count * h; p += kThreads) {
      long long q = p / h, c = p % h, i = items[q];
      if (i % k != j) continue;
      float v = ld(src, rows[q] * h + c) * (probs ? probs[i] : 1.0f);
      long long o = i / k * h + c;
      st(out, o, assign ? v : ld(out, o) + v);
    }
  });
}

// The combine's backward: dye[row] (=, or +=) p[t,j] g[t]; dp[t,j] (=, or +=) ye[row] . g[t].
__global__ void combine_backward_kernel(View ye, const float* probs, const long long* idx, View g,
                                        View dye, bool acc_ye, float* dp, bool acc_p, long long n,
                                        int k, long long h, long long capacity) {
  float* red = reinterpret_cast<float*>(np_shared<unsigned char>() + kRoutedShared);
  for_each_routed(idx, n, blockIdx.x, capacity, [&](const long long* items, const long long* rows, int count) {
    for (int q = 0; q < count; ++q) {
      long long i = items[q], t = i / k, r = rows[q];
      float dot = 0;
      for (long long c = threadIdx.x; c < h; c += kThreads) {
        float gv = ld(g, t * h + c), v = probs[i] * gv;
        dot += ld(ye, r * h + c) * gv;
        st(dye, r * h + c, acc_ye ? ld(dye, r * h + c) + v : v);
      }
      for (int o = 16; o > 0; o /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, o);
      if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = dot;
      __syncthreads();
      if (threadIdx.x == 0) {
        float s = 0;
        for (int w = 0; w < kWarps; ++w) s += red[w];
        dp[i] = acc_p ? dp[i] + s : s;
      }
      __syncthreads();
    }
  });
}

// The shared expert's gate, a block per row: out[t] = sigmoid(x[t] . w) y[t].
__global__ void shared_gate_kernel(View x, View w, View y, View out, long long h, long long f) {
  long long t = blockIdx.x;
  float z = 0;
  for (long long c = threadIdx.x; c < h; c += kThreads) z += ld(x, t * h + c) * ld(w, c);
  float s = 1.0f / (1.0f + expf(-block_sum(z)));
  for (long long c = threadIdx.x; c < f; c += kThreads) st(out, t * f + c, s * ld(y, t * f + c));
}

// Its backward per row: dy (=, or +=) s g; dz = (g . y) s (1 - s) into the workspace; dx (=, or
// +=) dz w.
__global__ void shared_gate_backward_kernel(View x, View w, View y, View g, View dx, bool acc_x,
                                            View dy, bool acc_y, float* dz, long long h,
                                            long long f) {
  long long t = blockIdx.x;
  float z = 0, gy = 0;
  for (long long c = threadIdx.x; c < h; c += kThreads) z += ld(x, t * h + c) * ld(w, c);
  for (long long c = threadIdx.x; c < f; c += kThreads) gy += ld(g, t * f + c) * ld(y, t * f + c);
  float s = 1.0f / (1.0f + expf(-block_sum(z)));
  float d = block_sum(gy) * s * (1.0f - s);
  for (long long c = threadIdx.x; c < f; c += kThreads) {
    long long e = t * f + c;
    st(dy, e, acc_y ? ld(dy, e) + s * ld(g, e) : s * ld(g, e));
  }
  for (long long c = threadIdx.x; c < h; c += kThreads) {
    long long e = t * h + c;
    st(dx, e, acc_x ? ld(dx, e) + d * ld(w, c) : d * ld(w, c));
  }
  if (threadIdx.x == 0) dz[t] = d;
}

// dw[c] += sum_t dz[t] x[t][c], t in order.
__global__ void shared_gate_dw_kernel(const float* dz, View x, View dw, long long T, long long h) {
  long long c = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= h) return;
  float s = 0;
  for (long long t = 0; t < T; ++t) s += dz[t] * ld(x, t * h + c);
  st(dw, c, ld(dw, c) + s);
}

const long long* indices(const Tensor& idx) {
  need(idx.type.dtype == Dtype::kI64 && idx.type.shape.size() == 2,
       "moe: routing indices are not i64 [tokens, top_k]");
  return static_cast<const long long*>(idx.data);
}

int top_k_of(const Tensor& idx) {
  long long k = idx.type.shape.at(1);
  need(k >= 1 && k <= kMaxTopK, "moe: top_k must be in [1, 16]");
  return static_cast<int>(k);
}

long long int_items(const Tensor& idx) {
  need(idx.numel() <= 0x7fffffffLL, "moe: more routed items than an int counts");
  return idx.numel();
}

Tensor rows_of(const Tensor& t, long long first, long long n) {
  long long w = t.type.shape.size() > 1 ? t.numel() / t.type.shape[0] : 1;
  return slice(t, first * w, {n, w});
}

// Rows per expert from the routing indices, on the host (cuBLAS takes its sizes from the host):
// start[e] .. start[e + 1] are expert e's rows (with a capacity, e C .. (e + 1) C).
std::vector<long long> expert_starts(const Tensor& idx, long long experts, long long capacity,
                                     cudaStream_t stream) {
  if (capacity > 0) {
    std::vector<long long> start(static_cast<size_t>(experts + 1));
    for (long long e = 0; e <= experts; ++e) start[static_cast<size_t>(e)] = e * capacity;
    return start;
  }
  std::vector<long long> host(static_cast<size_t>(idx.numel()));
  NP_CUDA_CHECK(cudaStreamSynchronize(stream));
  NP_CUDA_CHECK(cudaMemcpy(host.data(), idx.data, host.size() * sizeof(long long),
                           cudaMemcpyDeviceToHost));
  std::vector<long long> start(static_cast<size_t>(experts + 1), 0);
  for (long long e : host) {
    need(e >= 0 && e < experts, "moe: a routing index is outside the experts");
    ++start[static_cast<size_t>(e + 1)];
  }
  for (size_t e = 1; e < start.size(); ++e) start[e] += start[e - 1];
  return start;
}

Tensor expert_weight(const Tensor& w, long long e) {
  long long F = w.type.shape.at(1), K = w.type.shape.at(2);
  return slice(w, e * F * K, {F, K});
}

}  // namespace

void topk_forward(const Tensor& logits, const Tensor& probs, const Tensor& idx, cudaStream_t stream) {
  need(logits.type.dtype == Dtype::kFp32 && probs.type.dtype == Dtype::kFp32 &&
           logits.type.shape.size() == 2,
       "topk: logits and probabilities are fp32 [tokens, experts], [tokens, top_k]");
  long long T = logits.type.shape[0], E = logits.type.shape[1];
  int k = top_k_of(idx);
  need(k <= E && probs.numel() == T * k && idx.numel() == T * k, "topk: top_k exceeds the experts");
  if (T == 0) return;
  np_launch(topk_kernel, dim3(blocks_for(T)), dim3(kThreads), 0, stream,
            static_cast<const float*>(logits.data), probs.as<float>(),
            static_cast<long long*>(idx.data), T, E, k);
  NP_CUDA_CHECK_LAUNCH();
}

void route_scores_forward(const Tensor& logits, const Tensor& scores, bool sigmoid,
                          cudaStream_t stream) {
  need(logits.type.dtype == Dtype::kFp32 && scores.type.dtype == Dtype::kFp32 &&
           logits.type.shape.size() == 2 && scores.numel() == logits.numel(),
       "route scores: logits and scores are fp32 [tokens, experts]");
  long long T = logits.type.shape[0], E = logits.type.shape[1];
  if (T == 0) return;
  np_launch(route_scores_kernel, dim3(blocks_for(T)), dim3(kThreads), 0, stream,
            static_cast<const float*>(logits.data), scores.as<float>(), T, E, sigmoid);
  NP_CUDA_CHECK_LAUNCH();
}

void route_scores_backward(const Tensor& scores, const Tensor& dscores, const Tensor& dlogits,
                           bool accumulate, bool sigmoid, cudaStream_t stream) {
  need(scores.type.dtype == Dtype::kFp32 && dscores.type.dtype == Dtype::kFp32 &&
           dlogits.type.dtype == Dtype::kFp32 && scores.type.shape.size() == 2 &&
           dscores.numel() == scores.numel() && dlogits.numel() == scores.numel(),
       "route scores backward: fp32 [tokens, experts] throughout");
  long long T = scores.type.shape[0], E = scores.type.shape[1];
  if (T == 0) return;
  np_launch(route_scores_backward_kernel, dim3(blocks_for(T)), dim3(kThreads), 0, stream,
            static_cast<const float*>(scores.data), static_cast<const float*>(dscores.data),
            dlogits.as<float>(), accumulate, T, E, sigmoid);
  NP_CUDA_CHECK_LAUNCH();
}

void route_topk_forward(const Tensor& scores, const Tensor* bias, const RouteScratch& scratch,
                        const RouterSpec& r, const Tensor& probs, const Tensor& idx,
                        cudaStream_t stream) {
  need(scores.type.dtype == Dtype::kFp32 && probs.type.dtype == Dtype::kFp32 &&
           scores.type.shape.size() == 2,
       "route top-k: scores and probabilities are fp32 [tokens, experts], [tokens, top_k]");
  long long T = scores.type.shape[0], E = scores.type.shape[1];
  int k = top_k_of(idx);
  need(k <= E && probs.numel() == T * k && idx.numel() == T * k && r.groups >= 1 &&
           E % r.groups == 0 && r.topk_groups >= 1 && r.topk_groups <= k &&
           k <= r.topk_groups * (E / r.groups),
       "route top-k: top_k and the groups do not fit the experts");
  need((r.groups > 1) == (scratch.mask != nullptr && scratch.masked != nullptr) &&
           (!bias || bias->numel() == E),
       "route top-k: the group mask scratch is wanted exactly with groups");
  if (T == 0) return;
  auto data = [](const Tensor* x) { return x ? static_cast<float*>(x->data) : nullptr; };
  np_launch(route_topk_kernel, dim3(blocks_for(T)), dim3(kThreads), 0, stream,
            static_cast<const float*>(scores.data), static_cast<const float*>(data(bias)),
            data(scratch.biased), data(scratch.mask), data(scratch.masked), probs.as<float>(),
            static_cast<long long*>(idx.data), T, E, k, static_cast<long long>(r.groups),
            static_cast<int>(r.topk_groups), r.normalize, static_cast<float>(r.scaling));
  NP_CUDA_CHECK_LAUNCH();
}

void route_topk_backward(const Tensor& scores, const Tensor& idx, const Tensor& dprobs,
                         const RouterSpec& r, const Tensor& dscores, bool accumulate,
                         cudaStream_t stream) {
  int k = top_k_of(idx);
  long long T = idx.type.shape[0], E = T ? scores.numel() / T : 0;
  need(scores.type.dtype == Dtype::kFp32 && dscores.type.dtype == Dtype::kFp32 &&
           dscores.numel() == scores.numel() && dprobs.numel() == T * k && E >= k,
       "route top-k backward: shapes do not agree");
  if (T == 0) return;
  np_launch(route_topk_backward_kernel, dim3(blocks_for(T)), dim3(kThreads), 0, stream,
            static_cast<const float*>(scores.data), indices(idx), view(dprobs),
            dscores.as<float>(), accumulate, T, E, k, r.normalize, static_cast<float>(r.scaling));
  NP_CUDA_CHECK_LAUNCH();
}

void topk_backward(const Tensor& probs, const Tensor& idx, const Tensor& dprobs,
                   const Tensor& dlogits, bool accumulate, cudaStream_t stream) {
  int k = top_k_of(idx);
  long long T = idx.type.shape[0], E = T ? dlogits.numel() / T : 0;
  need(dlogits.type.dtype == Dtype::kFp32 && probs.type.dtype == Dtype::kFp32 &&
           dprobs.numel() == T * k && E >= k,
       "topk backward: shapes do not agree");
  if (T == 0) return;
  np_launch(topk_backward_kernel, dim3(blocks_for(T)), dim3(kThreads), 0, stream,
            static_cast<const float*>(probs.data), indices(idx), view(dprobs), dlogits.as<float>(),
            accumulate, T, E, k);
  NP_CUDA_CHECK_LAUNCH();
}

void router_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                     bool accumulate, const Tensor& dw, const Tensor* db, cudaStream_t stream) {
  long long E = w.type.shape.at(0), h = w.type.shape.at(1), T = h ? x.numel() / h : 0;
  need(dy.type.dtype == Dtype::kFp32 && dy.numel() == T * E && dx.numel() == x.numel() &&
           dw.numel() == w.numel(),
       "router backward: shapes do not agree (the output gradient is fp32)");
  if (T * h > 0)
    np_launch(router_dx_kernel, dim3(blocks_for(T * h)), dim3(kThreads), 0, stream,
              static_cast<const float*>(dy.data), view(w), view(dx), accumulate, T, E, h);
  NP_CUDA_CHECK_LAUNCH();
  if (E * h > 0)
    np_launch(router_dw_kernel, dim3(blocks_for(E * h)), dim3(kThreads), 0, stream,
              static_cast<const float*>(dy.data), view(x), view(dw), T, E, h);
  NP_CUDA_CHECK_LAUNCH();
  if (db) column_sums_add(dy, T, *db, stream);
}

void moe_dispatch_forward(const Tensor& x, const Tensor& idx, const Tensor& xe, long long experts,
                          long long capacity, cudaStream_t stream) {
  long long n = int_items(idx), h = idx.type.shape.at(0) ? x.numel() / idx.type.shape[0] : 0;
  long long rows = capacity > 0 ? experts * capacity : n;
  need(x.numel() == idx.type.shape[0] * h && xe.numel() == rows * h,
       "moe dispatch: shapes do not agree");
  if (capacity > 0) NP_CUDA_CHECK(cudaMemsetAsync(xe.data, 0, static_cast<size_t>(xe.bytes()), stream));
  if (n == 0 || experts == 0) return;
  np_launch(dispatch_kernel, dim3(static_cast<unsigned>(experts)), dim3(kThreads), kRoutedShared,
            stream, view(x), indices(idx), view(xe), n, top_k_of(idx), h, capacity);
  NP_CUDA_CHECK_LAUNCH();
}

// With a capacity, dropped choices write nothing: the output starts at zero and every pass adds.
void moe_dispatch_backward(const Tensor& dxe, const Tensor& idx, const Tensor& dx, bool accumulate,
                           long long experts, long long capacity, cudaStream_t stream) {
  long long n = int_items(idx), h = dxe.type.shape.at(1);
  need(dx.numel() == idx.type.shape.at(0) * h, "moe dispatch backward: shapes do not agree");
  if (capacity > 0 && !accumulate) {
    NP_CUDA_CHECK(cudaMemsetAsync(dx.data, 0, static_cast<size_t>(dx.bytes()), stream));
    accumulate = true;
  }
  if (n == 0 || experts == 0) return;
  for (int j = 0, k = top_k_of(idx); j < k; ++j) {
    np_launch(gather_pass_kernel, dim3(static_cast<unsigned>(experts)), dim3(kThreads),
              kRoutedShared, stream, view(dxe), indices(idx), static_cast<const float*>(nullptr),
              view(dx), j == 0 && !accumulate, n, k, j, h, capacity);
    NP_CUDA_CHECK_LAUNCH();
  }
}

void moe_combine_forward(const Tensor& ye, const Tensor& probs, const Tensor& idx, const Tensor& out,
                         long long experts, long long capacity, cudaStream_t stream) {
  long long n = int_items(idx), h = ye.type.shape.at(1);
  need(probs.type.dtype == Dtype::kFp32 && probs.numel() == n &&
           out.numel() == idx.type.shape.at(0) * h,
       "moe combine: shapes do not agree (probabilities are fp32 [tokens, top_k])");
  if (capacity > 0) NP_CUDA_CHECK(cudaMemsetAsync(out.data, 0, static_cast<size_t>(out.bytes()), stream));
  if (n == 0 || experts == 0) return;
  for (int j = 0, k = top_k_of(idx); j < k; ++j) {
    np_launch(gather_pass_kernel, dim3(static_cast<unsigned>(experts)), dim3(kThreads),
              kRoutedShared, stream, view(ye), indices(idx), static_cast<const float*>(probs.data),
              view(out), j == 0 && capacity == 0, n, k, j, h, capacity);
    NP_CUDA_CHECK_LAUNCH();
  }
}

void moe_combine_backward(const Tensor& ye, const Tensor& probs, const Tensor& idx, const Tensor& dout,
                          const Tensor& dye, bool accumulate_ye, const Tensor& dprobs,
                          bool accumulate_probs, long long experts, long long capacity,
                          cudaStream_t stream) {
  long long n = int_items(idx), h = ye.type.shape.at(1);
  need(probs.type.dtype == Dtype::kFp32 && dprobs.type.dtype == Dtype::kFp32 &&
           dprobs.numel() == n && dye.numel() == ye.numel() &&
           dout.numel() == idx.type.shape.at(0) * h,
       "moe combine backward: shapes do not agree");
  if (capacity > 0) {  // dropped choices and padding slots get zero
    if (!accumulate_ye) NP_CUDA_CHECK(cudaMemsetAsync(dye.data, 0, static_cast<size_t>(dye.bytes()), stream));
    if (!accumulate_probs)
      NP_CUDA_CHECK(cudaMemsetAsync(dprobs.data, 0, static_cast<size_t>(dprobs.bytes()), stream));
  }
  if (n == 0 || experts == 0) return;
  np_launch(combine_backward_kernel, dim3(static_cast<unsigned>(experts)), dim3(kThreads),
            kRoutedShared + kWarps * sizeof(float), stream, view(ye),
            static_cast<const float*>(probs.data), indices(idx), view(dout), view(dye), accumulate_ye,
            dprobs.as<float>(), accumulate_probs, n, top_k_of(idx), h, capacity);
  NP_CUDA_CHECK_LAUNCH();
}

void expert_forward(cublasHandle_t h, const Tensor& xe, const Tensor& idx, const Tensor& w,
                    const Tensor& out, long long capacity, cudaStream_t stream) {
  long long E = w.type.shape.at(0);
  std::vector<long long> start = expert_starts(idx, E, capacity, stream);
  need(start.back() == xe.type.shape.at(0), "expert: input rows differ from the dispatched rows");
  for (long long e = 0; e < E; ++e) {
    long long n = start[e + 1] - start[e];
    if (n > 0)
      linear_forward(h, rows_of(xe, start[e], n), expert_weight(w, e), nullptr,
                     rows_of(out, start[e], n), stream);
  }
}

void expert_backward(cublasHandle_t h, const Tensor& xe, const Tensor& idx, const Tensor& w,
                     const Tensor& dy, const Tensor& dx, bool accumulate, const Tensor& dw,
                     long long capacity, cudaStream_t stream) {
  long long E = w.type.shape.at(0);
  std::vector<long long> start = expert_starts(idx, E, capacity, stream);
  need(start.back() == xe.type.shape.at(0), "expert: input rows differ from the dispatched rows");
  for (long long e = 0; e < E; ++e) {
    long long n = start[e + 1] - start[e];
    if (n == 0) continue;
    Tensor dxe = rows_of(dx, start[e], n);
    linear_backward(h, rows_of(xe, start[e], n), expert_weight(w, e), rows_of(dy, start[e], n), &dxe,
                    accumulate, expert_weight(dw, e), nullptr, stream);
  }
}

void shared_gate_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& out,
                         cudaStream_t stream) {
  long long h = w.numel(), T = h ? x.numel() / h : 0, f = T ? y.numel() / T : 0;
  need(x.numel() == T * h && y.numel() == T * f && out.numel() == y.numel(),
       "shared gate: shapes do not agree");
  if (T == 0) return;
  np_launch(shared_gate_kernel, dim3(static_cast<unsigned>(T)), dim3(kThreads), kReduceShared, stream,
            view(x), view(w), view(y), view(out), h, f);
  NP_CUDA_CHECK_LAUNCH();
}

void shared_gate_backward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dout,
                          const Tensor& dx, bool accumulate_x, const Tensor& dy, bool accumulate_y,
                          const Tensor& dw, const Tensor& dz, cudaStream_t stream) {
  long long h = w.numel(), T = h ? x.numel() / h : 0, f = T ? y.numel() / T : 0;
  need(dout.numel() == y.numel() && dx.numel() == x.numel() && dy.numel() == y.numel() &&
           dw.numel() == h && dz.numel() == T && dz.type.dtype == Dtype::kFp32,
       "shared gate backward: shapes do not agree (dz is an fp32 workspace, one per row)");
  if (T == 0) return;
  np_launch(shared_gate_backward_kernel, dim3(static_cast<unsigned>(T)), dim3(kThreads), kReduceShared,
            stream, view(x), view(w), view(y), view(dout), view(dx), accumulate_x, view(dy),
            accumulate_y, dz.as<float>(), h, f);
  NP_CUDA_CHECK_LAUNCH();
  np_launch(shared_gate_dw_kernel, dim3(blocks_for(h)), dim3(kThreads), 0, stream,
            static_cast<const float*>(dz.data), view(x), view(dw), T, h);
  NP_CUDA_CHECK_LAUNCH();
}

}  // namespace np::cuda
