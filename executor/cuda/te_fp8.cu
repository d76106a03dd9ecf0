// Transformer Engine's float8 linears under Megatron (te_fp8) on the CUDA backend, with the CPU
// reference's allocations, in the op table's order, and its numbers (executor/cpu/te_fp8.cpp):
// the norms writing e4m3, kTeColumnLinear and kTeRowLinear with their casts, copies and
// transposes, e5m2 gradients. Each amax is reduced on the device into the first four bytes of
// a buffer the op writes afterwards (the cast's destination, or the output before its GEMM), so
// no byte outside the plan is allocated; it is all-reduced over TP there where te_reduces says,
// then read by the host, which keeps the scales (TeFp8State). The weight is cast inside the GEMM
// (TE's cached float8 copy is a framework line, not a planned tensor). The GEMMs are a plain
// kernel (one thread per output element, fp32 sums in k order), not cuBLASLt's float8 path: the
// memory is the point here, as in float8.cu.
#include "executor/cuda/common.cuh"
#include "executor/cuda/ops.hpp"
#include "executor/fp8.hpp"

namespace np::cuda {
namespace {

constexpr Dtype kAct = Dtype::kBf16, kE4 = Dtype::kFp8E4m3, kE5 = Dtype::kFp8E5m2;
constexpr float kEps = static_cast<float>(exec::kNormEps);
enum Role { kInput = 0, kWeight = 1, kGrad = 2 };

const Tensor& need(std::span<const Tensor> ts, size_t i, const char* what) {
  if (i >= ts.size() || !ts[i])
    throw std::invalid_argument(std::string("cuda backend: TE float8: missing ") + what);
  return ts[i];
}
using cuda::need;

unsigned char* codes(const Tensor& t) { return static_cast<unsigned char*>(t.data); }

// The largest |v| of n values (one block), into *out (read after every thread has read its part:
// `out` may lie among the values).
__global__ void amax_kernel(View src, long long n, float* out) {
  float m = 0.0f;
  for (long long i = threadIdx.x; i < n; i += kThreads) m = fmaxf(m, fabsf(ld(src, i)));
  m = block_max(m);
  if (threadIdx.x == 0) *out = m;
}

// codes[i] = fp8(src[i] x scale), saturated; the transposed codes [C, R] too where given.
__global__ void cast_kernel(View src, long long R, long long C, float scale, Dtype to,
                            unsigned char* q, unsigned char* qt) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= R * C) return;
  const unsigned char b = f32_to_fp8(ld(src, i) * scale, to);
  if (q) q[i] = b;
  if (qt) qt[(i % C) * R + i / C] = b;
}

// to = from's [R, C] codes, or their transpose [C, R].
__global__ void copy_codes_kernel(const unsigned char* from, long long R, long long C,
                                  unsigned char* to, bool transpose) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= R * C) return;
  to[transpose ? (i % C) * R + i / C : i] = from[i];
}

// A GEMM operand, element (i, k) at index i si + k sk: float8 codes (p), or bf16 values cast to
// e4m3 with scale q on the way (v: the weight, whose float8 copy TE caches).
struct Operand {
  const unsigned char* p;
  Dtype type;
  View v;
  float q;
  long long si, sk;
};
__device__ float operand_at(const Operand& o, long long i, long long k) {
  const long long at = i * o.si + k * o.sk;
  if (o.p) return fp8_to_f32(o.p[at], o.type);
  return fp8_to_f32(f32_to_fp8(ld(o.v, at) * o.q, kE4), kE4);
}

// out[i, j] (+= where acc) = inv sum_k A(i, k) B(k, j) (+ bias[j]).
__global__ void gemm_kernel(Operand a, Operand b, long long M, long long N, long long K, float inv,
                            View out, bool acc, View bias, bool has_bias) {
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= M * N) return;
  const long long i = e / N, j = e % N;
  float d = 0.0f;
  for (long long k = 0; k < K; ++k) d += operand_at(a, i, k) * operand_at(b, k, j);
  float v = d * inv;
  if (has_bias) v += ld(bias, j);
  st(out, e, acc ? ld(out, e) + v : v);
}

// db[j] += inv sum_i codes[i, j] (the row linear's bias gradient from its float8 gradient).
__global__ void code_column_sums_kernel(const unsigned char* q, Dtype type, long long R,
                                        long long C, float inv, View db) {
  long long j = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (j >= C) return;
  float s = 0.0f;
  for (long long i = 0; i < R; ++i) s += fp8_to_f32(q[i * C + j], type);
  st(db, j, ld(db, j) + s * inv);
}

// A norm writing float8 (delayed scaling): per row (a block), its statistics; then, with
// `rowmax`, the row's largest |y| there, or with `q`, y cast with `scale` (and rstd, mean kept).
__global__ void norm8_kernel(View x, View w, View b, bool layer, long long h, float eps,
                             float* rowmax, unsigned char* q, float scale, float* rstd,
                             float* mean) {
  const long long row = blockIdx.x;
  float mu = 0.0f;
  if (layer) {
    float s = 0.0f;
    for (long long c = threadIdx.x; c < h; c += kThreads) s += ld(x, row * h + c);
    mu = block_sum(s) / static_cast<float>(h);
  }
  float ss = 0.0f;
  for (long long c = threadIdx.x; c < h; c += kThreads) {
    const float d = ld(x, row * h + c) - mu;
    ss += d * d;
  }
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(h) + eps);
  float m = 0.0f;
  for (long long c = threadIdx.x; c < h; c += kThreads) {
    const float y = (ld(x, row * h + c) - mu) * r * ld(w, c) + (layer ? ld(b, c) : 0.0f);
    if (q) q[row * h + c] = f32_to_fp8(y * scale, kE4);
    m = fmaxf(m, fabsf(y));
  }
  m = block_max(m);
  if (threadIdx.x != 0) return;
  if (rowmax) rowmax[row] = m;
  if (q) {
    rstd[row] = r;
    if (mean) mean[row] = mu;
  }
}

void launch_check() { NP_CUDA_CHECK_LAUNCH(); }

// The amax of n values of src into the four bytes at `slot`, all-reduced over TP where
// te_reduces says, read back; then the scale of role r.
float scale_of(const Fwd& e, View src, long long n, void* slot, Role r, bool shared) {
  float* at = static_cast<float*>(slot);
  if (n > 0) {
    np_launch(amax_kernel, dim3(1), dim3(kThreads), kReduceShared, e.stream, src, n, at);
    launch_check();
  } else {
    NP_CUDA_CHECK(cudaMemsetAsync(at, 0, sizeof(float), e.stream));
  }
  if (exec::te_reduces(e.c, shared) && e.c.comm && e.c.comm->tp_size() > 1)
    e.c.comm->all_reduce_max(Tensor{at, {{1}, Dtype::kFp32}});
  float amax = 0.0f;
  NP_CUDA_CHECK(cudaMemcpyAsync(&amax, at, sizeof(float), cudaMemcpyDeviceToHost, e.stream));
  NP_CUDA_CHECK(cudaStreamSynchronize(e.stream));
  return exec::te_scale(e.c, r, amax, fp8_format(r == kGrad ? kE5 : kE4).max);
}

void set_inv(const Fwd& e, const Tensor& t, float scale) {
  if (e.c.te_fp8) e.c.te_fp8->inv_scale[t.data] = 1.0f / scale;
}
float inv_of(const Fwd& e, const Tensor& t) {
  if (!e.c.te_fp8) return 1.0f;
  auto it = e.c.te_fp8->inv_scale.find(t.data);
  if (it == e.c.te_fp8->inv_scale.end())
    throw std::logic_error("cuda backend: TE float8: a float8 tensor without its scale");
  return it->second;
}

void cast(const Fwd& e, View src, long long R, long long C, float scale, Dtype to,
          const Tensor& q, const Tensor& qt) {
  if (R * C == 0) return;
  np_launch(cast_kernel, dim3(blocks_for(R * C)), dim3(kThreads), 0, e.stream, src, R, C, scale,
            to, q ? codes(q) : nullptr, qt ? codes(qt) : nullptr);
  launch_check();
}
void copy_codes(const Fwd& e, const Tensor& from, long long R, long long C, const Tensor& to,
                bool transpose) {
  if (R * C == 0) return;
  np_launch(copy_codes_kernel, dim3(blocks_for(R * C)), dim3(kThreads), 0, e.stream,
            static_cast<const unsigned char*>(from.data), R, C, codes(to), transpose);
  launch_check();
}
void gemm(const Fwd& e, const Operand& a, const Operand& b, long long M, long long N, long long K,
          float inv, const Tensor& out, bool acc, const Tensor* bias = nullptr) {
  if (M * N == 0) return;
  np_launch(gemm_kernel, dim3(blocks_for(M * N)), dim3(kThreads), 0, e.stream, a, b, M, N, K, inv,
            view(out), acc, bias ? view(*bias) : View{nullptr, false}, bias != nullptr);
  launch_check();
}
Operand codes_of(const Tensor& t, long long si, long long sk) {
  return {static_cast<const unsigned char*>(t.data), t.type.dtype, View{nullptr, false}, 0.0f, si,
          sk};
}
Operand weight_of(const Tensor& w, float scale, long long si, long long sk) {
  return {nullptr, kE4, view(w), scale, si, sk};
}

// dW (+)= inv G8^T X8 through `dense` where given (dense_wgrad), then the bias gradient.
void weight_grads(const Bwd& e, const Operand& gt, const Operand& x, long long N, long long K,
                  long long R, float inv, const Tensor& dense) {
  const Tensor& dw = need(e.a.weight_grads, 0, "weight gradient");
  if (dense) {
    gemm(e, gt, x, N, K, R, inv, dense, false);
    accumulate(dw, dense, e.stream);
  } else {
    gemm(e, gt, x, N, K, R, inv, dw, true);
  }
}

}  // namespace

Tensor te_norm_fwd(const Fwd& e, const Tensor& x, const Tensor& w, const Tensor* b,
                   std::vector<Tensor>& stats) {
  const OpAttrs& a = e.attrs();
  const long long T = x.type.shape.at(0), h = w.numel();
  const bool layer = b != nullptr, shared = !a.fp8_transpose;
  TensorType row{{T}, Dtype::kFp32};
  if (a.fp8 == Fp8Recipe::kTensorwise) {  // the bf16 norm output with its amax, then the cast
    Tensor hp = e.ws({{T, h}, x.type.dtype});
    Tensor qt = a.fp8_transpose ? e.ws({{h, T}, kE4}) : Tensor{};
    Tensor q = e.out({{T, h}, kE4});
    if (layer) {
      stats = {e.out(row), e.out(row)};
      layernorm_forward(x, w, *b, hp, &stats[0], &stats[1], kEps, e.stream);
    } else {
      stats = {e.out(row)};
      rmsnorm_forward(x, w, hp, &stats[0], kEps, e.stream);
    }
    const float s = scale_of(e, view(hp), T * h, q.data, kInput, shared);
    cast(e, view(hp), T, h, s, kE4, q, qt);
    set_inv(e, q, s);
    return q;
  }
  // Delayed: the rows' maxima in the output's bytes, their amax, then the cast itself.
  Tensor q = e.out({{T, h}, kE4});
  stats = layer ? std::vector<Tensor>{e.out(row), e.out(row)} : std::vector<Tensor>{e.out(row)};
  float* rstd = stats.back().as<float>();
  float* mean = layer ? stats[0].as<float>() : nullptr;
  const View bias = layer ? view(*b) : View{nullptr, false};
  float scale = 1.0f;
  if (T > 0) {
    need(h >= 4, "TE float8 norm: rows narrower than a float");
    np_launch(norm8_kernel, dim3(static_cast<unsigned>(T)), dim3(kThreads), kReduceShared, e.stream,
              view(x), view(w), bias, layer, h, kEps, q.as<float>(),
              static_cast<unsigned char*>(nullptr), 1.0f, rstd, mean);
    launch_check();
    scale = scale_of(e, View{q.data, false}, T, q.data, kInput, shared);
    np_launch(norm8_kernel, dim3(static_cast<unsigned>(T)), dim3(kThreads), kReduceShared, e.stream,
              view(x), view(w), bias, layer, h, kEps, static_cast<float*>(nullptr), codes(q), scale,
              rstd, mean);
    launch_check();
  }
  set_inv(e, q, scale);
  return q;
}

void te_gathered(const Fwd& e, const Tensor& from, const Tensor& to) {
  if (e.c.te_fp8) set_inv(e, to, 1.0f / inv_of(e, from));
}

Outs te_column_linear_fwd(const Fwd& e, Ins in, Ins w) {
  const OpAttrs& a = e.attrs();
  const Tensor &x = need(in, 0, "input"), &W = need(w, 0, "weight");
  const long long R = x.type.shape.at(0), K = W.type.shape.at(1), N = W.type.shape.at(0);
  if (a.fp8_transpose) copy_codes(e, x, R, K, e.ws({{R, K}, kE4}), false);
  Tensor y = e.out({{R, N}, kAct});
  const float sw = scale_of(e, view(W), N * K, y.data, kWeight, false);
  gemm(e, codes_of(x, K, 1), weight_of(W, sw, 1, K), R, N, K, inv_of(e, x) / sw, y, false,
       w.size() > 1 ? &w[1] : nullptr);
  return {y};
}

void te_column_linear_bwd(const Bwd& e) {
  const OpAttrs& a = e.attrs();
  const Tensor &x = need(e.a.inputs, 0, "input"), &W = need(e.a.weights, 0, "weight");
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  const long long R = x.type.shape.at(0), K = W.type.shape.at(1), N = W.type.shape.at(0);
  if (e.a.grad_inputs[0]) unsupported(e.c, "accumulating a TE linear's input gradient");
  Tensor g8 = e.ws({{R, N}, kE5}), g8t = e.ws({{N, R}, kE5});
  const float sg = scale_of(e, view(g), R * N, g8.data, kGrad, false);
  cast(e, view(g), R, N, sg, kE5, g8, g8t);
  if (!a.fp8_transpose) copy_codes(e, x, R, K, e.ws({{K, R}, kE4}), true);
  Tensor dense = a.dense_wgrad ? e.ws({W.type.shape, kAct}) : Tensor{};
  bool acc = false;
  Tensor& dx = e.grad(0, {x.type.shape, kAct}, acc);
  const float sw = scale_of(e, view(W), N * K, dx.data, kWeight, false);
  gemm(e, codes_of(g8, N, 1), weight_of(W, sw, K, 1), R, K, N, 1.0f / (sg * sw), dx, false);
  if (e.c.op->bwd_collective == "all_reduce") e.c.comm->all_reduce(dx);
  weight_grads(e, codes_of(g8, 1, N), codes_of(x, K, 1), N, K, R, inv_of(e, x) / sg, dense);
  if (e.a.weight_grads.size() > 1) column_sums_add(g, R, e.a.weight_grads[1], e.stream);
}

Outs te_row_linear_fwd(const Fwd& e, Ins in, Ins w) {
  const OpAttrs& a = e.attrs();
  const Tensor &x = need(in, 0, "input"), &W = need(w, 0, "weight");
  const long long R = x.type.shape.at(0), K = W.type.shape.at(1), N = W.type.shape.at(0),
                  g = a.group;
  Tensor rowwise = e.ws({{R, K}, kE4});
  Tensor partial = g > 1 ? e.ws({{R, N}, kAct}) : Tensor{};
  Tensor y = e.out({{R / g, N}, kAct}), kept = e.out({{K, R}, kE4});
  const float sx = scale_of(e, view(x), R * K, rowwise.data, kInput, false);
  cast(e, view(x), R, K, sx, kE4, rowwise, kept);
  set_inv(e, kept, sx);
  const Tensor& product = g > 1 ? partial : y;
  const float sw = scale_of(e, view(W), N * K, product.data, kWeight, false);
  const bool bias = w.size() > 1 && e.c.tp_rank == 0;  // once over the partial sums
  gemm(e, codes_of(rowwise, K, 1), weight_of(W, sw, 1, K), R, N, K, 1.0f / (sx * sw), product,
       false, bias ? &w[1] : nullptr);
  if (g > 1) e.c.comm->reduce_scatter(partial, y);
  else if (e.c.op->fwd_collective == "all_reduce") e.c.comm->all_reduce(y);
  return {y, kept};
}

void te_row_linear_bwd(const Bwd& e) {
  const OpAttrs& a = e.attrs();
  const Tensor &kept = need(e.a.outputs, 1, "float8 input"), &W = need(e.a.weights, 0, "weight");
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  const long long grp = a.group, R = g.type.shape.at(0) * grp, N = W.type.shape.at(0),
                  K = W.type.shape.at(1);
  if (e.a.grad_inputs[0]) unsupported(e.c, "accumulating a TE linear's input gradient");
  Tensor g8;
  float sg = 1.0f;
  if (grp > 1) {  // the shard cast (its amax reduced over TP), all-gathered as float8 bytes
    Tensor shard = e.ws({{R / grp, N}, kE5});
    g8 = e.ws({{R, N}, kE5});
    Tensor t = e.ws({{N, R}, kE5});
    sg = scale_of(e, view(g), R / grp * N, shard.data, kGrad, true);
    cast(e, view(g), R / grp, N, sg, kE5, shard, Tensor{});
    e.c.comm->all_gather(shard, g8);
    copy_codes(e, g8, R, N, t, true);
  } else {
    g8 = e.ws({{R, N}, kE5});
    Tensor t = e.ws({{N, R}, kE5});
    sg = scale_of(e, view(g), R * N, g8.data, kGrad, false);
    cast(e, view(g), R, N, sg, kE5, g8, t);
  }
  Tensor dense = a.dense_wgrad ? e.ws({W.type.shape, kAct}) : Tensor{};
  bool acc = false;
  Tensor& dx = e.grad(0, {{R, K}, kAct}, acc);
  const float sw = scale_of(e, view(W), N * K, dx.data, kWeight, false);
  gemm(e, codes_of(g8, N, 1), weight_of(W, sw, K, 1), R, K, N, 1.0f / (sg * sw), dx, false);
  // X8 (r, k) from the kept transpose [K, R].
  weight_grads(e, codes_of(g8, 1, N), codes_of(kept, 1, R), N, K, R, inv_of(e, kept) / sg, dense);
  if (e.a.weight_grads.size() > 1 && N > 0) {
    np_launch(code_column_sums_kernel, dim3(blocks_for(N)), dim3(kThreads), 0, e.stream, codes(g8),
              kE5, R, N, 1.0f / sg, view(e.a.weight_grads[1]));
    launch_check();
  }
}

}  // namespace np::cuda
