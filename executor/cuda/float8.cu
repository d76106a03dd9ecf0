// torchao's Float8Linear on the CUDA backend, step for step as the CPU reference's
// (executor/cpu/float8.cpp) and the op table's steps (planner/graph/float8.cpp): each cast with
// its temporaries (|x| and its max, the fp32 scale, the fp32 copy and its scaled product, the
// saturating clamp and the float8 result, executor/fp8.hpp's conversion), then the GEMMs on the
// float8 values with the reciprocal scales (rowwise backward: the raw product rounded to bf16,
// times the fp32 outer product of the reciprocals). The GEMM is a plain kernel (one thread per
// output element, fp32 sums in k order), not cuBLASLt's float8 path: the memory is the point here.
#include "executor/cuda/common.cuh"
#include "executor/cuda/ops.hpp"
#include "executor/fp8.hpp"

namespace np::cuda {
namespace {

constexpr Dtype kAct = Dtype::kBf16;

const Tensor& need(std::span<const Tensor> ts, size_t i, const char* what) {
  if (i >= ts.size() || !ts[i])
    throw std::invalid_argument(std::string("cuda backend: float8 linear: missing ") + what);
  return ts[i];
}
using cuda::need;

// The scale's axis over a [rows, cols] tensor: one, per row ([rows, 1]), per column ([1, cols]).
using Axis = Fp8ScaleAxis;

std::vector<int64_t> scale_shape(Axis a, int64_t rows, int64_t cols) {
  return a == Axis::kTensor ? std::vector<int64_t>{}
         : a == Axis::kRows ? std::vector<int64_t>{rows, 1}
                            : std::vector<int64_t>{1, cols};
}

__device__ long long scale_at(Axis a, long long r, long long c) {
  return a == Axis::kTensor ? 0 : a == Axis::kRows ? r : c;
}

__global__ void abs_kernel(View x, View a, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) st(a, i, fabsf(ld(x, i)));
}

// Block e: the max of |x| over scale entry e's elements (all, row e, or column e).
__global__ void amax_kernel(View a, View amax, long long rows, long long cols, Axis axis) {
  long long e = blockIdx.x;
  long long n = axis == Axis::kTensor ? rows * cols : axis == Axis::kRows ? cols : rows;
  float m = 0.0f;
  for (long long i = threadIdx.x; i < n; i += kThreads) {
    long long at = axis == Axis::kTensor ? i : axis == Axis::kRows ? e * cols + i : i * cols + e;
    m = fmaxf(m, ld(a, at));
  }
  m = block_max(m);
  if (threadIdx.x == 0) st(amax, e, m);
}

// amax_to_scale: max / clamp(amax, 1e-12) in fp64, to fp32; rowwise rounds it down to 2^k.
__global__ void scale_kernel(View amax, float* scale, long long n, float fmax, bool pow2) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  double a = static_cast<double>(ld(amax, i));
  float s = static_cast<float>(static_cast<double>(fmax) / (a > 1e-12 ? a : 1e-12));
  scale[i] = pow2 ? pow2_floor(s) : s;
}

__global__ void scaled_kernel(View x, float* f32, float* scaled, const float* scale,
                              long long rows, long long cols, Axis axis) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= rows * cols) return;
  float v = ld(x, i);
  f32[i] = v;
  scaled[i] = v * scale[scale_at(axis, i / cols, i % cols)];
}

__global__ void quantize_kernel(const float* scaled, float* clamped, unsigned char* q, long long n,
                                float fmax, Dtype to) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float v = fminf(fmaxf(scaled[i], -fmax), fmax);
  clamped[i] = v;
  q[i] = f32_to_fp8(v, to);
}

// rowwise_with_gw_hp: the weight's one scale repeated along K (preprocess_addmm's b_scale.repeat).
__global__ void repeat_kernel(const float* s, float* out, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) out[i] = s[0];
}

__global__ void reciprocal_kernel(const float* s, float* inv, long long n) {
  long long i = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) inv[i] = 1.0f / s[i];
}

__device__ float bf16_round(float x) { return __bfloat162float(__float2bfloat16(x)); }

// A float8 operand: element (i, k) at p[i * si + k * sk].
struct Operand {
  const unsigned char* p;
  Dtype type;
  long long si, sk;
};

// post[i, j] = ainv x binv (the rowwise GEMMs' fp32 outer product of the reciprocal scales).
__global__ void outer_kernel(const float* ainv, bool a_vec, const float* binv, bool b_vec,
                             float* post, long long M, long long N) {
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= M * N) return;
  post[e] = ainv[a_vec ? e / N : 0] * binv[b_vec ? e % N : 0];
}

// out[i, j] (=, or += when acc) = sum_k A(i, k) B(k, j), scaled, as bf16 values: tensorwise
// times ainv x binv (ainv per row i when a_vec, else one; binv per column j when b_vec), rounded
// once; rowwise (post given) the raw product rounded, then times post, rounded again.
__global__ void fp8_gemm_kernel(Operand a, Operand b, const float* ainv, bool a_vec,
                                const float* binv, bool b_vec, long long M, long long N, long long K,
                                View out, bool acc, const float* post) {
  long long e = static_cast<long long>(blockIdx.x) * kThreads + threadIdx.x;
  if (e >= M * N) return;
  long long i = e / N, j = e % N;
  float d = 0.0f;
  for (long long k = 0; k < K; ++k)
    d += fp8_to_f32(a.p[i * a.si + k * a.sk], a.type) * fp8_to_f32(b.p[k * b.si + j * b.sk], b.type);
  float v = post ? bf16_round(bf16_round(d) * post[e])
                 : bf16_round(d * ainv[a_vec ? i : 0] * binv[b_vec ? j : 0]);
  st(out, e, acc ? ld(out, e) + v : v);
}

// The kernel's next step (an op test's context has none: its steps run as one).
void next(const Fwd& e) {
  if (e.c.step) e.c.step();
}

struct Fp8 {
  Tensor q, scale;
};

// Where a cast's scale and float8 tensor go (workspaces, or the op's outputs: torchao's float8
// TP), and whether x is a TP shard whose max is all-reduced over TP (the CPU reference's CastTo).
struct CastTo {
  bool reduce = false, scale_out = false, q_out = false;
};

int64_t tp_size(const Fwd& e) { return e.c.comm ? e.c.comm->tp_size() : 1; }

// A plain float8 linear's cast of `operand` with scales along `axis`: a max over a dimension split
// over TP is all-reduced (fp8_max_over_tp; the CPU reference's `across`).
CastTo across(const Fwd& e, Fp8Operand operand, Axis axis) {
  return {.reduce = fp8_max_over_tp(e.c.op->kind, tp_size(e), operand, axis)};
}

// A scale all-reduced over TP, element by element: amax_to_scale is monotonic, so the scale of
// the largest max is the least scale; negated, all-reduced with max in place on the device, negated
// back (executor/cpu/float8.cpp, reduce_scale).
void reduce_scale(const Fwd& e, const Tensor& s) {
  if (tp_size(e) == 1) return;
  scale(s, -1.0f, e.stream);
  e.c.comm->all_reduce_max(s);
  scale(s, -1.0f, e.stream);
}

// One hp_tensor_to_float8_dynamic of x ([rows, cols] bf16) in four steps; the first continues
// the kernel's current step.
Fp8 cast(const Fwd& e, const Tensor& x, int64_t rows, int64_t cols, Dtype to, Axis axis,
         bool pow2, CastTo into = {}) {
  const float fmax = fp8_format(to).max;
  const std::vector<int64_t> ss = scale_shape(axis, rows, cols);
  const long long n = rows * cols;
  // Tensorwise takes torch.max (aten.max), whose result per-op checkpointing keeps.
  Tensor abs = e.ws({{rows, cols}, kAct}),
         amax = axis == Axis::kTensor ? e.kept({ss, kAct}) : e.ws({ss, kAct});
  if (n > 0) {
    np_launch(abs_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, e.stream, view(x), view(abs), n);
    NP_CUDA_CHECK_LAUNCH();
    np_launch(amax_kernel, dim3(static_cast<unsigned>(amax.numel())), dim3(kThreads),
              kReduceShared, e.stream, view(abs), view(amax), static_cast<long long>(rows),
              static_cast<long long>(cols), axis);
    NP_CUDA_CHECK_LAUNCH();
  }
  next(e);
  Tensor scale = into.scale_out ? e.out({ss, Dtype::kFp32}) : e.ws({ss, Dtype::kFp32});
  np_launch(scale_kernel, dim3(blocks_for(scale.numel())), dim3(kThreads), 0, e.stream,
            view(amax), scale.as<float>(), static_cast<long long>(scale.numel()), fmax, pow2);
  NP_CUDA_CHECK_LAUNCH();
  if (into.reduce) reduce_scale(e, scale);
  next(e);
  Tensor f32 = e.ws({{rows, cols}, Dtype::kFp32}), scaled = e.ws({{rows, cols}, Dtype::kFp32});
  if (n > 0) {
    np_launch(scaled_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, e.stream, view(x),
              f32.as<float>(), scaled.as<float>(), static_cast<const float*>(scale.data),
              static_cast<long long>(rows), static_cast<long long>(cols), axis);
    NP_CUDA_CHECK_LAUNCH();
  }
  next(e);
  Tensor clamped = e.ws({{rows, cols}, Dtype::kFp32}),
         q = into.q_out ? e.out({{rows, cols}, to}) : e.ws({{rows, cols}, to});
  if (n > 0) {
    np_launch(quantize_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, e.stream,
              static_cast<const float*>(scaled.data), clamped.as<float>(),
              static_cast<unsigned char*>(q.data), n, fmax, to);
    NP_CUDA_CHECK_LAUNCH();
  }
  return {q, scale};
}

// _scaled_mm's reciprocal scales (fp32, `a` and `b`'s shapes), filled from the scales.
std::pair<Tensor, Tensor> reciprocals(const Fwd& e, const Fp8& a, std::vector<int64_t> a_shape,
                                      const Fp8& b, std::vector<int64_t> b_shape) {
  Tensor ai = e.ws({std::move(a_shape), Dtype::kFp32}), bi = e.ws({std::move(b_shape), Dtype::kFp32});
  for (auto [s, inv] : {std::pair{a.scale, ai}, {b.scale, bi}}) {
    np_launch(reciprocal_kernel, dim3(blocks_for(s.numel())), dim3(kThreads), 0, e.stream,
              static_cast<const float*>(s.data), inv.as<float>(), static_cast<long long>(s.numel()));
    NP_CUDA_CHECK_LAUNCH();
  }
  return {ai, bi};
}

// Tensorwise (post null): the GEMM scaled by the reciprocals ainv and binv, which must be live.
// Rowwise: by `post`, filled from them by outer() in the step that made them (they die there).
void gemm(const Fwd& e, Operand a, Operand b, const Tensor* ainv, const Tensor* binv, int64_t M,
          int64_t N, int64_t K, const Tensor& out, bool acc, const Tensor* post) {
  if (M * N == 0) return;
  np_launch(fp8_gemm_kernel, dim3(blocks_for(M * N)), dim3(kThreads), 0, e.stream, a, b,
            ainv ? static_cast<const float*>(ainv->data) : nullptr, ainv && ainv->numel() > 1,
            binv ? static_cast<const float*>(binv->data) : nullptr, binv && binv->numel() > 1,
            static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
            view(out), acc, post ? static_cast<const float*>(post->data) : nullptr);
  NP_CUDA_CHECK_LAUNCH();
}
void outer(const Fwd& e, const Tensor& ainv, const Tensor& binv, const Tensor& post, int64_t M,
           int64_t N) {
  if (M * N == 0) return;
  np_launch(outer_kernel, dim3(blocks_for(M * N)), dim3(kThreads), 0, e.stream,
            static_cast<const float*>(ainv.data), ainv.numel() > 1,
            static_cast<const float*>(binv.data), binv.numel() > 1, post.as<float>(),
            static_cast<long long>(M), static_cast<long long>(N));
  NP_CUDA_CHECK_LAUNCH();
}

const unsigned char* bytes(const Tensor& t) { return static_cast<const unsigned char*>(t.data); }

}  // namespace

// A weight FSDP's float8 all-gather made (OpAttrs::fp8_gathered): its e4m3 values, with its
// 0-dim fp32 scale bound after the weights; neither pass casts it.
Fp8 gathered_weight(std::span<const Tensor> w) {
  const Tensor& q = need(w, 0, "weight");
  need(q.type.dtype == Dtype::kFp8E4m3 && w.size() >= 2 && w.back().numel() == 1,
       "float8 linear: the gathered weight is not e4m3 with its scale");
  return {q, w.back()};
}

Outs float8_linear_fwd(const Fwd& e, Ins in, Ins w) {
  // rowwise_with_gw_hp's forward is rowwise's.
  const bool row = e.attrs().fp8 != Fp8Recipe::kTensorwise, gathered = e.attrs().fp8_gathered;
  const Axis per_row = row ? Axis::kRows : Axis::kTensor;
  const Tensor &x = need(in, 0, "input"), &wt = need(w, 0, "weight");
  const int64_t R = x.type.shape.at(0), K = x.type.shape.at(1), N = wt.type.shape.at(0);
  need(wt.type.shape.at(1) == K, "float8 linear: weight and input widths differ");
  Fp8 x8 = cast(e, x, R, K, Dtype::kFp8E4m3, per_row, row, across(e, Fp8Operand::kInput, per_row));
  if (e.c.cached_output) {  // per-op checkpointing's recompute of a kept linear: the casts
    if (!gathered) {
      next(e);
      cast(e, wt, N, K, Dtype::kFp8E4m3, per_row, row, across(e, Fp8Operand::kWeight, per_row));
    }
    return {};
  }
  next(e);
  Fp8 w8 = gathered ? gathered_weight(w) : Fp8{};
  if (!gathered) {
    w8 = cast(e, wt, N, K, Dtype::kFp8E4m3, per_row, row, across(e, Fp8Operand::kWeight, per_row));
    next(e);
  }
  auto [ai, bi] = reciprocals(e, x8, row ? std::vector<int64_t>{R, 1} : std::vector<int64_t>{}, w8,
                              row ? std::vector<int64_t>{1, N} : std::vector<int64_t>{});
  Tensor y = e.out({{R, N}, kAct});
  // y[r, n] = sum_k x8[r, k] w8[n, k]
  gemm(e, {bytes(x8.q), Dtype::kFp8E4m3, K, 1}, {bytes(w8.q), Dtype::kFp8E4m3, 1, K}, &ai, &bi, R,
       N, K, y, false, nullptr);
  return {y};
}

void float8_linear_bwd(const Bwd& e) {
  const exec::BackwardArgs& a = e.a;
  const bool row = e.attrs().fp8 != Fp8Recipe::kTensorwise, gathered = e.attrs().fp8_gathered;
  const bool hp = e.attrs().fp8 == Fp8Recipe::kRowwiseGwHp;
  const Dtype grad = row ? Dtype::kFp8E4m3 : Dtype::kFp8E5m2;
  const Tensor &x = need(a.inputs, 0, "input"), &g = need(a.grad_outputs, 0, "gradient"),
               &wt = need(a.weights, 0, "weight");
  const int64_t R = x.type.shape.at(0), K = x.type.shape.at(1), N = wt.type.shape.at(0);
  auto shape = [row](int64_t p, int64_t q) {
    return row ? std::vector<int64_t>{p, q} : std::vector<int64_t>{};
  };
  // grad_input = g8 @ W8: g per row, W^T per input feature (W's columns); rowwise_with_gw_hp
  // casts W with one scale (power of 2), repeated along K for _scaled_mm.
  const Axis g_axis = row ? Axis::kRows : Axis::kTensor,
             w_axis = row && !hp ? Axis::kCols : Axis::kTensor;
  Fp8 g8 = cast(e, g, R, N, grad, g_axis, row, across(e, Fp8Operand::kGradOutput, g_axis));
  next(e);
  Fp8 w8 = gathered ? gathered_weight(a.weights) : Fp8{};
  if (!gathered) {
    w8 = cast(e, wt, N, K, Dtype::kFp8E4m3, w_axis, row, across(e, Fp8Operand::kWeight, w_axis));
    next(e);
  }
  Tensor wcopy = e.ws({{N, K}, Dtype::kFp8E4m3});  // W8^T made column-major for _scaled_mm
  if (hp) {
    Tensor rep = e.ws({{K}, Dtype::kFp32});
    if (K > 0) {
      np_launch(repeat_kernel, dim3(blocks_for(K)), dim3(kThreads), 0, e.stream,
                static_cast<const float*>(w8.scale.data), rep.as<float>(),
                static_cast<long long>(K));
      NP_CUDA_CHECK_LAUNCH();
    }
    w8.scale = rep;
  }
  auto [gi, wi] = reciprocals(e, g8, shape(R, 1), w8, shape(1, K));
  Tensor post = row ? e.ws({{R, K}, Dtype::kFp32}) : Tensor{};
  if (row) {
    outer(e, gi, wi, post, R, K);
    next(e);
    e.ws({{}, Dtype::kFp32}), e.ws({{}, Dtype::kFp32});  // the 0-dim ones
  }
  bool acc = false;
  Tensor& dx = e.grad(0, x.type, acc);
  (void)wcopy;
  // dx[r, k] = sum_n g8[r, n] w8[n, k]
  gemm(e, {bytes(g8.q), grad, N, 1}, {bytes(w8.q), Dtype::kFp8E4m3, K, 1}, row ? nullptr : &gi,
       row ? nullptr : &wi, R, K, N, dx, acc, row ? &post : nullptr);
  next(e);
  if (hp) {  // grad_weight = g^T @ x in bf16, through cuBLAS as a bf16 linear's
    linear_backward(e.blas, x, wt, g, nullptr, false, need(a.weight_grads, 0, "weight gradient"),
                    nullptr, e.stream, nullptr);
    return;
  }
  // grad_weight = g8^T @ x8, each scaled per column (per output and input feature) under rowwise.
  const Axis per_col = row ? Axis::kCols : Axis::kTensor;
  Fp8 gc = cast(e, g, R, N, grad, per_col, row, across(e, Fp8Operand::kGradOutput, per_col));
  next(e);
  Fp8 xc = cast(e, x, R, K, Dtype::kFp8E4m3, per_col, row, across(e, Fp8Operand::kInput, per_col));
  next(e);
  e.ws({{N, R}, grad});             // g8^T made row-major
  e.ws({{R, K}, Dtype::kFp8E4m3});  // x8 made column-major
  auto [ci, xi] = reciprocals(e, gc, shape(N, 1), xc, shape(1, K));
  Tensor wpost = row ? e.ws({{N, K}, Dtype::kFp32}) : Tensor{};
  if (row) {
    outer(e, ci, xi, wpost, N, K);
    next(e);
    e.ws({{}, Dtype::kFp32}), e.ws({{}, Dtype::kFp32});
  }
  // dW[n, k] (+=) = sum_r gc[r, n] xc[r, k]
  gemm(e, {bytes(gc.q), grad, 1, N}, {bytes(xc.q), Dtype::kFp8E4m3, K, 1}, row ? nullptr : &ci,
       row ? nullptr : &xi, N, K, R, need(a.weight_grads, 0, "weight gradient"), true,
       row ? &wpost : nullptr);
}

// --- torchao's float8 tensor parallelism (tensorwise; the CPU reference's steps) ---------------

namespace {

// The float8 TP linears' weight [N, K]: cast (max all-reduced over TP), ending the step; or, under
// FSDP's float8 all-gather, as it arrived (the CPU reference's tp_weight).
Fp8 tp_weight(const Fwd& e, std::span<const Tensor> w, int64_t N, int64_t K) {
  if (e.attrs().fp8_gathered) return gathered_weight(w);
  Fp8 w8 = cast(e, need(w, 0, "weight"), N, K, Dtype::kFp8E4m3, Axis::kTensor, false,
                {.reduce = true});
  next(e);
  return w8;
}

// The linear's backward on a float8 output gradient g8 [R, N] and float8 input x8 [R, K]: W^T
// cast again (max all-reduced) unless gathered, the input gradient's GEMM (W8 copied
// transposed) into a bf16 gradient, the weight gradient's (g8^T made row-major, x8 column-major).
void fp8_tp_linear_bwd(const Bwd& e, const Fp8& g8, const Fp8& x8, int64_t R, int64_t K) {
  const exec::BackwardArgs& a = e.a;
  const Tensor& wt = need(a.weights, 0, "weight");
  const int64_t N = wt.type.shape.at(0);
  Fp8 w8 = tp_weight(e, a.weights, N, K);
  e.ws({{N, K}, Dtype::kFp8E4m3});
  auto [gi, wi] = reciprocals(e, g8, {}, w8, {});
  bool acc = false;
  Tensor& dx = e.grad(0, {{R, K}, kAct}, acc);
  gemm(e, {bytes(g8.q), Dtype::kFp8E5m2, N, 1}, {bytes(w8.q), Dtype::kFp8E4m3, K, 1}, &gi, &wi, R,
       K, N, dx, acc, nullptr);
  next(e);
  e.ws({{N, R}, Dtype::kFp8E5m2});
  e.ws({{R, K}, Dtype::kFp8E4m3});
  auto [ci, xi] = reciprocals(e, g8, {}, x8, {});
  gemm(e, {bytes(g8.q), Dtype::kFp8E5m2, 1, N}, {bytes(x8.q), Dtype::kFp8E4m3, K, 1}, &ci, &xi,
       N, K, R, need(a.weight_grads, 0, "weight gradient"), true, nullptr);
}

// The forward's _scaled_mm of tensorwise x8 [R, K] and w8 [N, K]: the two 0-dim reciprocal
// scales, then y = x8 w8^T into a new bf16 [R, N] output or workspace.
enum Into { kOutput, kWorkspace };
Tensor forward_gemm(const Fwd& e, const Fp8& x8, const Fp8& w8, int64_t R, int64_t K, int64_t N,
                    Into into) {
  auto [ai, bi] = reciprocals(e, x8, {}, w8, {});
  Tensor y = into == kOutput ? e.out({{R, N}, kAct}) : e.ws({{R, N}, kAct});
  gemm(e, {bytes(x8.q), Dtype::kFp8E4m3, K, 1}, {bytes(w8.q), Dtype::kFp8E4m3, 1, K}, &ai, &bi, R,
       N, K, y, false, nullptr);
  return y;
}

}  // namespace

// PrepareFloat8ModuleInput: the shard cast (scale: output 1, max all-reduced), then all-gathered
// over TP into output 0.
Outs fp8_all_gather_fwd(const Fwd& e, Ins in, Ins) {
  const Tensor& x = need(in, 0, "input");
  const int64_t R = x.type.shape.at(0), K = x.type.shape.at(1);
  Fp8 x8 = cast(e, x, R, K, Dtype::kFp8E4m3, Axis::kTensor, false,
                {.reduce = true, .scale_out = true});
  next(e);
  Tensor out = e.out({{R * tp_size(e), K}, Dtype::kFp8E4m3});
  e.c.comm->all_gather(x8.q, out);
  return {out, x8.scale};
}

// Float8ColwiseParallel's linear on x8 (input 0) and its scale (input 1).
Outs fp8_column_linear_fwd(const Fwd& e, Ins in, Ins w) {
  Fp8 x8{need(in, 0, "float8 input"), need(in, 1, "float8 input scale")};
  const Tensor& wt = need(w, 0, "weight");
  const int64_t R = x8.q.type.shape.at(0), K = x8.q.type.shape.at(1), N = wt.type.shape.at(0);
  need(wt.type.shape.at(1) == K, "float8 linear: weight and input widths differ");
  Fp8 w8 = tp_weight(e, w, N, K);
  Tensor y = forward_gemm(e, x8, w8, R, K, N, kOutput);
  return {y};
}

// NoopFwToFloat8BwDynamic's cast of the output gradient, then the linear's backward.
void fp8_column_linear_bwd(const Bwd& e) {
  Fp8 x8{need(e.a.inputs, 0, "float8 input"), need(e.a.inputs, 1, "float8 input scale")};
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  const int64_t R = g.type.shape.at(0), N = g.type.shape.at(1);
  Fp8 g8 = cast(e, g, R, N, Dtype::kFp8E5m2, Axis::kTensor, false, {.reduce = true});
  next(e);
  fp8_tp_linear_bwd(e, g8, x8, R, x8.q.type.shape.at(1));
}

// Float8RowwiseParallel's linear: x cast into outputs 2 and 1, W^T cast, the bf16 partial
// product reduce-scattered into output 0.
Outs fp8_row_linear_fwd(const Fwd& e, Ins in, Ins w) {
  const Tensor &x = need(in, 0, "input"), &wt = need(w, 0, "weight");
  const int64_t R = x.type.shape.at(0), K = x.type.shape.at(1), N = wt.type.shape.at(0);
  need(wt.type.shape.at(1) == K, "float8 linear: weight and input widths differ");
  Fp8 x8 = cast(e, x, R, K, Dtype::kFp8E4m3, Axis::kTensor, false,
                {.reduce = true, .scale_out = true, .q_out = true});
  next(e);
  Fp8 w8 = tp_weight(e, w, N, K);
  Tensor partial = forward_gemm(e, x8, w8, R, K, N, kWorkspace);
  next(e);
  Tensor y = e.out({{R / tp_size(e), N}, kAct});
  e.c.comm->reduce_scatter(partial, y);
  return {y, x8.q, x8.scale};
}

// The gradient shard cast to e5m2, all-gathered as float8, then the linear's backward on it and
// the kept float8 input (outputs 1 and 2).
void fp8_row_linear_bwd(const Bwd& e) {
  Fp8 x8{need(e.a.outputs, 1, "float8 input"), need(e.a.outputs, 2, "float8 input scale")};
  const Tensor& g = need(e.a.grad_outputs, 0, "gradient");
  const int64_t rows = g.type.shape.at(0), N = g.type.shape.at(1), R = rows * tp_size(e);
  Fp8 shard = cast(e, g, rows, N, Dtype::kFp8E5m2, Axis::kTensor, false, {.reduce = true});
  next(e);
  Tensor gathered = e.ws({{R, N}, Dtype::kFp8E5m2});
  e.c.comm->all_gather(shard.q, gathered);
  next(e);
  fp8_tp_linear_bwd(e, {gathered, shard.scale}, x8, R, x8.q.type.shape.at(1));
}

}  // namespace np::cuda
