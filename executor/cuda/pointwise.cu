// Pointwise and per-row kernels: RMSNorm (a block per row, warp-shuffle and shared-memory
// reduction), LayerNorm, add, accumulate, SwiGLU (fused, or act and product), GeLU, RoPE, fill,
// column sums.
#include "executor/cuda/common.cuh"

namespace np::cuda {
namespace {

// rstd (null: not kept) receives each row's 1/rms.
__global__ void rmsnorm_forward_kernel(View x, View w, View y, float* rstd, long long h, float eps) {
  long long row = blockIdx.x;
  float ss = 0;
  for (long long c = threadIdx.x; c < h; c += kThreads) {
    float v = ld(x, row * h + c);
    ss += v * v;
  }
  float r = rsqrtf(block_sum(ss) / static_cast<float>(h) + eps);
  for (long long c = threadIdx.x; c < h; c += kThreads)
    st(y, row * h + c, ld(x, row * h + c) * r * ld(w, c));
  if (rstd && threadIdx.x == 0) rstd[row] = r;
}

// Per row: g = dy * w; dx = r * g - x * r^3 * mean(g * x); r is rstd[row] when the forward kept
// it (saved), else recomputed and written there.
__global__ void rmsnorm_backward_kernel(View x, View w, View dy, View dx, bool acc, float* rstd,
                                        bool saved, long long h, float eps) {
  long long row = blockIdx.x;
  float ss = 0, gx = 0;
  for (long long c = threadIdx.x; c < h; c += kThreads) {
    float v = ld(x, row * h + c), g = ld(dy, row * h + c) * ld(w, c);
    ss += v * v, gx += g * v;
  }
  ss = block_sum(ss);
  gx = block_sum(gx);
  float r = saved ? rstd[row] : rsqrtf(ss / static_cast<float>(h) + eps);
  float k = r * r * r * gx / static_cast<float>(h);
  for (long long c = threadIdx.x; c < h; c += kThreads) {
    long long i = row * h + c;
    float v = ld(x, i), out = r * ld(dy, i) * ld(w, c) - v * k;
    st(dx, i, acc ? ld(dx, i) + out : out);
  }
  if (!saved && threadIdx.x == 0) rstd[row] = r;
}

// dw[c] += sum over rows of dy * (x - mean) * rstd, rows in order (mean null: RMSNorm's 0).
__global__ void norm_weight_grad_kernel(View x, View dy, const float* mean, const float* rstd,
                                        long long rows, long long h, View dw) {
  long long c = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= h) return;
  float s = 0;
  for (long long r = 0; r < rows; ++r)
    s += ld(dy, r * h + c) * (ld(x, r * h + c) - (mean ? mean[r] : 0.0f)) * rstd[r];
  st(dw, c, ld(dw, c) + s);
}

// dst[c] += sum over rows of src[row][c], rows in order (deterministic).
__global__ void column_sums_kernel(View src, long long rows, long long cols, View dst) {
  long long c = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= cols) return;
  float s = 0;
  for (long long r = 0; r < rows; ++r) s += ld(src, r * cols + c);
  st(dst, c, ld(dst, c) + s);
}

// A row's mean and 1 / sqrt(variance + eps), two passes (a block per row).
struct MeanRstd {
  float mean, rstd;
};
__device__ MeanRstd mean_rstd(View x, long long row, long long h, float eps) {
  float sum = 0;
  for (long long c = threadIdx.x; c < h; c += kThreads) sum += ld(x, row * h + c);
  float mu = block_sum(sum) / static_cast<float>(h), var = 0;
  for (long long c = threadIdx.x; c < h; c += kThreads) {
    float d = ld(x, row * h + c) - mu;
    var += d * d;
  }
  return {mu, rsqrtf(block_sum(var) / static_cast<float>(h) + eps)};
}

// LayerNorm per row (a block per row): y = (x - mean) * rstd * w + b; mean and rstd (null: not
// kept) receive the row's statistics.
__global__ void layernorm_forward_kernel(View x, View w, View b, View y, float* mean, float* rstd,
                                         long long h, float eps) {
  long long row = blockIdx.x;
  MeanRstd m = mean_rstd(x, row, h, eps);
  float mu = m.mean, r = m.rstd;
  for (long long c = threadIdx.x; c < h; c += kThreads)
    st(y, row * h + c, (ld(x, row * h + c) - mu) * r * ld(w, c) + ld(b, c));
  if (mean && threadIdx.x == 0) mean[row] = mu, rstd[row] = r;
}

// dx = r (g w - mean(g w) - xh mean(g w xh)); mean[row] and rstd[row] (kept by the forward when
// saved, else recomputed and written there) for the weight gradient.
__global__ void layernorm_backward_kernel(View x, View w, View dy, View dx, bool acc,
                                          float* mean, float* rstd, bool saved, long long h,
                                          float eps) {
  long long row = blockIdx.x;
  MeanRstd m = saved ? MeanRstd{mean[row], rstd[row]} : mean_rstd(x, row, h, eps);
  float mu = m.mean, r = m.rstd, mg = 0, mgx = 0;
  for (long long c = threadIdx.x; c < h; c += kThreads) {
    float gh = ld(dy, row * h + c) * ld(w, c), xh = (ld(x, row * h + c) - mu) * r;
    mg += gh, mgx += gh * xh;
  }
  mg = block_sum(mg) / static_cast<float>(h);
  mgx = block_sum(mgx) / static_cast<float>(h);
  for (long long c = threadIdx.x; c < h; c += kThreads) {
    long long i = row * h + c;
    float g = ld(dy, i), xh = (ld(x, i) - mu) * r, out = r * (g * ld(w, c) - mg - xh * mgx);
    st(dx, i, acc ? ld(dx, i) + out : out);
  }
  if (!saved && threadIdx.x == 0) mean[row] = mu, rstd[row] = r;
}

// GeLU, tanh approximation (Hendrycks and Gimpel 2016), as the CPU reference computes it.
constexpr float kGeluC = 0.7978845608028654f, kGeluA = 0.044715f;
__global__ void gelu_forward_kernel(View x, View y, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float v = ld(x, i);
  st(y, i, 0.5f * v * (1.0f + tanhf(kGeluC * (v + kGeluA * v * v * v))));
}
__global__ void gelu_backward_kernel(View x, View dy, View dx, bool acc, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float v = ld(x, i), th = tanhf(kGeluC * (v + kGeluA * v * v * v));
  float d = 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * kGeluC * (1.0f + 3.0f * kGeluA * v * v);
  float out = ld(dy, i) * d;
  st(dx, i, acc ? ld(dx, i) + out : out);
}

__global__ void add_kernel(View a, View b, View out, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) st(out, i, ld(a, i) + ld(b, i));
}

__global__ void scale_kernel(View t, float f, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) st(t, i, ld(t, i) * f);
}

__global__ void copy_columns_kernel(View dst, long long dst_cols, long long dst_col0, View src,
                                    long long src_cols, long long src_col0, long long cols,
                                    bool acc, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  long long r = i / cols, j = i % cols, d = r * dst_cols + dst_col0 + j;
  float v = ld(src, r * src_cols + src_col0 + j);
  st(dst, d, acc ? ld(dst, d) + v : v);
}

__global__ void accumulate_kernel(View t, View v, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) st(t, i, ld(t, i) + ld(v, i));
}

__global__ void fill_kernel(View t, float value, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) st(t, i, value);
}

__device__ __forceinline__ float sigmoid(float z) { return 1.0f / (1.0f + __expf(-z)); }

// silu(gate) * up of x = [gate | up], or (times_up false: the unfused GLU's act) silu(gate) alone,
// whose backward writes (or adds) the gate half of dx and zeroes the up half when it writes.
__global__ void swiglu_forward_kernel(View x, View y, long long rows, long long f, bool times_up) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * f) return;
  long long r = i / f, c = i % f;
  float g = ld(x, r * 2 * f + c), u = times_up ? ld(x, r * 2 * f + f + c) : 1.0f;
  st(y, i, g * sigmoid(g) * u);
}
__global__ void swiglu_backward_kernel(View x, View dy, View dx, bool acc, long long rows,
                                       long long f, bool times_up) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * f) return;
  long long r = i / f, c = i % f, gi = r * 2 * f + c, ui = gi + f;
  float g = ld(x, gi), u = times_up ? ld(x, ui) : 1.0f, d = ld(dy, i), s = sigmoid(g);
  float dg = d * u * s * (1.0f + g * (1.0f - s)), du = d * g * s;
  st(dx, gi, acc ? ld(dx, gi) + dg : dg);
  if (times_up) st(dx, ui, acc ? ld(dx, ui) + du : du);
  else if (!acc) st(dx, ui, 0.0f);
}

// y = a * up; da = dy * up, and the up half of dx = dy * a (its gate half 0 or left as it is).
__global__ void glu_mul_forward_kernel(View a, View x, View y, long long rows, long long f) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * f) return;
  st(y, i, ld(a, i) * ld(x, i / f * 2 * f + f + i % f));
}
__global__ void glu_mul_backward_kernel(View a, View x, View dy, View da, bool acc_a, View dx,
                                        bool acc_x, long long rows, long long f) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * f) return;
  long long ui = i / f * 2 * f + f + i % f;
  float d = ld(dy, i), oa = d * ld(x, ui), ou = d * ld(a, i);
  st(da, i, acc_a ? ld(da, i) + oa : oa);
  st(dx, ui, acc_x ? ld(dx, ui) + ou : ou);
  if (!acc_x) st(dx, ui - f, 0.0f);
}

// q/k norms on rows [q | k | v] of `width` columns: a block per (row, head) of the nh = q + k
// normalised heads of d columns, as RMSNorm's kernels with the head's weight (wq for the first q
// heads, wk after); rstd[row * nh + head].
__global__ void qk_norm_forward_kernel(View x, View wq, View wk, View y, float* rstd, long long q,
                                       long long nh, long long d, long long width, float eps) {
  long long t = blockIdx.x / nh, j = blockIdx.x % nh, base = t * width + j * d;
  View w = j < q ? wq : wk;
  float ss = 0;
  for (long long c = threadIdx.x; c < d; c += kThreads) {
    float v = ld(x, base + c);
    ss += v * v;
  }
  float r = rsqrtf(block_sum(ss) / static_cast<float>(d) + eps);
  for (long long c = threadIdx.x; c < d; c += kThreads)
    st(y, base + c, ld(x, base + c) * r * ld(w, c));
  if (threadIdx.x == 0) rstd[blockIdx.x] = r;
}
__global__ void qk_norm_backward_kernel(View x, View wq, View wk, View dy, View dx, bool acc,
                                        const float* rstd, long long q, long long nh, long long d,
                                        long long width) {
  long long t = blockIdx.x / nh, j = blockIdx.x % nh, base = t * width + j * d;
  View w = j < q ? wq : wk;
  float gx = 0;
  for (long long c = threadIdx.x; c < d; c += kThreads)
    gx += ld(dy, base + c) * ld(w, c) * ld(x, base + c);
  gx = block_sum(gx);
  float r = rstd[blockIdx.x], k = r * r * r * gx / static_cast<float>(d);
  for (long long c = threadIdx.x; c < d; c += kThreads) {
    long long i = base + c;
    float out = r * ld(dy, i) * ld(w, c) - ld(x, i) * k;
    st(dx, i, acc ? ld(dx, i) + out : out);
  }
}
// dw[c] += sum over rows t and heads j in [j0, j1) of dy * x * rstd, in (row, head) order.
__global__ void qk_norm_weight_grad_kernel(View x, View dy, const float* rstd, long long rows,
                                           long long j0, long long j1, long long nh, long long d,
                                           long long width, View dw) {
  long long c = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= d) return;
  float s = 0;
  for (long long t = 0; t < rows; ++t)
    for (long long j = j0; j < j1; ++j) {
      long long i = t * width + j * d + c;
      s += ld(dy, i) * ld(x, i) * rstd[t * nh + j];
    }
  st(dw, c, ld(dw, c) + s);
}

// The q/k norms as PyTorch ops: a block per (row, head) of the nh normalised heads, as the
// kernels below with the head's columns of x and y at row stride `width` and of a, b, c at nh x d.
__global__ void qk_norm_hf_forward_kernel(View x, View wq, View wk, View y, float* a, float* r,
                                          float* b, View c, long long q, long long nh,
                                          long long d, long long width, float eps) {
  long long t = blockIdx.x / nh, j = blockIdx.x % nh;
  long long xs = t * width + j * d, as = (t * nh + j) * d;
  View w = j < q ? wq : wk;
  float ss = 0;
  for (long long k = threadIdx.x; k < d; k += kThreads) {
    float v = ld(x, xs + k);
    a[as + k] = v;
    ss += v * v;
  }
  float rr = rsqrtf(block_sum(ss) / static_cast<float>(d) + eps);
  if (threadIdx.x == 0) r[blockIdx.x] = rr;
  for (long long k = threadIdx.x; k < d; k += kThreads) {
    b[as + k] = a[as + k] * rr;
    st(c, as + k, b[as + k]);
    st(y, xs + k, ld(w, k) * ld(c, as + k));
  }
}
__global__ void qk_norm_hf_backward_kernel(const float* a, const float* r, View wq, View wk,
                                           View dy, float* db, float* da, View dx, bool acc,
                                           long long q, long long nh, long long d,
                                           long long width) {
  long long t = blockIdx.x / nh, j = blockIdx.x % nh;
  long long ys = t * width + j * d, as = (t * nh + j) * d;
  View w = j < q ? wq : wk;
  float dot = 0;
  for (long long k = threadIdx.x; k < d; k += kThreads) {
    db[as + k] = ld(dy, ys + k) * ld(w, k);
    dot += db[as + k] * a[as + k];
  }
  float rr = r[blockIdx.x], k3 = rr * rr * rr * block_sum(dot) / static_cast<float>(d);
  for (long long k = threadIdx.x; k < d; k += kThreads) {
    da[as + k] = db[as + k] * rr - a[as + k] * k3;
    st(dx, ys + k, acc ? ld(dx, ys + k) + da[as + k] : da[as + k]);
  }
}
// dw[k] += sum over rows t and heads j in [j0, j1) of dy * c, in (row, head) order.
__global__ void qk_norm_hf_weight_grad_kernel(View dy, View c, long long rows, long long j0,
                                              long long j1, long long nh, long long d,
                                              long long width, View dw) {
  long long k = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (k >= d) return;
  float s = 0;
  for (long long t = 0; t < rows; ++t)
    for (long long j = j0; j < j1; ++j)
      s += ld(dy, t * width + j * d + k) * ld(c, (t * nh + j) * d + k);
  st(dw, k, ld(dw, k) + s);
}

// RMSNorm as PyTorch ops, a block per row.
__global__ void rmsnorm_hf_forward_kernel(View x, View w, View y, float* a, float* r, float* b,
                                          View c, long long h, float eps) {
  long long row = blockIdx.x;
  float ss = 0;
  for (long long k = threadIdx.x; k < h; k += kThreads) {
    float v = ld(x, row * h + k);
    a[row * h + k] = v;
    ss += v * v;
  }
  float rr = rsqrtf(block_sum(ss) / static_cast<float>(h) + eps);
  if (threadIdx.x == 0) r[row] = rr;
  for (long long k = threadIdx.x; k < h; k += kThreads) {
    long long i = row * h + k;
    b[i] = a[i] * rr;
    st(c, i, b[i]);
    st(y, i, ld(w, k) * ld(c, i));
  }
}
__global__ void rmsnorm_hf_backward_kernel(const float* a, const float* r, View w, View dy,
                                           float* db, float* da, View dx, bool acc, long long h) {
  long long row = blockIdx.x;
  float dot = 0;
  for (long long k = threadIdx.x; k < h; k += kThreads) {
    long long i = row * h + k;
    db[i] = ld(dy, i) * ld(w, k);
    dot += db[i] * a[i];
  }
  float rr = r[row], k3 = rr * rr * rr * block_sum(dot) / static_cast<float>(h);
  for (long long k = threadIdx.x; k < h; k += kThreads) {
    long long i = row * h + k;
    da[i] = db[i] * rr - a[i] * k3;
    st(dx, i, acc ? ld(dx, i) + da[i] : da[i]);
  }
}
// db = dy * c elementwise (the weight gradient's rows, summed by column_sums_add).
__global__ void mul_kernel(View p, View q, float* out, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) out[i] = ld(p, i) * ld(q, i);
}

// repeat_kv: a thread per output element (forward) or per input element (backward).
__global__ void repeat_kv_forward_kernel(View x, View y, long long rows, long long hq,
                                         long long hkv, long long d) {
  long long wy = 3 * hq * d, wx = (hq + 2 * hkv) * d;
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * wy) return;
  long long t = i / wy, c = i % wy, part = c / (hq * d), h = (c % (hq * d)) / d, j = c % d;
  long long src = part == 0 ? c : (hq + (part == 2 ? hkv : 0) + h / (hq / hkv)) * d + j;
  st(y, i, ld(x, t * wx + src));
}
__global__ void repeat_kv_backward_kernel(View dy, View dx, bool acc, long long rows, long long hq,
                                          long long hkv, long long d) {
  long long wy = 3 * hq * d, wx = (hq + 2 * hkv) * d, rep = hq / hkv;
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * wx) return;
  long long t = i / wx, c = i % wx;
  float s;
  if (c < hq * d) {
    s = ld(dy, t * wy + c);
  } else {
    long long v = c >= (hq + hkv) * d, g = (c - (hq + v * hkv) * d) / d, j = c % d;
    s = 0;
    for (long long h = g * rep; h < (g + 1) * rep; ++h) s += ld(dy, t * wy + ((1 + v) * hq + h) * d + j);
  }
  st(dx, i, acc ? ld(dx, i) + s : s);
}

// Elements c0 and c1 of `in` (pair j of a head of d features, at position pos) rotated into
// `out` by sign x pos 10000^(-2j/d), in double as the CPU reference computes the angle.
__device__ void rotate_pair(View in, View out, long long c0, long long c1, long long j,
                            long long d, long long pos, float sign) {
  double ang = static_cast<double>(pos) *
               pow(10000.0, -2.0 * static_cast<double>(j) / static_cast<double>(d));
  double s = 0, c = 0;
  sincospi(ang / 3.14159265358979323846, &s, &c);
  float cs = static_cast<float>(c), sn = static_cast<float>(sign * s);
  float x0 = ld(in, c0), x1 = ld(in, c1);
  st(out, c0, x0 * cs - x1 * sn);
  st(out, c1, x1 * cs + x0 * sn);
}

// One thread per (row, rotated head, i < d/2): (x0, x1) = (c0, c0 + d/2) rotated by the angle
// pos * 10000^(-2i/d), computed in double as the CPU reference does; v heads are copied. The
// cosine and sine come from sincospi of the angle in half-turns: cos and sin of a double reduce
// large arguments through a routine that keeps a stack in local memory (which the driver reserves
// outside the allocator; tests/ptxas_resources.sh), sincospi's reduction is exact.
__global__ void rope_kernel(View in, View out, long long rows, long long q_heads,
                            long long kv_heads, long long d, long long first, long long batch,
                            float sign) {
  long long width = (q_heads + 2 * kv_heads) * d, half = d / 2, rotated = q_heads + kv_heads;
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  long long per_row = rotated * half + kv_heads * d;  // rotated pairs, then v elements
  if (i >= rows * per_row) return;
  long long t = i / per_row, k = i % per_row;
  if (k >= rotated * half) {  // a v element: unchanged
    long long c = rotated * d + (k - rotated * half);
    st(out, t * width + c, ld(in, t * width + c));
    return;
  }
  long long head = k / half, j = k % half, c0 = t * width + head * d + j;
  rotate_pair(in, out, c0, c0 + half, j, d, (first + t) / batch, sign);
}


// One thread per rotated pair of rows [heads x d]: adjacent pairs (2j, 2j + 1) or halves (j,
// j + d / 2), j the pair's index in its head; angle and rounding as rope_kernel's.
__global__ void rope_heads_kernel(View in, View out, long long rows, long long width, long long d,
                                  bool adjacent, long long first, long long batch, float sign) {
  long long half = d / 2, per_row = width / 2;
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * per_row) return;
  long long t = i / per_row, k = i % per_row, head = k / half, j = k % half;
  long long c0 = t * width + head * d + (adjacent ? 2 * j : j);
  rotate_pair(in, out, c0, c0 + (adjacent ? 1 : half), j, d, (first + t) / batch, sign);
}

__global__ void silu_forward_kernel(View x, View y, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float v = ld(x, i);
  st(y, i, v * sigmoid(v));
}
__global__ void silu_backward_kernel(View x, View dy, View dx, bool acc, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float v = ld(x, i), s = sigmoid(v), d = ld(dy, i) * (s + v * s * (1.0f - s));
  st(dx, i, acc ? ld(dx, i) + d : d);
}
__global__ void mul_forward_kernel(View a, View b, View y, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  st(y, i, ld(a, i) * ld(b, i));
}
__global__ void mul_backward_kernel(View a, View b, View dy, View da, bool acc_a, View db,
                                    bool acc_b, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float d = ld(dy, i), ga = d * ld(b, i), gb = d * ld(a, i);
  st(da, i, acc_a ? ld(da, i) + ga : ga);
  st(db, i, acc_b ? ld(db, i) + gb : gb);
}

// Element i of the rotation of the r-wide part at x[base..] (rotate-half pairs (j, j + r/2), theta
// 10000, angle pos 10000^(-2j/r) times sign), as rope_kernel computes it.
__device__ float mla_rotated(View x, long long base, long long i, long long r, double pos,
                             float sign) {
  long long half = r / 2, j = i < half ? i : i - half;
  double ang = pos * pow(10000.0, -2.0 * static_cast<double>(j) / static_cast<double>(r));
  double s = 0, c = 0;
  sincospi(ang / 3.14159265358979323846, &s, &c);
  float cs = static_cast<float>(c), sn = static_cast<float>(sign * s);
  float x0 = ld(x, base + j), x1 = ld(x, base + j + half);
  return i < half ? x0 * cs - x1 * sn : x1 * cs + x0 * sn;
}

// One thread per output element of [q | k | v] (h heads of dqk, dqk, dv).
__global__ void mla_rope_kernel(View q, View kv, View pe, View out, long long rows, MlaShape m) {
  long long h = m.heads, dqk = m.head_dim, r = m.rope_dim, dn = dqk - r, dv = m.v_head_dim;
  long long width = h * (2 * dqk + dv), e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= rows * width) return;
  long long t = e / width, c = e % width;
  double pos = static_cast<double>((m.first_row + t) / m.batch);
  float y;
  if (c < h * dqk) {  // q: content, then its own RoPE part rotated
    long long hd = c / dqk, i = c % dqk;
    y = i < dn ? ld(q, t * h * dqk + c) : mla_rotated(q, t * h * dqk + hd * dqk + dn, i - dn, r, pos, 1.0f);
  } else if (c < 2 * h * dqk) {  // k: its content from kv, the token's RoPE part rotated
    long long hd = (c - h * dqk) / dqk, i = (c - h * dqk) % dqk;
    y = i < dn ? ld(kv, t * h * (dn + dv) + hd * dn + i) : mla_rotated(pe, t * r, i - dn, r, pos, 1.0f);
  } else {  // v
    y = ld(kv, t * h * (dn + dv) + h * dn + (c - 2 * h * dqk));
  }
  st(out, e, y);
}

// dq and dkv, one thread per element of the wider of the two rows (dq: h dqk; dkv: h (dn + dv)).
__global__ void mla_rope_dq_dkv_kernel(View g, View dq, View dkv, long long rows, MlaShape m) {
  long long h = m.heads, dqk = m.head_dim, r = m.rope_dim, dn = dqk - r, dv = m.v_head_dim;
  long long gw = h * (2 * dqk + dv), qw = h * dqk, kw = h * (dn + dv);
  long long n = qw > kw ? qw : kw;
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= rows * n) return;
  long long t = e / n, c = e % n;
  double pos = static_cast<double>((m.first_row + t) / m.batch);
  if (c < qw) {
    long long hd = c / dqk, i = c % dqk;
    st(dq, t * qw + c,
       i < dn ? ld(g, t * gw + c) : mla_rotated(g, t * gw + hd * dqk + dn, i - dn, r, pos, -1.0f));
  }
  if (c < kw)
    st(dkv, t * kw + c,
       c < h * dn ? ld(g, t * gw + qw + c / dn * dqk + c % dn) : ld(g, t * gw + 2 * qw + (c - h * dn)));
}

// dpe[t][i]: the heads' k RoPE-part gradients rotated back, summed in head order.
__global__ void mla_rope_dpe_kernel(View g, View dpe, long long rows, MlaShape m) {
  long long h = m.heads, dqk = m.head_dim, r = m.rope_dim, dn = dqk - r, dv = m.v_head_dim;
  long long gw = h * (2 * dqk + dv), e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= rows * r) return;
  long long t = e / r, i = e % r;
  double pos = static_cast<double>((m.first_row + t) / m.batch);
  float sum = 0;
  for (long long hd = 0; hd < h; ++hd)
    sum += mla_rotated(g, t * gw + h * dqk + hd * dqk + dn, i, r, pos, -1.0f);
  st(dpe, e, sum);
}
}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor* rstd,
                     float eps, cudaStream_t stream) {
  long long h = w.numel(), rows = h ? x.numel() / h : 0;
  need(rows * h == x.numel() && y.numel() == x.numel() &&
           (!rstd || (rstd->numel() == rows && rstd->type.dtype == Dtype::kFp32)),
       "rmsnorm: x, w, y and rstd do not agree");
  if (rows == 0) return;
  np_launch(rmsnorm_forward_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads),
            kReduceShared, stream, view(x), view(w), view(y),
            rstd ? rstd->as<float>() : static_cast<float*>(nullptr), h, eps);
  NP_CUDA_CHECK_LAUNCH();
}

void rmsnorm_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                      bool accumulate, const Tensor& dw, const Tensor& rstd, bool saved,
                      float eps, cudaStream_t stream) {
  long long h = w.numel(), rows = h ? x.numel() / h : 0;
  need(rows * h == x.numel() && dy.numel() == x.numel() && dx.numel() == x.numel() &&
           dw.numel() == h && rstd.numel() == rows && rstd.type.dtype == Dtype::kFp32,
       "rmsnorm backward: shapes do not agree (rstd: one fp32 per row)");
  if (rows == 0) return;
  np_launch(rmsnorm_backward_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads),
            kReduceShared, stream, view(x), view(w), view(dy), view(dx), accumulate,
            rstd.as<float>(), saved, h, eps);
  NP_CUDA_CHECK_LAUNCH();
  np_launch(norm_weight_grad_kernel, dim3(blocks_for(h)), dim3(kThreads), 0, stream, view(x),
            view(dy), static_cast<const float*>(nullptr), static_cast<const float*>(rstd.data),
            rows, h, view(dw));
  NP_CUDA_CHECK_LAUNCH();
}

void qk_norm_forward(const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& y,
                     const Tensor& rstd, long long q_heads, long long kv_heads, float eps,
                     cudaStream_t stream) {
  long long d = wq.numel(), nh = q_heads + kv_heads, width = (q_heads + 2 * kv_heads) * d;
  long long rows = width ? x.numel() / width : 0;
  need(rows * width == x.numel() && wk.numel() == d && y.numel() == x.numel() &&
           rstd.numel() == rows * nh && rstd.type.dtype == Dtype::kFp32,
       "qk_norm: x, the weights, y and rstd do not agree with the heads");
  if (rows == 0) return;
  np_launch(qk_norm_forward_kernel, dim3(static_cast<unsigned>(rows * nh)), dim3(kThreads),
            kReduceShared, stream, view(x), view(wq), view(wk), view(y), rstd.as<float>(),
            q_heads, nh, d, width, eps);
  NP_CUDA_CHECK_LAUNCH();
  copy_columns(y, nh * d, x, nh * d, width - nh * d, false, stream);  // the values
}

void qk_norm_backward(const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& dy,
                      const Tensor& dx, bool accumulate, const Tensor& dwq, const Tensor& dwk,
                      const Tensor& rstd, long long q_heads, long long kv_heads,
                      cudaStream_t stream) {
  long long d = wq.numel(), nh = q_heads + kv_heads, width = (q_heads + 2 * kv_heads) * d;
  long long rows = width ? x.numel() / width : 0;
  need(rows * width == x.numel() && wk.numel() == d && dy.numel() == x.numel() &&
           dx.numel() == x.numel() && dwq.numel() == d && dwk.numel() == d &&
           rstd.numel() == rows * nh && rstd.type.dtype == Dtype::kFp32,
       "qk_norm backward: shapes do not agree (rstd: one fp32 per row and head)");
  if (rows == 0) return;
  np_launch(qk_norm_backward_kernel, dim3(static_cast<unsigned>(rows * nh)), dim3(kThreads),
            kReduceShared, stream, view(x), view(wq), view(wk), view(dy), view(dx), accumulate,
            static_cast<const float*>(rstd.data), q_heads, nh, d, width);
  NP_CUDA_CHECK_LAUNCH();
  copy_columns(dx, nh * d, dy, nh * d, width - nh * d, accumulate, stream);  // the values
  for (int k = 0; k < 2; ++k) {
    np_launch(qk_norm_weight_grad_kernel, dim3(blocks_for(d)), dim3(kThreads), 0, stream, view(x),
              view(dy), static_cast<const float*>(rstd.data), rows, k ? q_heads : 0LL,
              k ? nh : q_heads, nh, d, width, view(k ? dwk : dwq));
    NP_CUDA_CHECK_LAUNCH();
  }
}

void qk_norm_hf_forward(const Tensor& x, const Tensor& wq, const Tensor& wk, const Tensor& y,
                        const Tensor& a, const Tensor& r, const Tensor& b, const Tensor& c,
                        long long q_heads, long long kv_heads, float eps, cudaStream_t stream) {
  long long d = wq.numel(), nh = q_heads + kv_heads, width = (q_heads + 2 * kv_heads) * d;
  long long rows = width ? x.numel() / width : 0, n = rows * nh * d;
  need(rows * width == x.numel() && wk.numel() == d && y.numel() == x.numel() &&
           a.numel() == n && b.numel() == n && c.numel() == n && r.numel() == rows * nh &&
           a.type.dtype == Dtype::kFp32 && b.type.dtype == Dtype::kFp32 &&
           r.type.dtype == Dtype::kFp32,
       "qk_norm (PyTorch ops): x, the weights, y, a, r, b and c do not agree with the heads");
  if (rows == 0) return;
  np_launch(qk_norm_hf_forward_kernel, dim3(static_cast<unsigned>(rows * nh)), dim3(kThreads),
            kReduceShared, stream, view(x), view(wq), view(wk), view(y), a.as<float>(),
            r.as<float>(), b.as<float>(), view(c), q_heads, nh, d, width, eps);
  NP_CUDA_CHECK_LAUNCH();
  copy_columns(y, nh * d, x, nh * d, width - nh * d, false, stream);  // the values
}

void qk_norm_hf_backward(const Tensor& a, const Tensor& r, const Tensor& c, const Tensor& wq,
                         const Tensor& wk, const Tensor& dy, const Tensor& db, const Tensor& da,
                         const Tensor& dx, bool accumulate, const Tensor& dwq, const Tensor& dwk,
                         long long q_heads, long long kv_heads, cudaStream_t stream) {
  long long d = wq.numel(), nh = q_heads + kv_heads, width = (q_heads + 2 * kv_heads) * d;
  long long rows = width ? dy.numel() / width : 0, n = rows * nh * d;
  need(rows * width == dy.numel() && wk.numel() == d && dx.numel() == dy.numel() &&
           a.numel() == n && c.numel() == n && db.numel() == n && da.numel() == n &&
           r.numel() == rows * nh && dwq.numel() == d && dwk.numel() == d &&
           db.type.dtype == Dtype::kFp32 && da.type.dtype == Dtype::kFp32,
       "qk_norm backward (PyTorch ops): shapes do not agree");
  if (rows == 0) return;
  for (int k = 0; k < 2; ++k) {
    np_launch(qk_norm_hf_weight_grad_kernel, dim3(blocks_for(d)), dim3(kThreads), 0, stream,
              view(dy), view(c), rows, k ? q_heads : 0LL, k ? nh : q_heads, nh, d, width,
              view(k ? dwk : dwq));
    NP_CUDA_CHECK_LAUNCH();
  }
  np_launch(qk_norm_hf_backward_kernel, dim3(static_cast<unsigned>(rows * nh)), dim3(kThreads),
            kReduceShared, stream, static_cast<const float*>(a.data),
            static_cast<const float*>(r.data), view(wq), view(wk), view(dy), db.as<float>(),
            da.as<float>(), view(dx), accumulate, q_heads, nh, d, width);
  NP_CUDA_CHECK_LAUNCH();
  copy_columns(dx, nh * d, dy, nh * d, width - nh * d, accumulate, stream);  // the values
}

void column_sums_add(const Tensor& src, long long rows, const Tensor& dst, cudaStream_t stream) {
  long long cols = dst.numel();
  need(src.numel() >= rows * cols, "column sums: the source is smaller than rows x cols");
  if (cols == 0) return;
  np_launch(column_sums_kernel, dim3(blocks_for(cols)), dim3(kThreads), 0, stream, view(src), rows,
            cols, view(dst));
  NP_CUDA_CHECK_LAUNCH();
}

void layernorm_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                       const Tensor* mean, const Tensor* rstd, float eps, cudaStream_t stream) {
  long long h = w.numel(), rows = h ? x.numel() / h : 0;
  auto row_stat = [&](const Tensor* t) {
    return t && t->numel() == rows && t->type.dtype == Dtype::kFp32;
  };
  need(rows * h == x.numel() && y.numel() == x.numel() && b.numel() == h &&
           ((!mean && !rstd) || (row_stat(mean) && row_stat(rstd))),
       "layernorm: x, w, b, y, mean and rstd do not agree");
  if (rows == 0) return;
  np_launch(layernorm_forward_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads),
            kReduceShared, stream, view(x), view(w), view(b), view(y),
            mean ? mean->as<float>() : static_cast<float*>(nullptr),
            rstd ? rstd->as<float>() : static_cast<float*>(nullptr), h, eps);
  NP_CUDA_CHECK_LAUNCH();
}

void layernorm_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Tensor& dx,
                        bool accumulate, const Tensor& dw, const Tensor& db, const Tensor& mean,
                        const Tensor& rstd, bool saved, float eps, cudaStream_t stream) {
  long long h = w.numel(), rows = h ? x.numel() / h : 0;
  need(rows * h == x.numel() && dy.numel() == x.numel() && dx.numel() == x.numel() &&
           dw.numel() == h && db.numel() == h && mean.numel() == rows && rstd.numel() == rows &&
           mean.type.dtype == Dtype::kFp32 && rstd.type.dtype == Dtype::kFp32,
       "layernorm backward: shapes do not agree (mean, rstd: one fp32 per row)");
  if (rows == 0) return;
  np_launch(layernorm_backward_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads),
            kReduceShared, stream, view(x), view(w), view(dy), view(dx), accumulate,
            mean.as<float>(), rstd.as<float>(), saved, h, eps);
  NP_CUDA_CHECK_LAUNCH();
  np_launch(norm_weight_grad_kernel, dim3(blocks_for(h)), dim3(kThreads), 0, stream, view(x),
            view(dy), static_cast<const float*>(mean.data), static_cast<const float*>(rstd.data),
            rows, h, view(dw));
  NP_CUDA_CHECK_LAUNCH();
  column_sums_add(dy, rows, db, stream);
}

namespace {
// An elementwise activation's forward (kernel(x, y, n)) and backward (kernel(x, dy, dx, acc, n)),
// and an elementwise binary op (kernel(a, b, out, n)), launched one thread per element.
template <typename Kernel>
void unary_forward(Kernel kernel, const char* what, const Tensor& x, const Tensor& y,
                   cudaStream_t stream) {
  long long n = x.numel();
  need(y.numel() == n, what);
  if (n == 0) return;
  np_launch(kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(x), view(y), n);
  NP_CUDA_CHECK_LAUNCH();
}
template <typename Kernel>
void unary_backward(Kernel kernel, const char* what, const Tensor& x, const Tensor& dy,
                    const Tensor& dx, bool accumulate, cudaStream_t stream) {
  long long n = x.numel();
  need(dy.numel() == n && dx.numel() == n, what);
  if (n == 0) return;
  np_launch(kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(x), view(dy), view(dx),
            accumulate, n);
  NP_CUDA_CHECK_LAUNCH();
}
template <typename Kernel>
void binary(Kernel kernel, const char* what, const Tensor& a, const Tensor& b, const Tensor& out,
            cudaStream_t stream) {
  long long n = out.numel();
  need(a.numel() == n && b.numel() == n, what);
  if (n == 0) return;
  np_launch(kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(a), view(b), view(out), n);
  NP_CUDA_CHECK_LAUNCH();
}
}  // namespace

void gelu_forward(const Tensor& x, const Tensor& y, cudaStream_t stream) {
  unary_forward(gelu_forward_kernel, "gelu: sizes differ", x, y, stream);
}
void gelu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate,
                   cudaStream_t stream) {
  unary_backward(gelu_backward_kernel, "gelu backward: sizes differ", x, dy, dx, accumulate, stream);
}
void silu_forward(const Tensor& x, const Tensor& y, cudaStream_t stream) {
  unary_forward(silu_forward_kernel, "silu: sizes differ", x, y, stream);
}
void silu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate,
                   cudaStream_t stream) {
  unary_backward(silu_backward_kernel, "silu backward: sizes differ", x, dy, dx, accumulate, stream);
}

void add(const Tensor& a, const Tensor& b, const Tensor& out, cudaStream_t stream) {
  binary(add_kernel, "add: sizes differ", a, b, out, stream);
}
void mul_forward(const Tensor& a, const Tensor& b, const Tensor& y, cudaStream_t stream) {
  binary(mul_forward_kernel, "mul: sizes differ", a, b, y, stream);
}

void scale(const Tensor& t, float f, cudaStream_t stream) {
  long long n = t.numel();
  if (n == 0) return;
  np_launch(scale_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(t), f, n);
  NP_CUDA_CHECK_LAUNCH();
}

void copy_columns(const Tensor& dst, long long dst_col0, const Tensor& src, long long src_col0,
                  long long cols, bool acc, cudaStream_t stream) {
  long long rows = dst.type.shape.at(0), dst_cols = dst.numel() / std::max(rows, 1LL),
            src_cols = src.numel() / std::max(rows, 1LL), n = rows * cols;
  need(src.type.shape.at(0) == rows && dst_col0 + cols <= dst_cols && src_col0 + cols <= src_cols,
       "copy_columns: the column blocks do not fit");
  if (n == 0) return;
  np_launch(copy_columns_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(dst),
            dst_cols, dst_col0, view(src), src_cols, src_col0, cols, acc, n);
  NP_CUDA_CHECK_LAUNCH();
}

void accumulate(const Tensor& t, const Tensor& v, cudaStream_t stream) {
  long long n = t.numel();
  need(v.numel() == n, "accumulate: sizes differ");
  if (n == 0) return;
  np_launch(accumulate_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(t), view(v), n);
  NP_CUDA_CHECK_LAUNCH();
}

void fill(const Tensor& t, float value, cudaStream_t stream) {
  long long n = t.numel();
  if (n == 0) return;
  np_launch(fill_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(t), value, n);
  NP_CUDA_CHECK_LAUNCH();
}

namespace {
// The fused SwiGLU (times_up) and the unfused GLU's act share these kernels.
void glu_forward(const Tensor& x, const Tensor& y, bool times_up, cudaStream_t stream) {
  long long n = y.numel();
  need(x.numel() == 2 * n && !y.type.shape.empty(),
       times_up ? "swiglu: x must be [rows, 2f], y [rows, f]"
                : "glu_act: x must be [rows, 2f], y [rows, f]");
  long long f = y.type.shape.back(), rows = f ? n / f : 0;
  if (n == 0) return;
  np_launch(swiglu_forward_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(x),
            view(y), rows, f, times_up);
  NP_CUDA_CHECK_LAUNCH();
}
void glu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate,
                  bool times_up, cudaStream_t stream) {
  long long n = dy.numel();
  need(x.numel() == 2 * n && dx.numel() == x.numel() && !dy.type.shape.empty(),
       times_up ? "swiglu backward: shapes do not agree" : "glu_act backward: shapes do not agree");
  long long f = dy.type.shape.back(), rows = f ? n / f : 0;
  if (n == 0) return;
  np_launch(swiglu_backward_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(x),
            view(dy), view(dx), accumulate, rows, f, times_up);
  NP_CUDA_CHECK_LAUNCH();
}
}  // namespace

void swiglu_forward(const Tensor& x, const Tensor& y, cudaStream_t stream) {
  glu_forward(x, y, true, stream);
}
void swiglu_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate,
                     cudaStream_t stream) {
  glu_backward(x, dy, dx, accumulate, true, stream);
}
void glu_act_forward(const Tensor& x, const Tensor& y, cudaStream_t stream) {
  glu_forward(x, y, false, stream);
}
void glu_act_backward(const Tensor& x, const Tensor& dy, const Tensor& dx, bool accumulate,
                      cudaStream_t stream) {
  glu_backward(x, dy, dx, accumulate, false, stream);
}

void rmsnorm_hf_forward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& a,
                        const Tensor& r, const Tensor& b, const Tensor& c, float eps,
                        cudaStream_t stream) {
  long long h = w.numel(), rows = h ? x.numel() / h : 0, n = x.numel();
  need(rows * h == n && y.numel() == n && a.numel() == n && b.numel() == n && c.numel() == n &&
           r.numel() == rows && a.type.dtype == Dtype::kFp32 && b.type.dtype == Dtype::kFp32 &&
           r.type.dtype == Dtype::kFp32,
       "rmsnorm (PyTorch ops): x, w, y, a, r, b and c do not agree");
  if (rows == 0) return;
  np_launch(rmsnorm_hf_forward_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads),
            kReduceShared, stream, view(x), view(w), view(y), a.as<float>(), r.as<float>(),
            b.as<float>(), view(c), h, eps);
  NP_CUDA_CHECK_LAUNCH();
}

void rmsnorm_hf_backward(const Tensor& a, const Tensor& r, const Tensor& c, const Tensor& w,
                         const Tensor& dy, const Tensor& db, const Tensor& da, const Tensor& dx,
                         bool accumulate, const Tensor& dw, cudaStream_t stream) {
  long long h = w.numel(), rows = h ? a.numel() / h : 0, n = a.numel();
  need(rows * h == n && r.numel() == rows && c.numel() == n && dy.numel() == n &&
           db.numel() == n && da.numel() == n && dx.numel() == n && dw.numel() == h &&
           db.type.dtype == Dtype::kFp32 && da.type.dtype == Dtype::kFp32,
       "rmsnorm backward (PyTorch ops): shapes do not agree");
  if (rows == 0) return;
  // The weight gradient first, its rows in db (overwritten below).
  np_launch(mul_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(dy), view(c),
            db.as<float>(), n);
  NP_CUDA_CHECK_LAUNCH();
  column_sums_add(db, rows, dw, stream);
  np_launch(rmsnorm_hf_backward_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads),
            kReduceShared, stream, static_cast<const float*>(a.data),
            static_cast<const float*>(r.data), view(w), view(dy), db.as<float>(), da.as<float>(),
            view(dx), accumulate, h);
  NP_CUDA_CHECK_LAUNCH();
}

void repeat_kv_forward(const Tensor& x, const Tensor& y, long long q_heads, long long kv_heads,
                       long long head_dim, cudaStream_t stream) {
  long long wx = (q_heads + 2 * kv_heads) * head_dim, rows = wx ? x.numel() / wx : 0;
  need(kv_heads > 0 && q_heads % kv_heads == 0 && rows * wx == x.numel() &&
           y.numel() == rows * 3 * q_heads * head_dim,
       "repeat_kv: x must be [rows, (hq + 2 hkv) d], y [rows, 3 hq d]");
  if (y.numel() == 0) return;
  np_launch(repeat_kv_forward_kernel, dim3(blocks_for(y.numel())), dim3(kThreads), 0, stream,
            view(x), view(y), rows, q_heads, kv_heads, head_dim);
  NP_CUDA_CHECK_LAUNCH();
}

void repeat_kv_backward(const Tensor& dy, const Tensor& dx, bool accumulate, long long q_heads,
                        long long kv_heads, long long head_dim, cudaStream_t stream) {
  long long wx = (q_heads + 2 * kv_heads) * head_dim, rows = wx ? dx.numel() / wx : 0;
  need(kv_heads > 0 && q_heads % kv_heads == 0 && rows * wx == dx.numel() &&
           dy.numel() == rows * 3 * q_heads * head_dim,
       "repeat_kv backward: dx must be [rows, (hq + 2 hkv) d], dy [rows, 3 hq d]");
  if (dx.numel() == 0) return;
  np_launch(repeat_kv_backward_kernel, dim3(blocks_for(dx.numel())), dim3(kThreads), 0, stream,
            view(dy), view(dx), accumulate, rows, q_heads, kv_heads, head_dim);
  NP_CUDA_CHECK_LAUNCH();
}

void glu_mul_forward(const Tensor& a, const Tensor& x, const Tensor& y, cudaStream_t stream) {
  long long n = y.numel();
  need(a.numel() == n && x.numel() == 2 * n && !y.type.shape.empty(),
       "glu_mul: a and y must be [rows, f], x [rows, 2f]");
  long long f = y.type.shape.back(), rows = f ? n / f : 0;
  if (n == 0) return;
  np_launch(glu_mul_forward_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(a),
            view(x), view(y), rows, f);
  NP_CUDA_CHECK_LAUNCH();
}

void glu_mul_backward(const Tensor& a, const Tensor& x, const Tensor& dy, const Tensor& da,
                      bool accumulate_a, const Tensor& dx, bool accumulate_x, cudaStream_t stream) {
  long long n = dy.numel();
  need(a.numel() == n && da.numel() == n && x.numel() == 2 * n && dx.numel() == x.numel() &&
           !dy.type.shape.empty(),
       "glu_mul backward: shapes do not agree");
  long long f = dy.type.shape.back(), rows = f ? n / f : 0;
  if (n == 0) return;
  np_launch(glu_mul_backward_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(a),
            view(x), view(dy), view(da), accumulate_a, view(dx), accumulate_x, rows, f);
  NP_CUDA_CHECK_LAUNCH();
}

void rope(const Tensor& in, const Tensor& out, long long q_heads, long long kv_heads,
          long long head_dim, long long first_row, long long batch, float sign,
          cudaStream_t stream) {
  long long width = (q_heads + 2 * kv_heads) * head_dim, rows = width ? in.numel() / width : 0;
  need(head_dim % 2 == 0 && rows * width == in.numel() && out.numel() == in.numel() && batch > 0,
       "rope: the rows are not [q | k | v] of even head_dim");
  long long n = rows * ((q_heads + kv_heads) * (head_dim / 2) + kv_heads * head_dim);
  if (n == 0) return;
  np_launch(rope_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(in), view(out),
            rows, q_heads, kv_heads, head_dim, first_row, batch, sign);
  NP_CUDA_CHECK_LAUNCH();
}

void rope_heads(const Tensor& in, const Tensor& out, long long head_dim, bool adjacent,
                long long first_row, long long batch, float sign, cudaStream_t stream) {
  long long width = in.type.shape.empty() ? 0 : in.type.shape.back(),
            rows = width ? in.numel() / width : 0;
  need(head_dim > 0 && head_dim % 2 == 0 && width % head_dim == 0 && out.numel() == in.numel() &&
           batch > 0,
       "rope: the rows are not heads of even head_dim");
  long long n = rows * width / 2;
  if (n == 0) return;
  np_launch(rope_heads_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(in), view(out),
            rows, width, head_dim, adjacent, first_row, batch, sign);
  NP_CUDA_CHECK_LAUNCH();
}

void mul_backward(const Tensor& a, const Tensor& b, const Tensor& dy, const Tensor& da,
                  bool accumulate_a, const Tensor& db, bool accumulate_b, cudaStream_t stream) {
  long long n = dy.numel();
  need(a.numel() == n && b.numel() == n && da.numel() == n && db.numel() == n,
       "mul backward: sizes differ");
  if (n == 0) return;
  np_launch(mul_backward_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(a), view(b),
            view(dy), view(da), accumulate_a, view(db), accumulate_b, n);
  NP_CUDA_CHECK_LAUNCH();
}

void mla_rope_forward(const Tensor& q, const Tensor& kv, const Tensor& pe, const Tensor& out,
                      const MlaShape& m, cudaStream_t stream) {
  long long dn = m.head_dim - m.rope_dim, rows = q.type.shape.at(0);
  need(m.heads > 0 && m.rope_dim > 0 && m.rope_dim % 2 == 0 && dn > 0 && m.v_head_dim > 0 &&
           m.batch > 0 && q.numel() == rows * m.heads * m.head_dim &&
           kv.numel() == rows * m.heads * (dn + m.v_head_dim) && pe.numel() == rows * m.rope_dim &&
           out.numel() == rows * m.heads * (2 * m.head_dim + m.v_head_dim),
       "mla_rope: inputs are not [T, heads head_dim], [T, heads (nope + v)], [T, rope_dim]");
  long long n = out.numel();
  if (n == 0) return;
  np_launch(mla_rope_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(q), view(kv),
            view(pe), view(out), rows, m);
  NP_CUDA_CHECK_LAUNCH();
}

void mla_rope_backward(const Tensor& g, const Tensor& dq, const Tensor& dkv, const Tensor& dpe,
                       const MlaShape& m, cudaStream_t stream) {
  long long dn = m.head_dim - m.rope_dim, rows = g.type.shape.at(0);
  long long qw = m.heads * m.head_dim, kw = m.heads * (dn + m.v_head_dim);
  need(m.batch > 0 && dn > 0 && g.numel() == rows * m.heads * (2 * m.head_dim + m.v_head_dim) &&
           dq.numel() == rows * qw && dkv.numel() == rows * kw && dpe.numel() == rows * m.rope_dim,
       "mla_rope backward: shapes do not agree");
  if (rows == 0) return;
  long long n = rows * (qw > kw ? qw : kw);
  np_launch(mla_rope_dq_dkv_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, stream, view(g),
            view(dq), view(dkv), rows, m);
  NP_CUDA_CHECK_LAUNCH();
  np_launch(mla_rope_dpe_kernel, dim3(blocks_for(rows * m.rope_dim)), dim3(kThreads), 0, stream,
            view(g), view(dpe), rows, m);
  NP_CUDA_CHECK_LAUNCH();
}

void cuda_failure(const char* statement, const char* file, int line, const std::string& what) {
  int device = -1;
  cudaGetDevice(&device);
  throw std::runtime_error(std::string(statement) + " failed at " + file + ":" +
                           std::to_string(line) + " on device " + std::to_string(device) + ": " +
                           what);
}

}  // namespace np::cuda
