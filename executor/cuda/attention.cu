// Causal self-attention, FlashAttention-style: the forward keeps only the output and the
// logsumexp; the backward recomputes the probabilities. qkv rows are [q heads | k heads | v heads]
// of this rank, or q, k and v are three tensors (SDPA's; Geo says where each lies) (GQA: hq / hkv
// query heads share a key-value head), row t = pos * batch + b, scale
// 1/sqrt(head_dim). bf16 tensors run on the tensor cores (mma.cuh): tiles of 32 queries and 32
// keys in shared memory, head_dim padded to a multiple of 16. fp32 tensors (tests) run on the CUDA
// cores, one thread per row with its running state in registers. No atomics: every output element
// has one writer, so results are deterministic. The values' head dim dv may be below head_dim
// (multi-head latent attention): v and the output are dv wide, read zero-padded to head_dim, so
// every product runs at head_dim. Also here: the eager path (scores and context through cuBLAS,
// the causal softmax).
#include "executor/cuda/common.cuh"
#include "executor/cuda/mma.cuh"

namespace np::cuda {
namespace {

constexpr int kRows = 32;   // query (or key) rows per block: one per thread
constexpr int kTile = 16;   // rows per shared-memory tile
constexpr int kMaxD = 256;  // largest head_dim (the fp32 kernels' shared rows fit up to it)

struct Geo {
  long long b, s, hq, hkv, d, width;
  float scale;
  long long dv = 0;  // the values' (and the output's) head dim, at most d
  // The first (batch, head) index of this launch: gridDim.y is at most 65,535, so batch x heads
  // beyond it launch in slices (launch_heads), each block's index y0 + blockIdx.y.
  long long y0 = 0;
  // Where q, k and v are read and their gradients written: the three views of one [q | k | v]
  // tensor (width-wide rows, K from column k0, V from v0), or three tensors of their own widths
  // (SDPA's separate inputs: k0 = v0 = 0). acc_*: the gradient is added into (else written).
  View q, k, v, gq, gk, gv;
  long long qw = 0, kw = 0, vw = 0, k0 = 0, v0 = 0;
  bool acc_q = false, acc_k = false, acc_v = false;
  NP_HD long long row(long long bi, long long pos) const { return pos * b + bi; }
  NP_HD long long group() const { return hq / hkv; }
  NP_HD long long q_col(long long h) const { return h * d; }
  NP_HD long long k_col(long long h) const { return k0 + h / group() * d; }
  NP_HD long long v_col(long long h) const { return v0 + h / group() * dv; }
  // Element c of head h's query, key or value at token row t.
  NP_HD long long qe(long long t, long long h, long long c) const { return t * qw + q_col(h) + c; }
  NP_HD long long ke(long long t, long long h, long long c) const { return t * kw + k_col(h) + c; }
  NP_HD long long ve(long long t, long long h, long long c) const { return t * vw + v_col(h) + c; }
  // Output (and output gradient) rows: hq heads of dv.
  NP_HD long long o_width() const { return hq * dv; }
  NP_HD long long o_col(long long h) const { return h * dv; }
  NP_HD long long stat(long long bi, long long h, long long i) const { return (bi * hq + h) * s + i; }
};

// The keys and values of positions j0 .. j0 + kTile - 1 of head h into shared memory (rows past
// the sequence hold row 0's: they are never used).
__device__ void load_kv_tile(const Geo& g, long long bi, long long h, long long j0, float* ks,
                             float* vs) {
  for (long long e = threadIdx.x; e < kTile * g.d; e += kRows) {
    long long j = j0 + e / g.d, c = e % g.d;
    long long tj = g.row(bi, j < g.s ? j : 0);
    ks[e] = ld(g.k, g.ke(tj, h, c));
    vs[e] = c < g.dv ? ld(g.v, g.ve(tj, h, c)) : 0.0f;
  }
}

// Causal: every key j <= i of this thread's query row i, tile by tile through shared memory (ks,
// vs: kTile keys and values); visit(jj) sees key j0 + jj at row jj of the tile. All threads of the
// block take part in the loads, also those past the sequence (active false).
template <typename Visit>
__device__ void for_each_causal_key(const Geo& g, long long bi, long long h, long long i,
                                    bool active, float* ks, float* vs, Visit visit) {
  long long last = static_cast<long long>(blockIdx.x) * kRows + kRows - 1;
  if (last >= g.s) last = g.s - 1;
  for (long long j0 = 0; j0 <= last; j0 += kTile) {
    load_kv_tile(g, bi, h, j0, ks, vs);
    __syncthreads();
    for (long long jj = 0; jj < kTile && active && j0 + jj <= i; ++jj) visit(jj);
    __syncthreads();  // the tile is overwritten next
  }
}

// Block (x: a tile of kRows query positions, y: batch * q head); thread: one query row.
__global__ void flash_forward_kernel(View out, float* lse, Geo g) {
  long long bi = (g.y0 + blockIdx.y) / g.hq, h = (g.y0 + blockIdx.y) % g.hq;
  long long i = static_cast<long long>(blockIdx.x) * kRows + threadIdx.x;
  bool active = i < g.s;
  float* ks = np_shared<float>();  // kTile keys, then kTile values, d floats each
  float* vs = ks + kTile * g.d;
  // This thread's query row and accumulator in shared memory, element c at c * kRows + thread
  // (no per-thread arrays: they would live in local memory, whose reservation the driver grows
  // outside the allocator).
  float* q = vs + kTile * g.d + threadIdx.x;
  float* acc = q + kRows * g.d;
  long long ti = g.row(bi, active ? i : 0);
  for (long long c = 0; c < g.d; ++c)
    q[c * kRows] = active ? ld(g.q, g.qe(ti, h, c)) : 0.f;
  for (long long c = 0; c < g.d; ++c) acc[c * kRows] = 0;
  float m = -INFINITY, l = 0;
  for_each_causal_key(g, bi, h, i, active, ks, vs, [&](long long jj) {
    float sc = 0;
    for (long long c = 0; c < g.d; ++c) sc += q[c * kRows] * ks[jj * g.d + c];
    sc *= g.scale;
    float m2 = fmaxf(m, sc), corr = __expf(m - m2), p = __expf(sc - m2);
    l = l * corr + p;
    for (long long c = 0; c < g.d; ++c)
      acc[c * kRows] = acc[c * kRows] * corr + p * vs[jj * g.d + c];
    m = m2;
  });
  if (!active) return;
  for (long long c = 0; c < g.dv; ++c)
    st(out, ti * g.o_width() + g.o_col(h) + c, acc[c * kRows] / l);
  lse[g.stat(bi, h, i)] = m + __logf(l);
}

// ---- the tensor-core forward (bf16) ----
// Block: kMmaRows query rows (one 16-row slab per warp) of one (batch, q head); key tiles of
// kMmaKeys. S = Q K^T and O += P V run on the tensor cores (mma_16x16x16) from shared memory,
// head_dim padded with zeros to a multiple of 16; the online softmax runs one thread per row in
// fp32, P rounded to bf16 for the second product (as FlashAttention-2 does).
constexpr int kMmaRows = 32, kMmaKeys = 32, kMmaWarps = kMmaRows / kMmaTile;

// Shared-memory arrays cut one after another from a base address, each 32-byte aligned (the
// tensor-core wrapper's requirement). Built on the device from the block's shared memory, and on
// the host from address 0 to size the launch.
struct Carve {
  uintptr_t base;
  size_t at = 0;
  template <typename T>
  NP_HD T* take(long long n) {
    at = (at + 31) / 32 * 32;
    T* p = reinterpret_cast<T*>(base + at);
    at += static_cast<size_t>(n) * sizeof(T);
    return p;
  }
};

using bf16 = __nv_bfloat16;

// The forward's tiles: Q, K, V (bf16, dp wide), P (bf16) and S (fp32) of the key tile, the output
// accumulator O (fp32), and per row the running max, sum and the rescaling factor.
struct ForwardSmem {
  bf16 *q, *k, *v, *p;
  float *s, *o, *m, *l, *corr;
  size_t bytes;
  NP_HD ForwardSmem(uintptr_t base, long long dp) {
    Carve c{base};
    q = c.take<bf16>(kMmaRows * dp), k = c.take<bf16>(kMmaKeys * dp), v = c.take<bf16>(kMmaKeys * dp);
    p = c.take<bf16>(kMmaRows * kMmaKeys), s = c.take<float>(kMmaRows * kMmaKeys);
    o = c.take<float>(kMmaRows * dp);
    m = c.take<float>(kMmaRows), l = c.take<float>(kMmaRows), corr = c.take<float>(kMmaRows);
    bytes = c.at;
  }
};

// rows x dp bf16 tile of `src` (rows of `width` elements, row t = pos * batch + b) from column
// col: positions pos0.. (past the sequence: 0), columns past `cols` (d, or dv for v and dO): 0.
__device__ void load_tile_bf16(View src, long long width, const Geo& g, long long bi, long long pos0,
                               long long col, int rows, long long dp, bf16* dst, long long cols) {
  for (long long e = threadIdx.x; e < rows * dp; e += kMmaWarps * 32) {
    long long r = e / dp, c = e % dp, pos = pos0 + r;
    float x = pos < g.s && c < cols ? ld(src, g.row(bi, pos) * width + col + c) : 0.0f;
    dst[e] = __float2bfloat16(x);
  }
}

// c[rows of this warp's 16-row slab] = a (16 x kd, row-major) x b (kd x n), over n / 16 column
// tiles and kd / 16 k-steps; b column-major (b^T row-major) or row-major.
template <bool b_col_major>
__device__ void warp_gemm(const bf16* a, long long lda, const bf16* b, long long ldb, float* c,
                          long long ldc, long long n, long long kd) {
  for (long long cb = 0; cb < n; cb += kMmaTile)
    for (long long kk = 0; kk < kd; kk += kMmaTile)
      mma_16x16x16<b_col_major>(a + kk, static_cast<unsigned>(lda),
                                b_col_major ? b + cb * ldb + kk : b + kk * ldb + cb,
                                static_cast<unsigned>(ldb), c + cb, static_cast<unsigned>(ldc));
}

__global__ void flash_forward_mma_kernel(View out, float* lse, Geo g, long long dp) {
  const long long bh = g.y0 + blockIdx.y;
  long long bi = bh / g.hq, h = bh % g.hq, i0 = static_cast<long long>(blockIdx.x) * kMmaRows;
  ForwardSmem t(reinterpret_cast<uintptr_t>(np_shared<unsigned char>()), dp);
  int tid = threadIdx.x, warp = tid / 32;
  const int nthreads = kMmaWarps * 32;
  load_tile_bf16(g.q, g.qw, g, bi, i0, g.q_col(h), kMmaRows, dp, t.q, g.d);
  for (long long e = tid; e < kMmaRows * dp; e += nthreads) t.o[e] = 0.0f;
  if (tid < kMmaRows) t.m[tid] = -INFINITY, t.l[tid] = 0.0f;
  long long last = i0 + kMmaRows - 1 < g.s ? i0 + kMmaRows - 1 : g.s - 1;
  for (long long j0 = 0; j0 <= last; j0 += kMmaKeys) {
    load_tile_bf16(g.k, g.kw, g, bi, j0, g.k_col(h), kMmaKeys, dp, t.k, g.d);
    load_tile_bf16(g.v, g.vw, g, bi, j0, g.v_col(h), kMmaKeys, dp, t.v, g.dv);
    for (long long e = tid; e < kMmaRows * kMmaKeys; e += nthreads) t.s[e] = 0.0f;
    __syncthreads();
    // S (this warp's 16 rows x the tile's keys) = Q K^T: K row-major is K^T column-major.
    warp_gemm<true>(t.q + warp * kMmaTile * dp, dp, t.k, dp, t.s + warp * kMmaTile * kMmaKeys,
                    kMmaKeys, kMmaKeys, dp);
    __syncthreads();
    if (tid < kMmaRows) {  // the online softmax of row i over this tile's keys j <= i
      long long i = i0 + tid;
      float m = t.m[tid], mx = m;
      for (int jj = 0; jj < kMmaKeys; ++jj)
        if (j0 + jj <= i && i < g.s) mx = fmaxf(mx, g.scale * t.s[tid * kMmaKeys + jj]);
      float c = mx == -INFINITY ? 1.0f : __expf(m - mx), sum = 0.0f;
      for (int jj = 0; jj < kMmaKeys; ++jj) {
        bool live = j0 + jj <= i && i < g.s;
        float p = live ? __expf(g.scale * t.s[tid * kMmaKeys + jj] - mx) : 0.0f;
        sum += p;
        t.p[tid * kMmaKeys + jj] = __float2bfloat16(p);
      }
      t.m[tid] = mx, t.l[tid] = t.l[tid] * c + sum, t.corr[tid] = c;
    }
    __syncthreads();
    for (long long e = tid; e < kMmaRows * dp; e += nthreads) t.o[e] *= t.corr[e / dp];
    __syncthreads();
    // O (this warp's 16 rows x dp) += P V, V row-major.
    warp_gemm<false>(t.p + warp * kMmaTile * kMmaKeys, kMmaKeys, t.v, dp,
                     t.o + warp * kMmaTile * dp, dp, dp, kMmaKeys);
    __syncthreads();  // the tiles are overwritten next
  }
  for (long long e = tid; e < kMmaRows * g.dv; e += nthreads) {
    long long r = e / g.dv, c = e % g.dv, i = i0 + r;
    if (i < g.s) st(out, g.row(bi, i) * g.o_width() + g.o_col(h) + c, t.o[r * dp + c] / t.l[r]);
  }
  if (tid < kMmaRows && i0 + tid < g.s) lse[g.stat(bi, h, i0 + tid)] = t.m[tid] + __logf(t.l[tid]);
}

// ---- the tensor-core backward (bf16), FlashAttention-2's arithmetic without its atomics ----
// Both kernels recompute S = Q K^T and dP = dO V^T of a (query tile, key tile) pair on the tensor
// cores, then P = exp(scale S - lse) and dS = P (dP - D) below the diagonal (fp32, rounded to bf16
// for the next product). The key-major kernel accumulates dV += P^T dO and dK += dS^T Q over the
// group's query heads and the query tiles; the query-major one dQ += dS K over the key tiles. Each
// output has one writer: deterministic.
struct BackwardSmem {
  bf16 *q, *go, *k, *v, *p, *ds;  // p and ds: [kMmaRows x kMmaKeys], or transposed (key-major)
  float *s, *dp, *acc0, *acc1, *lse, *D;
  size_t bytes;
  NP_HD BackwardSmem(uintptr_t base, long long dpad) {
    Carve c{base};
    q = c.take<bf16>(kMmaRows * dpad), go = c.take<bf16>(kMmaRows * dpad);
    k = c.take<bf16>(kMmaKeys * dpad), v = c.take<bf16>(kMmaKeys * dpad);
    p = c.take<bf16>(kMmaRows * kMmaKeys), ds = c.take<bf16>(kMmaRows * kMmaKeys);
    s = c.take<float>(kMmaRows * kMmaKeys), dp = c.take<float>(kMmaRows * kMmaKeys);
    acc0 = c.take<float>(kMmaKeys * dpad), acc1 = c.take<float>(kMmaKeys * dpad);
    lse = c.take<float>(kMmaRows), D = c.take<float>(kMmaRows);
    bytes = c.at;
  }
};

// S and dP of query tile i0 (head h) against key tile j0, then P and dS (transposed when
// `key_major`: element (key c, query r) at c * kMmaRows + r). Expects the four tiles and lse, D
// loaded; returns with p and ds complete.
__device__ void scores_and_grads(BackwardSmem& t, const Geo& g, long long i0, long long j0,
                                 long long dp, bool key_major) {
  int tid = threadIdx.x, warp = tid / 32;
  const int nthreads = kMmaWarps * 32;
  for (long long e = tid; e < kMmaRows * kMmaKeys; e += nthreads) t.s[e] = 0.0f, t.dp[e] = 0.0f;
  __syncthreads();
  warp_gemm<true>(t.q + warp * kMmaTile * dp, dp, t.k, dp, t.s + warp * kMmaTile * kMmaKeys,
                  kMmaKeys, kMmaKeys, dp);
  warp_gemm<true>(t.go + warp * kMmaTile * dp, dp, t.v, dp, t.dp + warp * kMmaTile * kMmaKeys,
                  kMmaKeys, kMmaKeys, dp);
  __syncthreads();
  for (long long e = tid; e < kMmaRows * kMmaKeys; e += nthreads) {
    long long r = e / kMmaKeys, c = e % kMmaKeys, i = i0 + r, j = j0 + c;
    bool live = j <= i && i < g.s;
    float p = live ? __expf(g.scale * t.s[e] - t.lse[r]) : 0.0f;
    float ds = live ? p * (t.dp[e] - t.D[r]) : 0.0f;
    long long at = key_major ? c * kMmaRows + r : e;
    t.p[at] = __float2bfloat16(p);
    t.ds[at] = __float2bfloat16(ds);
  }
  __syncthreads();
}

// The query tile i0 of head h: Q, dO, lse and D.
__device__ void load_query_tile(BackwardSmem& t, View dout, const float* lse, const float* D,
                                const Geo& g, long long bi, long long h, long long i0,
                                long long dp) {
  load_tile_bf16(g.q, g.qw, g, bi, i0, g.q_col(h), kMmaRows, dp, t.q, g.d);
  load_tile_bf16(dout, g.o_width(), g, bi, i0, g.o_col(h), kMmaRows, dp, t.go, g.dv);
  for (long long r = threadIdx.x; r < kMmaRows; r += kMmaWarps * 32) {
    bool in = i0 + r < g.s;
    t.lse[r] = in ? lse[g.stat(bi, h, i0 + r)] : 0.0f;
    t.D[r] = in ? D[g.stat(bi, h, i0 + r)] : 0.0f;
  }
}

// Block (x: a tile of kMmaKeys key positions, y: batch * kv head).
__global__ void flash_dkv_mma_kernel(View dout, const float* lse, const float* D, Geo g,
                                     long long dp) {
  const long long bh = g.y0 + blockIdx.y;
  long long bi = bh / g.hkv, kvh = bh % g.hkv, h0 = kvh * g.group();
  long long j0 = static_cast<long long>(blockIdx.x) * kMmaKeys;
  BackwardSmem t(reinterpret_cast<uintptr_t>(np_shared<unsigned char>()), dp);
  int tid = threadIdx.x, warp = tid / 32;
  const int nthreads = kMmaWarps * 32;
  float *dk = t.acc0, *dv = t.acc1;
  for (long long e = tid; e < kMmaKeys * dp; e += nthreads) dk[e] = 0.0f, dv[e] = 0.0f;
  load_tile_bf16(g.k, g.kw, g, bi, j0, g.k_col(h0), kMmaKeys, dp, t.k, g.d);
  load_tile_bf16(g.v, g.vw, g, bi, j0, g.v_col(h0), kMmaKeys, dp, t.v, g.dv);
  for (long long h = h0; h < h0 + g.group(); ++h)
    for (long long i0 = j0 / kMmaRows * kMmaRows; i0 < g.s; i0 += kMmaRows) {  // causal: i >= j
      load_query_tile(t, dout, lse, D, g, bi, h, i0, dp);
      scores_and_grads(t, g, i0, j0, dp, true);
      // This warp's 16 keys: dV += P^T dO, dK += dS^T Q (the scale applied at the end).
      warp_gemm<false>(t.p + warp * kMmaTile * kMmaRows, kMmaRows, t.go, dp,
                       dv + warp * kMmaTile * dp, dp, dp, kMmaRows);
      warp_gemm<false>(t.ds + warp * kMmaTile * kMmaRows, kMmaRows, t.q, dp,
                       dk + warp * kMmaTile * dp, dp, dp, kMmaRows);
      __syncthreads();  // the query tiles are overwritten next
    }
  for (long long e = tid; e < kMmaKeys * g.d; e += nthreads) {
    long long r = e / g.d, c = e % g.d, j = j0 + r;
    if (j >= g.s) continue;
    long long tj = g.row(bi, j), ek = g.ke(tj, h0, c), ev = g.ve(tj, h0, c);
    float k = g.scale * dk[r * dp + c], v = dv[r * dp + c];
    st(g.gk, ek, g.acc_k ? ld(g.gk, ek) + k : k);
    if (c < g.dv) st(g.gv, ev, g.acc_v ? ld(g.gv, ev) + v : v);
  }
}

// Block (x: a tile of kMmaRows query positions, y: batch * q head): dQ into the fp32 workspace.
__global__ void flash_dq_mma_kernel(View dout, const float* lse, const float* D, float* dq, Geo g,
                                    long long dp) {
  const long long bh = g.y0 + blockIdx.y;
  long long bi = bh / g.hq, h = bh % g.hq, i0 = static_cast<long long>(blockIdx.x) * kMmaRows;
  BackwardSmem t(reinterpret_cast<uintptr_t>(np_shared<unsigned char>()), dp);
  int tid = threadIdx.x, warp = tid / 32;
  const int nthreads = kMmaWarps * 32;
  float* acc = t.acc0;
  for (long long e = tid; e < kMmaRows * dp; e += nthreads) acc[e] = 0.0f;
  load_query_tile(t, dout, lse, D, g, bi, h, i0, dp);
  long long last = i0 + kMmaRows - 1 < g.s ? i0 + kMmaRows - 1 : g.s - 1;
  for (long long j0 = 0; j0 <= last; j0 += kMmaKeys) {
    load_tile_bf16(g.k, g.kw, g, bi, j0, g.k_col(h), kMmaKeys, dp, t.k, g.d);
    load_tile_bf16(g.v, g.vw, g, bi, j0, g.v_col(h), kMmaKeys, dp, t.v, g.dv);
    scores_and_grads(t, g, i0, j0, dp, false);
    // This warp's 16 queries: dQ += dS K, K row-major.
    warp_gemm<false>(t.ds + warp * kMmaTile * kMmaKeys, kMmaKeys, t.k, dp,
                     acc + warp * kMmaTile * dp, dp, dp, kMmaKeys);
    __syncthreads();  // the key tiles are overwritten next
  }
  for (long long e = tid; e < kMmaRows * g.d; e += nthreads) {
    long long r = e / g.d, c = e % g.d, i = i0 + r;
    if (i < g.s) dq[g.row(bi, i) * g.hq * g.d + g.q_col(h) + c] = g.scale * acc[r * dp + c];
  }
}

// D[b][h][i] = dO_i . O_i: one thread per (row, head).
__global__ void rowsum_kernel(View dout, View out, float* D, Geo g) {
  long long k = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (k >= g.b * g.hq * g.s) return;
  long long bi = k / (g.hq * g.s), h = (k / g.s) % g.hq, i = k % g.s, t = g.row(bi, i);
  float s = 0;
  for (long long c = 0; c < g.dv; ++c) {
    long long e = t * g.o_width() + g.o_col(h) + c;
    s += ld(dout, e) * ld(out, e);
  }
  D[k] = s;
}

// dQ_i = scale * sum_{j <= i} P_ij (dO_i . v_j - D_i) k_j, into the fp32 workspace dq.
__global__ void flash_dq_kernel(View dout, const float* lse, const float* D, float* dq, Geo g) {
  long long bi = (g.y0 + blockIdx.y) / g.hq, h = (g.y0 + blockIdx.y) % g.hq;
  long long i = static_cast<long long>(blockIdx.x) * kRows + threadIdx.x;
  bool active = i < g.s;
  float* ks = np_shared<float>();
  float* vs = ks + kTile * g.d;
  // This thread's rows in shared memory, element c at c * kRows + thread (as the forward's).
  float* q = vs + kTile * g.d + threadIdx.x;
  float* go = q + kRows * g.d;
  float* acc = go + kRows * g.d;
  long long ti = g.row(bi, active ? i : 0);
  for (long long c = 0; c < g.d; ++c) {
    q[c * kRows] = active ? ld(g.q, g.qe(ti, h, c)) : 0.f;
    go[c * kRows] = active && c < g.dv ? ld(dout, ti * g.o_width() + g.o_col(h) + c) : 0.f;
    acc[c * kRows] = 0;
  }
  float li = active ? lse[g.stat(bi, h, i)] : 0.f, di = active ? D[g.stat(bi, h, i)] : 0.f;
  for_each_causal_key(g, bi, h, i, active, ks, vs, [&](long long jj) {
    float sc = 0, dv = 0;
    for (long long c = 0; c < g.d; ++c)
      sc += q[c * kRows] * ks[jj * g.d + c], dv += go[c * kRows] * vs[jj * g.d + c];
    float p = __expf(g.scale * sc - li), ds = p * (dv - di);
    for (long long c = 0; c < g.d; ++c) acc[c * kRows] += g.scale * ds * ks[jj * g.d + c];
  });
  if (!active) return;
  for (long long c = 0; c < g.d; ++c) dq[ti * g.hq * g.d + g.q_col(h) + c] = acc[c * kRows];
}

// Block (x: a tile of kRows key positions, y: batch * kv head); thread: one key row j. Over the
// query heads of its group and the queries i >= j: dV_j += P_ij dO_i, dK_j += scale dS_ij q_i.
__global__ void flash_dkv_kernel(View dout, const float* lse, const float* D, Geo g) {
  long long bi = (g.y0 + blockIdx.y) / g.hkv, kvh = (g.y0 + blockIdx.y) % g.hkv;
  long long j = static_cast<long long>(blockIdx.x) * kRows + threadIdx.x;
  bool active = j < g.s;
  float* qs = np_shared<float>();  // kTile queries, kTile output gradients, kTile lse, kTile D
  float* gs = qs + kTile * g.d;
  float* ls = gs + kTile * g.d;
  float* ds_ = ls + kTile;
  // This thread's key and value rows and their gradients in shared memory, element c at
  // c * kRows + thread (as the forward's).
  float* k = ds_ + kTile + threadIdx.x;
  float* v = k + kRows * g.d;
  float* dk = v + kRows * g.d;
  float* dv = dk + kRows * g.d;
  long long tj = g.row(bi, active ? j : 0), h0 = kvh * g.group();
  for (long long c = 0; c < g.d; ++c) {
    k[c * kRows] = active ? ld(g.k, g.ke(tj, h0, c)) : 0.f;
    v[c * kRows] = active && c < g.dv ? ld(g.v, g.ve(tj, h0, c)) : 0.f;
    dk[c * kRows] = 0, dv[c * kRows] = 0;
  }
  long long first = static_cast<long long>(blockIdx.x) * kRows;  // causal: queries >= first
  for (long long h = h0; h < h0 + g.group(); ++h)
    for (long long i0 = first; i0 < g.s; i0 += kTile) {
      for (long long e = threadIdx.x; e < kTile * g.d; e += kRows) {
        long long i = i0 + e / g.d, c = e % g.d;
        long long ti = g.row(bi, i < g.s ? i : 0);
        qs[e] = ld(g.q, g.qe(ti, h, c));
        gs[e] = c < g.dv ? ld(dout, ti * g.o_width() + g.o_col(h) + c) : 0.0f;
      }
      for (long long e = threadIdx.x; e < kTile; e += kRows) {
        long long i = i0 + e < g.s ? i0 + e : 0;
        ls[e] = lse[g.stat(bi, h, i)];
        ds_[e] = D[g.stat(bi, h, i)];
      }
      __syncthreads();
      for (long long ii = 0; ii < kTile && active; ++ii) {
        long long i = i0 + ii;
        if (i >= g.s) break;
        if (i < j) continue;
        float sc = 0, gv = 0;
        for (long long c = 0; c < g.d; ++c)
          sc += qs[ii * g.d + c] * k[c * kRows], gv += gs[ii * g.d + c] * v[c * kRows];
        float p = __expf(g.scale * sc - ls[ii]), dsc = p * (gv - ds_[ii]);
        for (long long c = 0; c < g.d; ++c) {
          dv[c * kRows] += p * gs[ii * g.d + c];
          dk[c * kRows] += g.scale * dsc * qs[ii * g.d + c];
        }
      }
      __syncthreads();
    }
  if (!active) return;
  for (long long c = 0; c < g.d; ++c) {
    long long ek = g.ke(tj, h0, c), ev = g.ve(tj, h0, c);
    st(g.gk, ek, g.acc_k ? ld(g.gk, ek) + dk[c * kRows] : dk[c * kRows]);
    if (c < g.dv) st(g.gv, ev, g.acc_v ? ld(g.gv, ev) + dv[c * kRows] : dv[c * kRows]);
  }
}

// The queries' gradient from the fp32 dq workspace.
__global__ void dq_to_dx_kernel(const float* dq, Geo g) {
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  long long n = g.b * g.s * g.hq * g.d;
  if (e >= n) return;
  long long t = e / (g.hq * g.d), c = e % (g.hq * g.d), x = t * g.qw + c;
  st(g.gq, x, g.acc_q ? ld(g.gq, x) + dq[e] : dq[e]);
}

// Eager path: probs = causal softmax(scale * scores) per row of {b, heads, s, s} (a block per
// row; entries above the diagonal become 0), and its backward dx = scale p (g - sum_j p g).
__global__ void causal_softmax_kernel(View x, View out, long long s, float scale) {
  long long row = blockIdx.x, i = row % s;
  float m = -INFINITY;
  for (long long j = threadIdx.x; j <= i; j += kThreads) m = fmaxf(m, scale * ld(x, row * s + j));
  m = block_max(m);
  float z = 0;
  for (long long j = threadIdx.x; j <= i; j += kThreads) z += __expf(scale * ld(x, row * s + j) - m);
  z = block_sum(z);
  for (long long j = threadIdx.x; j < s; j += kThreads)
    st(out, row * s + j, j <= i ? __expf(scale * ld(x, row * s + j) - m) / z : 0.0f);
}

__global__ void causal_softmax_backward_kernel(View p, View g, View dx, bool acc, long long s,
                                               float scale) {
  long long row = blockIdx.x;
  float dot = 0;
  for (long long j = threadIdx.x; j < s; j += kThreads) dot += ld(p, row * s + j) * ld(g, row * s + j);
  dot = block_sum(dot);
  for (long long j = threadIdx.x; j < s; j += kThreads) {
    long long e = row * s + j;
    float d = scale * ld(p, e) * (ld(g, e) - dot);
    st(dx, e, acc ? ld(dx, e) + d : d);
  }
}

// Entries above the diagonal of {.., s, s} matrices (n elements) become 0.
__global__ void causal_zero_kernel(View t, long long s, long long n) {
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e < n && e % s > (e / s) % s) st(t, e, 0.0f);
}

Geo shape_of(const AttentionShape& a) {
  const long long dv = a.v_head_dim > 0 ? a.v_head_dim : a.head_dim;
  need(a.batch > 0 && a.seq > 0 && a.q_heads > 0 && a.kv_heads > 0 && a.head_dim > 0 &&
           a.q_heads % a.kv_heads == 0 && a.head_dim <= kMaxD && dv <= a.head_dim,
       "attention: bad batch, seq, heads or head_dim (head_dim at most 256, v_head_dim at most "
       "head_dim)");
  Geo g{a.batch, a.seq, a.q_heads, a.kv_heads, a.head_dim,
        (a.q_heads + a.kv_heads) * a.head_dim + a.kv_heads * dv,
        static_cast<float>(1.0 / std::sqrt(static_cast<double>(a.head_dim))), dv};
  return g;
}

// One [q | k | v] tensor (its gradient, when given, as the three gradients, added into when
// `accumulate`).
Geo geometry(const AttentionShape& a, const Tensor& qkv, const Tensor* dqkv = nullptr,
             bool accumulate = false) {
  Geo g = shape_of(a);
  need(qkv.numel() == g.b * g.s * g.width, "attention: qkv is not {s*b, (hq + hkv) d + hkv dv}");
  g.q = g.k = g.v = view(qkv);
  g.qw = g.kw = g.vw = g.width, g.k0 = g.hq * g.d, g.v0 = (g.hq + g.hkv) * g.d;
  if (dqkv) {
    need(dqkv->numel() == qkv.numel(), "attention backward: dqkv is not qkv's size");
    g.gq = g.gk = g.gv = view(*dqkv);
    g.acc_q = g.acc_k = g.acc_v = accumulate;
  }
  return g;
}

// SDPA's separate q [s*b, hq d], k [s*b, hkv d] and v [s*b, hkv dv].
Geo geometry(const AttentionShape& a, const Tensor& q, const Tensor& k, const Tensor& v) {
  Geo g = shape_of(a);
  g.qw = g.hq * g.d, g.kw = g.hkv * g.d, g.vw = g.hkv * g.dv;
  need(q.numel() == g.b * g.s * g.qw && k.numel() == g.b * g.s * g.kw &&
           v.numel() == g.b * g.s * g.vw && q.type.dtype == k.type.dtype &&
           k.type.dtype == v.type.dtype,
       "sdpa: q, k and v are not {s*b, heads x head_dim} of one dtype");
  g.q = view(q), g.k = view(k), g.v = view(v);
  return g;
}

// CUDA's limit on gridDim.y (and z): launches over batch x heads split into slices of at most
// this many, each given its first index in Geo::y0.
constexpr long long kMaxGridY = 65535;
template <typename Launch>
void launch_heads(const Geo& g, long long heads, Launch launch) {
  for (long long y0 = 0; y0 < heads; y0 += kMaxGridY) {
    Geo slice = g;
    slice.y0 = y0;
    launch(slice, static_cast<unsigned>(std::min(kMaxGridY, heads - y0)));
  }
}

// Element e of t (an operand of gemm_rows).
MatArg mat(const Tensor& t, long long e, long long ld, long long stride = 0, bool trans = false) {
  return {slice(t, e, {}).data, t.type.dtype == Dtype::kBf16, ld, stride, trans};
}

void causal_zero(const Tensor& t, long long s, cudaStream_t stream) {
  if (t.numel() == 0) return;
  np_launch(causal_zero_kernel, dim3(blocks_for(t.numel())), dim3(kThreads), 0, stream, view(t), s,
            static_cast<long long>(t.numel()));
  NP_CUDA_CHECK_LAUNCH();
}

// The operands of one (batch, key-value head) group of eager attention: the group's first query
// head h0 and its q_heads / kv_heads heads as a strided batch.
struct EagerGroup {
  const Geo& g;
  long long bi, h0;
  long long qkv_col(long long col) const { return g.row(bi, 0) * g.width + col; }
  MatArg q(const Tensor& qkv, long long h, bool trans = false) const {
    return mat(qkv, qkv_col(g.q_col(h)), g.b * g.width, g.d, trans);
  }
  MatArg k(const Tensor& qkv, bool trans = false) const {
    return mat(qkv, qkv_col(g.k_col(h0)), g.b * g.width, 0, trans);
  }
  MatArg v(const Tensor& qkv, bool trans = false) const {
    return mat(qkv, qkv_col(g.v_col(h0)), g.b * g.width, 0, trans);
  }
  MatArg scores(const Tensor& t, long long h, bool trans = false) const {
    return mat(t, (bi * g.hq + h) * g.s * g.s, g.s, g.s * g.s, trans);
  }
  MatArg ctx(const Tensor& t, long long h) const {
    return mat(t, g.row(bi, 0) * g.o_width() + g.o_col(h), g.b * g.o_width(), g.dv);
  }
};

template <typename F>
void for_each_group(const Geo& g, F f) {
  for (long long bi = 0; bi < g.b; ++bi)
    for (long long kvh = 0; kvh < g.hkv; ++kvh) f(EagerGroup{g, bi, kvh * g.group()});
}

}  // namespace

void attn_scores_forward(cublasHandle_t h, const AttentionShape& a, const Tensor& qkv,
                         const Tensor& scores, cudaStream_t stream) {
  Geo g = geometry(a, qkv);
  need(scores.numel() == g.b * g.hq * g.s * g.s, "attn_scores: scores are not {b, heads, s, s}");
  for_each_group(g, [&](const EagerGroup& e) {
    gemm_rows(h, g.s, g.s, g.d, e.q(qkv, e.h0), e.k(qkv, true), e.scores(scores, e.h0), 0.0f,
              g.group(), stream);
  });
  causal_zero(scores, g.s, stream);
}

// dQ_h = G_h K (a strided batch over the group); dK += G_h^T Q_h, head by head.
void attn_scores_backward(cublasHandle_t h, const AttentionShape& a, const Tensor& qkv,
                          const Tensor& dscores, const Tensor& dqkv, bool accumulate,
                          cudaStream_t stream) {
  Geo g = geometry(a, qkv);
  need(dscores.numel() == g.b * g.hq * g.s * g.s && dqkv.numel() == qkv.numel(),
       "attn_scores backward: shapes do not agree");
  if (!accumulate) fill(dqkv, 0.0f, stream);
  for_each_group(g, [&](const EagerGroup& e) {
    gemm_rows(h, g.s, g.d, g.s, e.scores(dscores, e.h0), e.k(qkv), e.q(dqkv, e.h0), 1.0f,
              g.group(), stream);
    for (long long hh = e.h0; hh < e.h0 + g.group(); ++hh)
      gemm_rows(h, g.s, g.d, g.s, e.scores(dscores, hh, true), e.q(qkv, hh), e.k(dqkv), 1.0f, 1,
                stream);
  });
}

void attn_context_forward(cublasHandle_t h, const AttentionShape& a, const Tensor& probs,
                          const Tensor& qkv, const Tensor& out, cudaStream_t stream) {
  Geo g = geometry(a, qkv);
  need(probs.numel() == g.b * g.hq * g.s * g.s && out.numel() == g.b * g.s * g.o_width(),
       "attn_context: probs are not {b, heads, s, s} or the output is not [s*b, heads*v_head_dim]");
  for_each_group(g, [&](const EagerGroup& e) {
    gemm_rows(h, g.s, g.dv, g.s, e.scores(probs, e.h0), e.v(qkv), e.ctx(out, e.h0), 0.0f,
              g.group(), stream);
  });
}

// dP_h = dO_h V^T (a strided batch over the group), 0 above the diagonal; dV += P_h^T dO_h.
void attn_context_backward(cublasHandle_t h, const AttentionShape& a, const Tensor& probs,
                           const Tensor& qkv, const Tensor& dout, const Tensor& dprobs,
                           bool accumulate_probs, const Tensor& dqkv, bool accumulate_qkv,
                           cudaStream_t stream) {
  Geo g = geometry(a, qkv);
  need(probs.numel() == g.b * g.hq * g.s * g.s && dprobs.numel() == probs.numel() &&
           dout.numel() == g.b * g.s * g.o_width() && dqkv.numel() == qkv.numel(),
       "attn_context backward: shapes do not agree");
  if (!accumulate_qkv) fill(dqkv, 0.0f, stream);
  for_each_group(g, [&](const EagerGroup& e) {
    gemm_rows(h, g.s, g.s, g.dv, e.ctx(dout, e.h0), e.v(qkv, true), e.scores(dprobs, e.h0),
              accumulate_probs ? 1.0f : 0.0f, g.group(), stream);
    for (long long hh = e.h0; hh < e.h0 + g.group(); ++hh)
      gemm_rows(h, g.s, g.dv, g.s, e.scores(probs, hh, true), e.ctx(dout, hh), e.v(dqkv), 1.0f, 1,
                stream);
  });
  causal_zero(dprobs, g.s, stream);
}

namespace {
void flash_forward(const Geo& g, bool bf16, const Tensor& out, const Tensor& lse,
                   cudaStream_t stream) {
  need(out.numel() == g.b * g.s * g.o_width() && lse.numel() == g.b * g.hq * g.s &&
           lse.type.dtype == Dtype::kFp32,
       "attention: output or logsumexp has the wrong size");
  if (bf16) {  // the tensor cores
    long long dp = (g.d + kMmaTile - 1) / kMmaTile * kMmaTile;
    size_t bytes = ForwardSmem(0, dp).bytes;
    np_allow_shared(flash_forward_mma_kernel, bytes);
    const auto x = static_cast<unsigned>((g.s + kMmaRows - 1) / kMmaRows);
    launch_heads(g, g.b * g.hq, [&](const Geo& gs, unsigned y) {
      np_launch(flash_forward_mma_kernel, dim3(x, y), dim3(kMmaWarps * 32), bytes, stream,
                view(out), lse.as<float>(), gs, dp);
      NP_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  // fp32 tensors (tests; the tensor cores would round them to bf16): one thread per query row.
  const auto x = static_cast<unsigned>((g.s + kRows - 1) / kRows);
  const size_t bytes = (2 * kTile + 2 * kRows) * g.d * sizeof(float);
  np_allow_shared(flash_forward_kernel, bytes);
  launch_heads(g, g.b * g.hq, [&](const Geo& gs, unsigned y) {
    np_launch(flash_forward_kernel, dim3(x, y), dim3(kRows), bytes, stream, view(out),
              lse.as<float>(), gs);
    NP_CUDA_CHECK_LAUNCH();
  });
}
}  // namespace

void flash_attention_forward(const AttentionShape& a, const Tensor& qkv, const Tensor& out,
                             const Tensor& lse, cudaStream_t stream) {
  flash_forward(geometry(a, qkv), qkv.type.dtype == Dtype::kBf16, out, lse, stream);
}

void sdpa_forward(const AttentionShape& a, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& out, const Tensor& lse, cudaStream_t stream) {
  flash_forward(geometry(a, q, k, v), q.type.dtype == Dtype::kBf16, out, lse, stream);
}

void causal_softmax_forward(const Tensor& scores, const Tensor& probs, long long head_dim,
                            cudaStream_t stream) {
  need(scores.type.shape.size() == 4 && scores.type.shape[2] == scores.type.shape[3] &&
           probs.numel() == scores.numel() && head_dim > 0,
       "softmax: needs {b, heads, s, s} scores and head_dim");
  long long s = scores.type.shape[3], rows = scores.numel() / s;
  if (rows == 0) return;
  np_launch(causal_softmax_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), kReduceShared,
            stream, view(scores), view(probs), s,
            static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))));
  NP_CUDA_CHECK_LAUNCH();
}

void causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, const Tensor& dscores,
                             bool accumulate, long long head_dim, cudaStream_t stream) {
  need(probs.type.shape.size() == 4 && dprobs.numel() == probs.numel() &&
           dscores.numel() == probs.numel() && head_dim > 0,
       "softmax backward: shapes do not agree");
  long long s = probs.type.shape[3], rows = probs.numel() / s;
  if (rows == 0) return;
  np_launch(causal_softmax_backward_kernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads),
            kReduceShared, stream, view(probs), view(dprobs), view(dscores), accumulate, s,
            static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim))));
  NP_CUDA_CHECK_LAUNCH();
}

namespace {
void flash_backward(const Geo& g, bool bf16, const Tensor& out, const Tensor& lse,
                    const Tensor& dout, const Tensor& dq, const Tensor& rowsum,
                    cudaStream_t stream) {
  long long ctx = g.b * g.s * g.hq * g.d;  // dq's elements; the output has dv per head
  need(out.numel() == g.b * g.s * g.o_width() && dout.numel() == out.numel() &&
           lse.numel() == g.b * g.hq * g.s && dq.numel() == ctx &&
           dq.type.dtype == Dtype::kFp32 &&
           rowsum.numel() == g.b * g.hq * g.s && rowsum.type.dtype == Dtype::kFp32,
       "attention backward: shapes do not agree (dq and rowsum are fp32 workspaces)");
  np_launch(rowsum_kernel, dim3(blocks_for(g.b * g.hq * g.s)), dim3(kThreads), 0, stream,
            view(dout), view(out), rowsum.as<float>(), g);
  NP_CUDA_CHECK_LAUNCH();
  if (bf16) {  // the tensor cores
    long long dp = (g.d + kMmaTile - 1) / kMmaTile * kMmaTile;
    size_t bytes = BackwardSmem(0, dp).bytes;
    np_allow_shared(flash_dq_mma_kernel, bytes);
    np_allow_shared(flash_dkv_mma_kernel, bytes);
    const auto qx = static_cast<unsigned>((g.s + kMmaRows - 1) / kMmaRows);
    launch_heads(g, g.b * g.hq, [&](const Geo& gs, unsigned y) {
      np_launch(flash_dq_mma_kernel, dim3(qx, y), dim3(kMmaWarps * 32), bytes, stream,
                view(dout), static_cast<const float*>(lse.data),
                static_cast<const float*>(rowsum.data), dq.as<float>(), gs, dp);
      NP_CUDA_CHECK_LAUNCH();
    });
    const auto kx = static_cast<unsigned>((g.s + kMmaKeys - 1) / kMmaKeys);
    launch_heads(g, g.b * g.hkv, [&](const Geo& gs, unsigned y) {
      np_launch(flash_dkv_mma_kernel, dim3(kx, y), dim3(kMmaWarps * 32), bytes, stream,
                view(dout), static_cast<const float*>(lse.data),
                static_cast<const float*>(rowsum.data), gs, dp);
      NP_CUDA_CHECK_LAUNCH();
    });
  } else {  // fp32 tensors: one thread per query (dQ) or key (dK, dV) row
    const auto x = static_cast<unsigned>((g.s + kRows - 1) / kRows);
    const size_t q_bytes = (2 * kTile + 3 * kRows) * g.d * sizeof(float),
                 kv_bytes = ((2 * kTile + 4 * kRows) * g.d + 2 * kTile) * sizeof(float);
    np_allow_shared(flash_dq_kernel, q_bytes);
    np_allow_shared(flash_dkv_kernel, kv_bytes);
    launch_heads(g, g.b * g.hq, [&](const Geo& gs, unsigned y) {
      np_launch(flash_dq_kernel, dim3(x, y), dim3(kRows), q_bytes, stream, view(dout),
                static_cast<const float*>(lse.data), static_cast<const float*>(rowsum.data),
                dq.as<float>(), gs);
      NP_CUDA_CHECK_LAUNCH();
    });
    launch_heads(g, g.b * g.hkv, [&](const Geo& gs, unsigned y) {
      np_launch(flash_dkv_kernel, dim3(x, y), dim3(kRows), kv_bytes, stream, view(dout),
                static_cast<const float*>(lse.data), static_cast<const float*>(rowsum.data), gs);
      NP_CUDA_CHECK_LAUNCH();
    });
  }
  np_launch(dq_to_dx_kernel, dim3(blocks_for(ctx)), dim3(kThreads), 0, stream,
            static_cast<const float*>(dq.data), g);
  NP_CUDA_CHECK_LAUNCH();
}
}  // namespace

void flash_attention_backward(const AttentionShape& a, const Tensor& qkv, const Tensor& out,
                              const Tensor& lse, const Tensor& dout, const Tensor& dqkv,
                              bool accumulate, const Tensor& dq, const Tensor& rowsum,
                              cudaStream_t stream) {
  flash_backward(geometry(a, qkv, &dqkv, accumulate), qkv.type.dtype == Dtype::kBf16, out, lse,
                 dout, dq, rowsum, stream);
}

void sdpa_backward(const AttentionShape& a, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& gq,
                   bool acc_q, const Tensor& gk, bool acc_k, const Tensor& gv, bool acc_v,
                   const Tensor& dq, const Tensor& rowsum, cudaStream_t stream) {
  Geo g = geometry(a, q, k, v);
  need(gq.numel() == q.numel() && gk.numel() == k.numel() && gv.numel() == v.numel(),
       "sdpa backward: a gradient is not its input's size");
  g.gq = view(gq), g.gk = view(gk), g.gv = view(gv);
  g.acc_q = acc_q, g.acc_k = acc_k, g.acc_v = acc_v;
  flash_backward(g, q.type.dtype == Dtype::kBf16, out, lse, dout, dq, rowsum, stream);
}

}  // namespace np::cuda
