// The roofline cost model. Every constant is stated here, one sentence each, with its source.
#include "planner/recompute/cost.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>

namespace np {

namespace {

// --- GEMMs -----------------------------------------------------------------------------------
// Large bf16 cuBLAS GEMMs on H100 SXM reach roughly 700-780 of the 989 dense TFLOP/s; 0.75 of peak
// is the cap (the same 75 % FlashAttention-3 reports as its best, arXiv:2407.08608).
constexpr double kGemmEfficiencyCap = 0.75;
// Each GEMM dimension x scales the efficiency by x / (x + 64): half at 64 (one tensor-core tile
// edge), 97 % at 2048, 99 % at 8192; a skinny dimension starves the tiles.
constexpr double kGemmHalfDim = 64;

// --- float8 linears (torchao's Float8Linear, planner/graph/float8.cpp) ------------------------
// Their GEMMs run at the GPU's dense float8 peak at the same fraction of peak as bf16's for the
// shape: torchao's own roofline takes one achievable fraction for both (pytorch/ao 36027d8,
// torchao/testing/training/roofline_utils.py, pct_achievable_gemm_tops 0.78 for bf16 and float8
// on H100). A GPU without float8 tensor cores runs them at its bf16 rate.
// The casts, transposed copies and scale products around them are eager PyTorch kernels: one
// kernel per temporary of the op's steps, each writing its temporary once for the next to read
// once (twice its bytes of traffic), memory-bound, each with the launch overhead below.

// --- FlashAttention ----------------------------------------------------------------------------
// Forward at 55 % and backward at 45 % of peak: between FlashAttention-2 (35 % on H100) and
// FlashAttention-3 (up to 75 % forward), arXiv:2407.08608; backward kernels run below forward.
constexpr double kFlashForwardEfficiency = 0.55;
constexpr double kFlashBackwardEfficiency = 0.45;
// Causal attention: the kernels skip the masked upper triangle, half of the s^2 tiles the op table
// (like Korthikanti et al. 2022, arXiv:2205.05198) counts.
constexpr double kCausalFraction = 0.5;
// The backward kernel runs five s^2 matmuls (S again, dV, dP, dQ, dK) to the forward's two.
constexpr double kFlashBackwardWork = 2.5;

// --- Memory-bound kernels ----------------------------------------------------------------------
// Fixed cost per memory-bound kernel launch (per op and direction): launch, ramp-up and tail of a
// short kernel, a few microseconds on Hopper (assumption, not measured here).
constexpr double kLaunchOverhead = 4e-6;

// --- Interconnect (stated defaults of hardware_model)
// ---------------------------------------------- One 400 Gb/s InfiniBand NIC per GPU (DGX/HGX H100
// with ConnectX-7): 50e9 B/s per direction.
constexpr double kInterNodeBytesPerS = 50e9;
// NCCL ring step latency inside a node: with 450 GB/s this makes an 8-GPU all-gather of 64 MiB take
// 165 us, a bus bandwidth of 355 GB/s, where NCCL's developers expect 360 GB/s on H100
// (https://github.com/NVIDIA/nccl-tests/issues/326).
constexpr double kIntraNodeLatency = 5e-6;
// Ring step latency across nodes (network round trip plus proxy), twice the NVLink one
// (assumption).
constexpr double kInterNodeLatency = 10e-6;
// HGX/DGX nodes hold 8 GPUs in one NVLink domain.
constexpr int64_t kGpusPerNode = 8;

// What memory-bound kernels achieve: the GPU's measured figure, else the datasheet bandwidth.
double memory_bandwidth(const HardwareModel& hw) {
  return hw.perf.memory_bytes_per_s > 0 ? hw.perf.memory_bytes_per_s : hw.hbm_bytes_per_s;
}

enum class OpClass { kGemm, kFlash, kMemory, kCollective };

OpClass op_class(OpKind k) {
  switch (k) {
    case OpKind::kColumnLinear:
    case OpKind::kRowLinear:
    case OpKind::kFp8ColumnLinear:
    case OpKind::kFp8RowLinear:
    case OpKind::kTeColumnLinear:
    case OpKind::kTeRowLinear:
    case OpKind::kLinear:
    case OpKind::kRouter:
    case OpKind::kExpertColumn:
    case OpKind::kExpertRow:
    case OpKind::kAttnScores:
    case OpKind::kAttnContext:
      return OpClass::kGemm;
    case OpKind::kFlashAttention:
    case OpKind::kFlashAttentionCp:
    case OpKind::kSdpa:
      return OpClass::kFlash;
    case OpKind::kCpGatherKv:
    case OpKind::kAllGather:
    case OpKind::kFp8AllGather:
    case OpKind::kGatherFeatures:
    case OpKind::kReduceScatter:
    case OpKind::kAllReduce:
      return OpClass::kCollective;
    default:
      return OpClass::kMemory;
  }
}

double tensor_bytes(const BlockGraph& g, int t) {
  return static_cast<double>(g.tensors[t].type.bytes());
}

int64_t weight_elements(const GraphOp& op) {
  int64_t n = 0;
  for (const WeightShape& w : op.weights) n += w.elements();
  return n;
}

// Weight elements an op touches: embedding tables are read (and their gradients written) only
// at the looked-up rows, as many elements as the op's output; other ops read their whole weight.
double touched_weight_elements(const BlockGraph& g, const GraphOp& op) {
  double n = static_cast<double>(weight_elements(op));
  if (op.kind == OpKind::kEmbedding || op.kind == OpKind::kPosEmbedding)
    n = std::min(n, static_cast<double>(g.tensors[op.outputs[0]].type.elements()));
  return n;
}

// HBM traffic of one op. Forward: inputs + outputs + weights (bf16). Backward, from the op
// table's bits: the output gradients it reads, the saved outputs and inputs it reads, the input
// gradients it writes, the bf16 weights it reads and a read-modify-write of the weight gradients
// in the accumulation dtype (fused accumulation into the gradient buffer, as the README states).
double op_bytes(const BlockGraph& g, const GraphOp& op, const TrainSpec& t, bool backward) {
  const OpInfo& info = op_info(op.kind);
  double w = touched_weight_elements(g, op);
  double bytes = 0;
  if (!backward) {
    for (int i : op.inputs) bytes += tensor_bytes(g, i);
    for (int o : op.outputs) bytes += tensor_bytes(g, o);
    return bytes + 2.0 * w;
  }
  for (size_t j = 0; j < op.outputs.size(); ++j) {
    if (info.grad_outputs >> j & 1u) bytes += tensor_bytes(g, op.outputs[j]);
    if (info.bwd_reads_outputs >> j & 1u) bytes += tensor_bytes(g, op.outputs[j]);
  }
  for (size_t k = 0; k < op.inputs.size(); ++k) {
    if (info.bwd_reads_inputs >> k & 1u) bytes += tensor_bytes(g, op.inputs[k]);
    if (info.grad_inputs >> k & 1u) bytes += tensor_bytes(g, op.inputs[k]);
  }
  return bytes + w * (2.0 + 2.0 * static_cast<double>(dtype_bytes(t.grad_dtype)));
}

// M, N, K of one GEMM of the op (batched GEMMs: one batch entry; grouped experts: one expert).
struct GemmDims {
  double m, n, k;
};
GemmDims gemm_dims(const BlockGraph& g, const GraphOp& op) {
  const TensorType& in = g.tensors[op.inputs[0]].type;
  double rows = static_cast<double>(in.shape.at(0)), cols = static_cast<double>(in.shape.at(1));
  const OpAttrs& a = op.attrs;
  switch (op.kind) {
    case OpKind::kExpertColumn:
    case OpKind::kExpertRow:  // balanced routing: each local expert gets rows / experts
      return {rows / static_cast<double>(std::max<int64_t>(1, a.experts)),
              static_cast<double>(a.features), cols};
    case OpKind::kAttnScores:  // Q K^T per (batch, head): s x d by d x s
      return {static_cast<double>(a.seq), static_cast<double>(a.seq),
              static_cast<double>(a.head_dim)};
    case OpKind::kAttnContext:  // P V per (batch, head): s x s by s x d
      return {static_cast<double>(a.seq), static_cast<double>(a.head_dim),
              static_cast<double>(a.seq)};
    default:  // linears and the router: rows x in by in x features
      return {rows, static_cast<double>(a.features), cols};
  }
}

bool is_ep_collective(OpKind k) {
  return k == OpKind::kMoeDispatch || k == OpKind::kMoeCombine;
}

// Full size of the tensor a collective of the op moves.
double collective_bytes(const BlockGraph& g, const GraphOp& op) {
  switch (op.kind) {
    case OpKind::kColumnLinear:
      return tensor_bytes(g, op.inputs[0]);  // TP's f: all-reduce of dX
    case OpKind::kTeColumnLinear:  // ... of dX, bf16 for a float8 input
      return static_cast<double>(grad_bytes(g.tensors[op.inputs[0]].type));
    case OpKind::kMlaRope:
      return tensor_bytes(g, op.inputs[2]);  // all-reduce of the keys' RoPE part's gradient
    case OpKind::kMoeDispatch:
      return tensor_bytes(g, op.outputs[0]);  // the permuted tokens
    case OpKind::kMoeCombine:
      return tensor_bytes(g, op.inputs[0]);
    default: {
      double b = 0;  // gathered / unreduced side of a TP collective
      for (int i : op.inputs) b = std::max(b, tensor_bytes(g, i));
      for (int o : op.outputs) b = std::max(b, tensor_bytes(g, o));
      return b;
    }
  }
}

// --- TP communication overlap (TrainSpec::tp_comm_overlap) ------------------------------------
// Transformer Engine's userbuffers, as Megatron initialises them (initialize_ub in
// transformer_engine/pytorch/module/base.py, NVIDIA/TransformerEngine d0067d0, with Megatron's
// defaults tp_comm_overlap_ag, _rs, bulk_wgrad and bulk_dgrad on, model_parallel_config.py at
// NVIDIA/Megatron-LM d98e8a6), overlap each sequence-parallel collective of a layer with the GEMM
// beside it:
// - the all-gather before qkv and fc1 ("qkv_fprop", "fc1_fprop") and the gradient's all-gather
//   before proj's and fc2's input-gradient GEMM ("proj_dgrad", "fc2_dgrad"): ring exchange, the
//   GEMM split into tp chunks of m / tp rows, each step's chunk computed while the next one
//   arrives (tp - 1 steps, then the last chunk);
// - the reduce-scatter after proj and fc2 ("proj_fprop", "fc2_fprop"): pipelined, the GEMM split
//   into 4 chunks (num_splits), each chunk's reduce-scatter beside the next chunk's GEMM;
// - the reduce-scatter of qkv's and fc1's input gradient ("qkv_wgrad", "fc1_wgrad"): bulk, beside
//   the whole weight-gradient GEMM.
// The pipelined and bulk overlaps give their communication kernels 16 SMs (num_sm) and run the
// GEMM on the rest (set_sm_margin); ring exchange copies with the copy engines on all SMs.
// Each chunk's transfer is its share of the whole collective (userbuffers' kernels copy between
// the peers' registered buffers directly: no NCCL call per chunk).
// What remains visible of a collective is the pair's time less the GEMM's alone. A re-gather
// before the backward (recompute) is charged as the forward's ring exchange. The output layer's
// all-gather is Megatron's own, not Transformer Engine's, and is not overlapped.
constexpr double kTpOverlapPipelineSplits = 4;
constexpr double kTpOverlapCommSms = 16;

// The linear a sequence-parallel collective is overlapped with: the column linear that consumes
// an all-gather, the row linear that feeds a reduce-scatter; -1 if none.
int tp_overlap_partner(const BlockGraph& g, const GraphOp& op) {
  if (op.kind == OpKind::kAllGather && !op.name.ends_with("lm_head.all_gather")) {
    const std::vector<int>& c = g.tensors[op.outputs[0]].consumers;
    if (c.size() == 1 && g.ops[c[0]].kind == OpKind::kColumnLinear) return c[0];
  }
  if (op.kind == OpKind::kReduceScatter) {
    int p = g.tensors[op.inputs[0]].producer;
    if (p >= 0 && g.ops[p].kind == OpKind::kRowLinear) return p;
  }
  return -1;
}

// Seconds of the partner's GEMM in one direction ("fwd", "dgrad", "wgrad"), its rows split into
// `parts` chunks (each at its own shape's efficiency), on all SMs but `margin_sms`.
double split_gemm_seconds(const BlockGraph& g, const GraphOp& lin, const HardwareModel& hw,
                          std::string_view which, double parts, double margin_sms) {
  GemmDims d = gemm_dims(g, lin);
  double m = d.m, n = d.n, k = d.k;  // fwd: (m x k)(k x n)
  if (which == "dgrad") std::swap(n, k);             // m x k over n
  if (which == "wgrad") m = d.n, n = d.k, k = d.m;  // n x k over m
  double eff = gemm_efficiency(hw, m / parts, n, k);
  const double sms = static_cast<double>(hw.sm_count);
  double slow = sms > margin_sms && margin_sms > 0 ? sms / (sms - margin_sms) : 1.0;
  return eff > 0 ? lin.flops / (hw.peak_flops * eff) * slow : 0.0;
}

double tp_overlap_exposed(const BlockGraph& g, const GraphOp& op, const GraphOp& lin,
                          const HardwareModel& hw, const TrainSpec& t, bool backward, double comm) {
  const double tp = static_cast<double>(t.tp);
  auto ring = [&](std::string_view which) {  // tp chunks, tp - 1 transfers
    double chunk = split_gemm_seconds(g, lin, hw, which, tp, 0) / tp;
    double whole = split_gemm_seconds(g, lin, hw, which, 1, 0);
    return (tp - 1) * std::max(chunk, comm / (tp - 1)) + chunk - whole;
  };
  double visible = 0;
  if (op.kind == OpKind::kAllGather && !backward) {
    visible = ring("fwd");
  } else if (op.kind == OpKind::kReduceScatter && backward) {
    visible = ring("dgrad");
  } else if (op.kind == OpKind::kReduceScatter) {  // pipelined, 4 chunks
    const double n = kTpOverlapPipelineSplits;
    double chunk = split_gemm_seconds(g, lin, hw, "fwd", n, kTpOverlapCommSms) / n;
    double rs = comm / n;
    double whole = split_gemm_seconds(g, lin, hw, "fwd", 1, 0);
    visible = chunk + (n - 1) * std::max(chunk, rs) + rs - whole;
  } else {  // the all-gather's backward: bulk reduce-scatter beside the weight gradient
    double wgrad = split_gemm_seconds(g, lin, hw, "wgrad", 1, 0);
    visible = std::max(split_gemm_seconds(g, lin, hw, "wgrad", 1, kTpOverlapCommSms), comm) - wgrad;
  }
  return std::max(0.0, visible);
}

// Time of the collective the op runs in this direction. TP collectives span tp consecutive ranks;
// EP all-to-alls span tp x ep, CP's K/V exchange tp x cp (ranks are numbered in (pp, dp, cp, tp)
// order, ep inside dp).
double op_collective_seconds(const BlockGraph& g, const GraphOp& op, const HardwareModel& hw,
                             const TrainSpec& t, bool backward) {
  const std::string& kind = backward ? op.bwd_collective : op.fwd_collective;
  double s = 0;
  if (!kind.empty()) {
    int64_t group = op_class(op.kind) == OpClass::kCollective || is_ep_collective(op.kind)
                        ? op.attrs.group
                        : t.tp;
    int64_t span =
        is_ep_collective(op.kind) || op.kind == OpKind::kCpGatherKv ? group * t.tp : group;
    double bytes = collective_bytes(g, op);
    // torchao's float8 TP: the gather moves float8 forward and reduce-scatters the bf16 gradient
    // (twice its bytes) backward; the row linear reduce-scatters its bf16 partial product
    // forward and all-gathers the float8 gradient (half of it) backward.
    // A float8 tensor's gradient is bf16: the gather of one (kAllGather under Transformer
    // Engine's float8) reduce-scatters twice its bytes backward too.
    const bool fp8_gather =
        op.kind == OpKind::kFp8AllGather ||
        (op.kind == OpKind::kAllGather && is_float8(g.tensors[op.outputs[0]].type.dtype));
    if (fp8_gather && backward) bytes *= 2;
    // Transformer Engine's row linear without SP all-reduces its bf16 output in place.
    if (op.kind == OpKind::kTeRowLinear) bytes = tensor_bytes(g, op.outputs[0]);
    if (op.kind == OpKind::kFp8RowLinear || (op.kind == OpKind::kTeRowLinear && op.attrs.group > 1)) {
      const TensorType& y = g.tensors[op.outputs[0]].type;
      bytes = static_cast<double>(y.elements() * op.attrs.group) * (backward ? 1.0 : 2.0);
    }
    // The group's ranks span / group apart: gpus_per_node x group / span of them share a node.
    s += collective_seconds(kind, bytes, group, span <= hw.gpus_per_node, hw,
                            hw.gpus_per_node * group / span);
    int partner = t.tp_comm_overlap ? tp_overlap_partner(g, op) : -1;
    if (partner >= 0) s = tp_overlap_exposed(g, op, g.ops[partner], hw, t, backward, s);
    // The combine's backward exchanges the expert outputs again (for the probabilities'
    // gradient) before it sends the gradient back: two all-to-alls.
    if (backward && op.kind == OpKind::kMoeCombine) s *= 2;
  }
  // Vocab-parallel cross entropy all-reduces three fp32 values per token over TP in forward (the
  // logit max, the target logit and the sum of exponentials, as Megatron's).
  if (is_loss(op.kind) && !backward && t.tp > 1) {
    double row = 4.0 * static_cast<double>(g.tensors[op.inputs[0]].type.shape.at(0));
    s += 3 * collective_seconds("all_reduce", row, t.tp, t.tp <= hw.gpus_per_node, hw,
                                hw.gpus_per_node);
  }
  return s;
}

}  // namespace

HardwareModel hardware_model(const GpuSpec& gpu) {
  HardwareModel hw;
  hw.name = gpu.name;
  hw.peak_flops = gpu.bf16_dense_flops;
  hw.fp8_peak_flops = gpu.fp8_dense_flops;
  hw.hbm_bytes_per_s = gpu.hbm_bytes_per_s;
  hw.intra_node_bytes_per_s = gpu.nvlink_bytes_per_s;  // per direction, gpus.toml
  hw.inter_node_bytes_per_s = kInterNodeBytesPerS;
  hw.link_latency_s = kIntraNodeLatency;
  hw.inter_node_latency_s = kInterNodeLatency;
  hw.gpus_per_node = kGpusPerNode;
  // PCIe cards are NVLink-bridged in pairs only; beyond a pair traffic leaves the NVLink domain and
  // is modelled at the inter-node figures.
  if (gpu.name.find("pcie") != std::string::npos) hw.gpus_per_node = 2;
  hw.perf = gpu.perf;
  hw.sm_count = gpu.sm_count;
  return hw;
}

std::optional<Error> check_fp8_gpu(const TrainSpec& t, const HardwareModel& hw) {
  if (t.fp8 == Fp8Recipe::kNone || hw.fp8_peak_flops > 0) return std::nullopt;
  // Transformer Engine: _compute_fp8_support (NVIDIA/TransformerEngine d0067d0,
  // transformer_engine/pytorch/quantization.py), "Device compute capability 8.9 or higher
  // required for FP8 execution". torchtitan: Float8LinearConverter raises "float8 is only
  // supported on SM89 or later" unless float8.emulate (238fa99,
  // components/quantization/float8.py).
  const std::string who =
      te_fp8(t) ? "Transformer Engine refuses float8 execution below compute capability 8.9"
                : "torchtitan refuses float8 linears below compute capability 8.9 (its "
                  "float8.emulate testing mode is not modelled)";
  return make_error(std::string("--fp8 ") + name_of(t.fp8) + " needs float8 tensor cores, which " +
                    hw.name + " has not: " + who +
                    "; use --fp8 none, or a GPU with them (e.g. --gpu h100-sxm-80gb, h200, b200)");
}

HardwareModel default_hardware() {
  GpuSpec h100;  // models/gpus/gpus.toml, h100-sxm-80gb (NVIDIA H100 datasheet, SXM column)
  h100.name = "h100-sxm-80gb";
  h100.display_name = "NVIDIA H100 SXM5 80GB";
  h100.memory_bytes = 85520809984;
  h100.bf16_dense_flops = 989.4e12;
  h100.fp8_dense_flops = 1979e12;
  h100.hbm_bytes_per_s = 3.35e12;
  h100.nvlink_bytes_per_s = 450e9;
  h100.sm_count = 132;
  HardwareModel hw = hardware_model(h100);
  hw.origin = "the default; --gpu picks another";
  return hw;
}

double gemm_efficiency(double m, double n, double k) {
  auto s = [](double x) { return x <= 0 ? 0.0 : x / (x + kGemmHalfDim); };
  return kGemmEfficiencyCap * s(m) * s(n) * s(k);
}

namespace {

// Inverse-distance weighting (power 2) over the `kNearest` measured points closest to `at` in
// log2 space; an exact match returns its mean. Points are {coordinates..., value}.
constexpr size_t kNearest = 4;
template <size_t D, typename P, typename Coords, typename Value>
double interpolate(const std::vector<P>& points, const std::array<double, D>& at, Coords coords,
                   Value value) {
  std::array<double, D> x;
  for (size_t i = 0; i < D; ++i) x[i] = std::log2(std::max(at[i], 1.0));
  std::array<std::pair<double, double>, kNearest> best;  // (squared distance, value)
  best.fill({std::numeric_limits<double>::infinity(), 0.0});
  double exact_sum = 0;
  int exact = 0;
  for (const P& p : points) {
    std::array<double, D> c = coords(p);
    double d2 = 0;
    for (size_t i = 0; i < D; ++i) {
      double diff = std::log2(c[i]) - x[i];
      d2 += diff * diff;
    }
    if (d2 < 1e-12) {
      exact_sum += value(p), ++exact;
      continue;
    }
    if (d2 < best.back().first) {
      best.back() = {d2, value(p)};
      std::sort(best.begin(), best.end());
    }
  }
  if (exact > 0) return exact_sum / exact;
  double w = 0, v = 0;
  for (const auto& [d2, val] : best)
    if (std::isfinite(d2)) w += 1 / d2, v += val / d2;
  return w > 0 ? v / w : 0;
}

}  // namespace

double gemm_efficiency(const HardwareModel& hw, double m, double n, double k) {
  if (hw.perf.gemm.empty()) return gemm_efficiency(m, n, k);
  if (m <= 0 || n <= 0 || k <= 0) return 0;
  return interpolate<3>(
      hw.perf.gemm, {m, n, k},
      [](const GemmPoint& p) { return std::array<double, 3>{p.m, p.n, p.k}; },
      [](const GemmPoint& p) { return p.efficiency; });
}

namespace {

AttentionEfficiency interpolate_attention(const std::vector<AttentionPoint>& rows, double seq,
                                          double heads) {
  auto at = [](const AttentionPoint& p) { return std::array<double, 2>{p.seq, p.heads}; };
  return {interpolate<2>(rows, {seq, heads}, at, [](const AttentionPoint& p) { return p.forward; }),
          interpolate<2>(rows, {seq, heads}, at,
                         [](const AttentionPoint& p) { return p.backward; })};
}

// nanotron's attention is Dao's flash-attn 2.x (flash_attn_varlen_func; nanotron 2411b022 pins
// flash-attn 2.6.3): FlashAttention-2, whose Hopper rates sit well below the newer kernels'
// (cuDNN's, FlashAttention-3's) that the generic figures and the measured tables stand for.
bool runs_fa2(const HardwareModel& hw, Impl impl) {
  return impl == Impl::kNanotron && !hw.perf.attention_fa2.empty();
}

}  // namespace

AttentionEfficiency attention_efficiency(const HardwareModel& hw, double seq, double heads) {
  // Generic: the fractions of peak over the causal half (kFlash*Efficiency) in the full-s^2
  // convention.
  if (hw.perf.attention.empty())
    return {kFlashForwardEfficiency / kCausalFraction, kFlashBackwardEfficiency / kCausalFraction};
  return interpolate_attention(hw.perf.attention, seq, heads);
}

AttentionEfficiency attention_efficiency(const HardwareModel& hw, double seq, double heads,
                                         Impl impl) {
  if (runs_fa2(hw, impl)) return interpolate_attention(hw.perf.attention_fa2, seq, heads);
  return attention_efficiency(hw, seq, heads);
}

namespace {

// The text of efficiency_basis; `attention_apart`: the attention's figures are said elsewhere.
std::string basis_text(const HardwareModel& hw, bool attention_apart) {
  const GpuPerf& p = hw.perf;
  std::vector<std::string> measured, generic;
  (p.gemm.empty() ? generic : measured).push_back("GEMMs");
  if (!attention_apart) (p.attention.empty() ? generic : measured).push_back("attention");
  (p.memory_bytes_per_s > 0 ? measured : generic).push_back("memory-bound kernels");
  (p.kernel_overhead_s > 0 ? measured : generic).push_back("kernel overheads");
  const bool nvlink_apart = !p.nvlink.empty() && !p.nvlink_source.empty();
  if (!p.nvlink.empty() && !nvlink_apart) measured.push_back("NVLink collectives");
  if (p.nvlink.empty()) generic.push_back("NVLink collectives");
  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (size_t i = 0; i < v.size(); ++i)
      out += (i == 0 ? "" : i + 1 == v.size() ? " and " : ", ") + v[i];
    return out;
  };
  std::vector<std::string> parts;
  if (!measured.empty())
    parts.push_back(join(measured) + " measured" +
                    (p.measured_on.empty() ? "" : " on " + p.measured_on) +
                    (p.source.empty() ? "" : " (" + p.source + ")") +
                    (p.assumption.empty() ? "" : ", taken as this GPU's: " + p.assumption));
  if (nvlink_apart) parts.push_back("NVLink collectives measured (" + p.nvlink_source + ")");
  if (!generic.empty())
    parts.push_back(join(generic) + " at the generic efficiencies of planner/recompute/cost.cpp");
  std::string out;
  for (const std::string& s : parts) out += (out.empty() ? "" : "; ") + s;
  return out;
}

}  // namespace

std::string efficiency_basis(const HardwareModel& hw) {
  return basis_text(hw, false);
}

std::string efficiency_basis(const HardwareModel& hw, Impl impl) {
  if (!runs_fa2(hw, impl)) return basis_text(hw, false);
  return basis_text(hw, true) + "; nanotron's attention as FlashAttention-2 (" +
         hw.perf.attention_fa2_source + ")";
}

double collective_seconds(std::string_view kind, double bytes_full, int64_t group, bool intra_node,
                          const HardwareModel& hw, int64_t ranks_per_node) {
  if (group <= 1 || kind.empty()) return 0;
  if (const CollectivePerf* c = intra_node ? hw.perf.collective(kind) : nullptr) {
    // nccl-tests' bus bandwidth: the ring's (g - 1) / g of the full tensor per rank, twice for
    // an all-reduce; its ring steps; its per-call cost.
    double g = static_cast<double>(group), twice = kind == "all_reduce" ? 2 : 1;
    return twice * ((g - 1) / g * bytes_full / c->bus_bytes_per_s + (g - 1) * c->step_latency_s) +
           c->call_latency_s;
  }
  double bw = intra_node ? hw.intra_node_bytes_per_s : hw.inter_node_bytes_per_s;
  double g = static_cast<double>(group);
  double latency = (g - 1) * hw.link_latency_s;
  if (!intra_node) {
    // NCCL's ring over several nodes (NVIDIA/nccl 5067397, src/graph/tuning.cc,
    // ncclTopoTuneModel): of its nsteps, nInterSteps = nNodes - 1 cross the network (twice for an
    // all-reduce, counted below) and the rest run inside a node, (nsteps - nInterSteps) x intraLat
    // + nInterSteps x interLat.
    const CollectivePerf* c = hw.perf.collective(kind);
    const double intra = c ? c->step_latency_s : hw.link_latency_s;
    const double per_node = static_cast<double>(std::clamp<int64_t>(ranks_per_node, 1, group));
    const double crossing = std::ceil(g / per_node) - 1;
    latency = (g - 1 - crossing) * intra + crossing * hw.inter_node_latency_s;
  }
  double one = (g - 1) / g * bytes_full / bw + latency;
  if (kind == "all_gather" || kind == "reduce_scatter" || kind == "all_to_all") return one;
  if (kind == "all_reduce") return 2 * one;  // ring: reduce-scatter then all-gather
  return one;
}

double float8_overhead_seconds(const BlockGraph& g, const GraphOp& op, const HardwareModel& hw,
                               bool backward) {
  std::vector<TensorType> in;
  for (int i : op.inputs) in.push_back(g.tensors[i].type);
  const double launch = hw.perf.kernel_overhead_s > 0 ? hw.perf.kernel_overhead_s : kLaunchOverhead;
  double s = 0;
  for (const OpStep& step : op_steps(op_info(op.kind), op.attrs, in, !backward)) {
    for (const TensorType& t : step.temps)
      s += 2.0 * static_cast<double>(t.bytes()) / memory_bandwidth(hw) + launch;
    // A max taken across the TP group (DTensor's partial max): a small all-reduce, its latency.
    if (step.tp_max_bytes > 0)
      s += collective_seconds("all_reduce", static_cast<double>(step.tp_max_bytes), op.attrs.group,
                              op.attrs.group <= hw.gpus_per_node, hw, hw.gpus_per_node);
  }
  return s;
}

// Transformer Engine's casts around a float8 linear (kTeColumnLinear, kTeRowLinear): each float8
// copy its pass makes, from bf16 (2 bytes read, 1 written per element) in one kernel per
// tensor; the kept transposed input (output 1 of the row linear) in the forward.
double te_cast_seconds(const BlockGraph& g, const GraphOp& op, const HardwareModel& hw,
                       bool backward) {
  std::vector<TensorType> in;
  for (int i : op.inputs) in.push_back(g.tensors[i].type);
  const OpInfo& info = op_info(op.kind);
  std::vector<TensorType> made =
      backward ? info.bwd_workspace(op.attrs, in) : forward_workspace(info, op.attrs, in);
  if (!backward && op.kind == OpKind::kTeRowLinear) made.push_back(g.tensors[op.outputs[1]].type);
  const double launch = hw.perf.kernel_overhead_s > 0 ? hw.perf.kernel_overhead_s : kLaunchOverhead;
  double s = 0;
  for (const TensorType& t : made)
    if (is_float8(t.dtype))
      s += 3.0 * static_cast<double>(t.elements()) / memory_bandwidth(hw) + launch;
  return s;
}

double op_seconds(const BlockGraph& g, int index, const HardwareModel& hw, const TrainSpec& t,
                  bool backward) {
  const GraphOp& op = g.ops.at(index);
  double memory = op_bytes(g, op, t, backward) / memory_bandwidth(hw);
  double compute = 0;
  switch (op_class(op.kind)) {
    case OpClass::kGemm: {
      // Forward: m x n = (m x k)(k x n). Backward: two GEMMs of the same work, the input's
      // gradient (m x k over n) and the weight's (n x k over m), each at its own shape's
      // efficiency (the generic curve is symmetric, so both at the forward's there).
      GemmDims d = gemm_dims(g, op);
      const bool fp8 = op.attrs.fp8 != Fp8Recipe::kNone;
      const double peak = fp8 && hw.fp8_peak_flops > 0 ? hw.fp8_peak_flops : hw.peak_flops;
      // rowwise_with_gw_hp: the weight gradient's GEMM in bf16.
      const double wgrad_peak = op.attrs.fp8 == Fp8Recipe::kRowwiseGwHp ? hw.peak_flops : peak;
      auto seconds = [&](double m, double n, double k, double at) {
        double eff = gemm_efficiency(hw, m, n, k);
        return eff > 0 ? op.flops / (at * eff) : 0.0;
      };
      double work = backward ? seconds(d.m, d.k, d.n, peak) + seconds(d.n, d.k, d.m, wgrad_peak)
                             : seconds(d.m, d.n, d.k, peak);
      compute = std::max(work, memory);
      if (fp8) compute += float8_overhead_seconds(g, op, hw, backward);
      if (op.kind == OpKind::kTeColumnLinear || op.kind == OpKind::kTeRowLinear)
        compute += te_cast_seconds(g, op, hw, backward);
      break;
    }
    case OpClass::kFlash: {
      // The queries this rank attends from: the sequence, / cp under context parallelism.
      const OpAttrs& a = op.attrs;
      double seq = static_cast<double>(a.seq) /
                   (op.kind == OpKind::kFlashAttentionCp ? static_cast<double>(a.group) : 1.0);
      const double heads = static_cast<double>(std::max<int64_t>(1, a.batch) * a.heads);
      AttentionEfficiency e = attention_efficiency(hw, seq, heads, t.impl);
      double work = op.flops * (backward ? kFlashBackwardWork : 1.0);
      double eff = backward ? e.backward : e.forward;
      compute = std::max(work / (hw.peak_flops * eff), memory);
      break;
    }
    case OpClass::kMemory:
      compute =
          memory + (hw.perf.kernel_overhead_s > 0 ? hw.perf.kernel_overhead_s : kLaunchOverhead);
      break;
    case OpClass::kCollective:  // the collective is all there is, but a float8 gather's cast
      if (op.attrs.fp8 != Fp8Recipe::kNone) compute = float8_overhead_seconds(g, op, hw, backward);
      break;
  }
  return compute + op_collective_seconds(g, op, hw, t, backward);
}

BlockTime block_seconds(const BlockGraph& g, const HardwareModel& hw, const TrainSpec& t) {
  BlockTime bt;
  std::vector<bool> runs = backward_runs(g);
  for (int o = 0; o < static_cast<int>(g.ops.size()); ++o) {
    bt.forward += op_seconds(g, o, hw, t, false);
    if (runs[o]) bt.backward += op_seconds(g, o, hw, t, true);
  }
  return bt;
}

double recompute_seconds(const BlockGraph& g, const std::vector<bool>& recompute,
                         const HardwareModel& hw, const TrainSpec& t) {
  double s = 0;
  for (int o = 0; o < static_cast<int>(g.ops.size()); ++o)
    if (o < static_cast<int>(recompute.size()) && recompute[o]) s += op_seconds(g, o, hw, t, false);
  return s;
}

// The shape Megatron's pipeline sends: get_tensor_shapes in
// megatron/core/pipeline_parallel/schedules.py (NVIDIA/Megatron-LM at
// 4dabc62385799f8256fb05ccf3dfd4a7218781bd) gives (seq_length, micro_batch_size, hidden_size),
// seq_length divided by the TP size under sequence parallelism (later versions divide by the CP
// size first, each CP rank holding its share of the sequence); TrainSpec::p2p_scatter_gather is
// the older Megatron's split (its all-gather on arrival, over NVLink, is not counted). Its 1F1B
// steady state calls send_forward_recv_backward after each forward and send_backward_recv_forward
// after each backward, and waits for them before the next step of the schedule.
double pipeline_p2p_bytes(const BlockGraph& layer, const TrainSpec& t) {
  if (layer.hidden_in < 0) return 0;
  double bytes = tensor_bytes(layer, layer.hidden_in);
  if (t.p2p_scatter_gather && !t.sp) bytes /= static_cast<double>(std::max<int64_t>(1, t.tp));
  return bytes;
}

double pipeline_p2p_bytes(const ModelSpec& m, const TrainSpec& t) {
  return pipeline_p2p_bytes(build_layer(m, t), t);
}

double pipeline_p2p_seconds(const ModelSpec& m, const TrainSpec& t, const HardwareModel& hw) {
  return t.pp > 1 ? pipeline_p2p_seconds(pipeline_p2p_bytes(m, t), t, hw) : 0;
}

double pipeline_p2p_seconds(double bytes, const TrainSpec& t, const HardwareModel& hw) {
  if (t.pp <= 1) return 0;
  // Ranks are numbered (pp, dp, cp, tp), so a replica's pipeline spans tp cp dp pp consecutive
  // ranks; inside one node every boundary is an NVLink hop.
  const bool intra = t.tp * t.cp * t.dp * t.pp <= hw.gpus_per_node;
  double bw = intra ? hw.intra_node_bytes_per_s : hw.inter_node_bytes_per_s;
  double latency = intra ? hw.link_latency_s : hw.inter_node_latency_s;
  if (const CollectivePerf* c = intra ? hw.perf.collective("p2p") : nullptr)
    bw = c->bus_bytes_per_s, latency = c->step_latency_s + c->call_latency_s;
  const double v = t.pp_schedule == PpSchedule::kInterleaved ? static_cast<double>(t.virtual_stages)
                                                             : 1.0;
  return 2.0 * v * (bytes / bw + latency);
}

double fsdp_exposed_seconds(const std::vector<FsdpUnitTimes>& units) {
  const size_t n = units.size();
  double link = 0;  // when the link is free
  auto collective = [&link](double earliest, double seconds) {
    link = std::max(link, earliest) + seconds;
    return link;
  };
  // Forward, in module order: unit i's gather waits for the copy-out of unit i - 2, at the start
  // of its forward.
  std::vector<double> start(n, 0.0);
  double end = 0, work = 0;
  for (size_t i = 0; i < n; ++i) {
    const FsdpUnitTimes& u = units[i];
    double ready = 0;
    if (u.gather_forward > 0) ready = collective(i >= 2 ? start[i - 2] : 0.0, u.gather_forward);
    start[i] = std::max(end, ready);
    end = start[i] + u.forward;
    work += u.forward;
  }
  // Backward, in reverse: the first unit's own gather, then each pre-backward prefetches the
  // unit before it, and each post-backward reduces the unit's gradients.
  std::vector<double> gathered(n, 0.0);
  if (n > 0 && units[n - 1].gather_backward > 0)
    gathered[n - 1] = collective(end, units[n - 1].gather_backward);
  for (size_t k = n; k-- > 0;) {
    const FsdpUnitTimes& u = units[k];
    double begin = std::max(end, gathered[k]);
    if (k > 0 && units[k - 1].gather_backward > 0)
      gathered[k - 1] = collective(begin, units[k - 1].gather_backward);
    end = begin + u.backward;
    work += u.backward;
    if (u.reduce > 0) collective(end, u.reduce);
  }
  return std::max(end, link) - work;
}

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Optimizer and gradient communication of one stage, per step.
// `compute`: each block's forward and backward (with its recompute) of one micro-batch.
void stage_tail(const StageProgram& p, const HardwareModel& hw, const TrainSpec& t,
                const std::vector<BlockTime>& compute, StageSeconds& st) {
  // This rank's parameters (tied weights once per stage, as the schedule allocates them), and per
  // block for the per-micro-batch ZeRO-2/3 collectives.
  int64_t dense = 0, expert = 0, tp_partial = 0;
  std::vector<std::pair<int64_t, int64_t>> per_block;
  std::vector<int64_t> fp8_gathered;  // per block: weight elements FSDP gathers in float8
  int64_t fp8_params = 0;  // --fp8-param-gather: the TE linears' weight elements, gathered in float8
  std::vector<std::string> tied_seen;
  for (const StageBlock& b : p.blocks) {
    int64_t bd = 0, be = 0, f8 = 0;
    for (const GraphOp& op : b.graph->ops) {
      if (!op.attrs.tie.empty()) {
        if (std::find(tied_seen.begin(), tied_seen.end(), op.attrs.tie) != tied_seen.end())
          continue;
        tied_seen.push_back(op.attrs.tie);
      }
      (op.expert_weights ? be : bd) += weight_elements(op);
      if (op.tp_partial_weight_grads) tp_partial += weight_elements(op);
      if (!op.weights.empty() && op.attrs.fp8_gathered_weight(0))
        f8 += op.weights.front().elements();
      if (t.fp8_param_gather && !op.expert_weights &&
          (op.kind == OpKind::kTeColumnLinear || op.kind == OpKind::kTeRowLinear))
        fp8_params += op.weights.front().elements();
    }
    dense += bd, expert += be;
    per_block.push_back({bd, be});
    fp8_gathered.push_back(f8);
  }
  double gb = static_cast<double>(dtype_bytes(t.grad_dtype));
  // Gradients are summed over the data-parallel replicas and the CP ranks (which hold the same
  // weights and see other tokens): dp cp of them (dense), dp cp / ep (experts).
  const int64_t dense_dp = t.dp * t.cp;
  int64_t expert_dp = std::max<int64_t>(1, dense_dp / t.ep);

  // AdamW reads and writes fp32 master, exp_avg and exp_avg_sq (12 B each way), SGD the fp32 master
  // (4 B); each updated element also reads its gradient and writes its bf16 weight.
  double state = t.optimizer == Optimizer::kAdamW ? 12 : t.optimizer == Optimizer::kSgd ? 4 : 0;
  if (t.fsdp && state > 0) {
    // FSDP2: the optimizer steps the fp32 shard itself (no bf16 copy to write) and reads its
    // fp32 gradient shard.
    int64_t n = ceil_div(dense + expert, t.fsdp_shards());
    st.optimizer = static_cast<double>(n) * (2 * state + 4) / memory_bandwidth(hw);
  } else if (state > 0) {
    int64_t n =
        t.zero >= 1 ? ceil_div(dense, dense_dp) + ceil_div(expert, expert_dp) : dense + expert;
    double bytes = static_cast<double>(n) * (2 * state + gb + 2);
    // Megatron's step (NVIDIA/Megatron-LM 23e00ed, megatron/core/optimizer/optimizer.py,
    // MixedPrecisionOptimizer.step) passes over memory besides the update: the gradient norm
    // (clip_grad_norm, --clip-grad 1.0 by default in megatron/training/arguments.py) reads the
    // main gradients, and _copy_main_params_to_model_params reads the fp32 master weights it
    // casts; train_step (megatron/training/training.py) zeroes each chunk's whole gradient
    // buffer (zero_grad_buffer) before the step's first micro-batch.
    if (t.impl == Impl::kMegatron)
      bytes += static_cast<double>(n) * (gb + 4) + static_cast<double>(dense + expert) * gb;
    st.optimizer = bytes / memory_bandwidth(hw);
  }

  // Data-parallel replicas of a parameter: dp of them (dense) or dp / ep (experts), all within the
  // tp x dp consecutive ranks of one pipeline stage.
  bool intra = t.tp * t.cp * t.dp <= hw.gpus_per_node;
  double m = static_cast<double>(t.microbatches);
  // The dense gradients' group (dp x cp ranks) has its ranks tp apart, the experts' (one rank of
  // each ep group) tp x ep apart: so many of them share a node.
  auto coll = [&](const char* kind, double bytes, int64_t group) {
    const int64_t apart = group == dense_dp ? t.tp : t.tp * t.ep;
    return collective_seconds(kind, bytes, group, intra, hw, hw.gpus_per_node / apart);
  };
  double c = 0;
  if (t.fsdp) {
    // FSDP2, every micro-batch: each unit's bf16 weights all-gathered before its forward and,
    // resharded after it, again before its backward (the last unit, the head, is kept); its
    // gradients reduce-scattered in fp32 over the shard group, then all-reduced over HSDP's
    // replicas (the schedule's gather_params and reduce_grads instructions). FSDP's float8
    // all-gather moves its float8 weights at one byte an element.
    // Under PP each unit is gathered once and reduced once per step (docs/fsdp.md).
    // What the step waits for of them: fsdp_exposed_seconds over each micro-batch, or under PP
    // over the first forward, every reduction then following the last backward.
    const int64_t shards = t.fsdp_shards(), replicas = t.dp_replicate;
    const double times = t.pp > 1 ? 1 : m;
    std::vector<FsdpUnitTimes> units(per_block.size());
    double after = 0;  // under PP: the reductions after the last backward
    for (size_t b = 0; b < per_block.size(); ++b) {
      FsdpUnitTimes& u = units[b];
      u.forward = compute[b].forward, u.backward = compute[b].backward;
      double nn = static_cast<double>(per_block[b].first + per_block[b].second);
      if (nn == 0) continue;
      bool again = t.reshard_after_forward && t.pp == 1 && b + 1 < per_block.size();
      // The shard group: tp x cp x dp / replicas consecutive ranks, its own ranks tp apart (so
      // gpus_per_node / tp of them share a node); HSDP's replicas tp x shards apart.
      const bool within = t.tp * shards <= hw.gpus_per_node;
      const int64_t per_node = hw.gpus_per_node / t.tp;
      if (shards > 1) {
        const double gathered = nn * 2 - static_cast<double>(fp8_gathered[b]);  // bytes
        u.gather_forward =
            collective_seconds("all_gather", gathered, shards, within, hw, per_node);
        if (again) u.gather_backward = u.gather_forward;
        u.reduce = collective_seconds("reduce_scatter", nn * 4, shards, within, hw, per_node);
      }
      if (replicas > 1)
        u.reduce += collective_seconds("all_reduce", nn * 4 / static_cast<double>(shards), replicas,
                                       t.gpus() <= hw.gpus_per_node, hw, per_node / shards);
      st.fsdp_comm += times * (u.gather_forward + u.gather_backward + u.reduce);
      if (t.pp > 1) after += u.reduce, u.reduce = 0;
    }
    st.fsdp_exposed = times * fsdp_exposed_seconds(units) + after;
    c += st.fsdp_comm;
  }
  for (auto [n, group, f8] : {std::tuple{dense, dense_dp, fp8_params},
                              std::tuple{expert, expert_dp, int64_t{0}}}) {
    if (t.fsdp || n == 0 || group <= 1) continue;
    double nn = static_cast<double>(n);
    // After the last backward: an all-reduce, or a reduce-scatter under ZeRO-1.
    if (t.zero == 0) st.grad_reduce += coll("all_reduce", nn * gb, group);
    if (t.zero == 1) st.grad_reduce += coll("reduce_scatter", nn * gb, group);
    // The updated weights, once: bf16, the float8 parameters (--fp8-param-gather) one byte each.
    if (t.zero == 1 || t.zero == 2)
      st.param_gather += coll("all_gather", nn * 2 - static_cast<double>(f8), group);
  }
  c += st.grad_reduce + st.param_gather;
  st.grad_elements = dense + expert;
  // ZeRO-2/3: every block's gradients are reduce-scattered after its backward, every micro-batch;
  // ZeRO-3 also all-gathers its bf16 weights before its forward and its backward (the schedule's
  // reduce_grads and gather_params instructions).
  if (t.zero >= 2 && !t.fsdp)
    for (auto [bd, be] : per_block)
      for (auto [n, group] : {std::pair{bd, dense_dp}, std::pair{be, expert_dp}}) {
        if (n == 0 || group <= 1) continue;
        double nn = static_cast<double>(n);
        c += m * coll("reduce_scatter", nn * gb, group);
        if (t.zero >= 3) c += m * 2 * coll("all_gather", nn * 2, group);
      }
  // Replicated weights applied to sequence shards (SP norms, router) have partial gradients on each
  // TP rank: one bucketed all-reduce over TP per step (Megatron's layernorm-grad all-reduce).
  if (tp_partial > 0)
    c += collective_seconds("all_reduce", static_cast<double>(tp_partial) * gb, t.tp,
                            t.tp <= hw.gpus_per_node, hw, hw.gpus_per_node);
  st.grad_comm = c;
}

// Megatron's DDP (megatron/core/distributed/distributed_data_parallel.py, NVIDIA/Megatron-LM
// 293e104) skips the gradient synchronisation of every micro-batch but the last; in the last,
// with overlap_grad_reduce, each bucket's reduction starts as soon as its gradients are ready.
// Buckets hold 40,000,000 parameters, on pipeline rank 0 only: later stages keep one bucket,
// whose reduction starts when their last backward ends, while the earlier stages still run
// theirs ("not on the critical path"). So stage 0 hides its reduction behind its last backward
// but for the last bucket's, and stage s behind s backward slots. With overlap_param_gather the
// distributed optimizer's all-gather runs during the next step's first forward.
constexpr double kDdpBucketElements = 40'000'000;

double exposed_comm(const StageSeconds& st, int64_t stage, const TrainSpec& t) {
  double reduce = st.grad_reduce, gather = st.param_gather;
  if (t.overlap_grad_reduce) {
    const double backward = st.backward + st.recompute;  // the last micro-batch's
    if (stage == 0) {
      double last = st.grad_elements > 0
                        ? std::min(1.0, kDdpBucketElements / static_cast<double>(st.grad_elements))
                        : 1.0;
      reduce = std::max(reduce - backward, reduce * last);
    } else {
      reduce = std::max(0.0, reduce - static_cast<double>(stage) * backward);
    }
  }
  if (t.overlap_param_gather) gather = std::max(0.0, gather - st.forward);
  return st.grad_comm - st.grad_reduce - st.param_gather - st.fsdp_comm + reduce + gather +
         st.fsdp_exposed;
}

}  // namespace

std::string overlap_text(const TrainSpec& t) {
  std::string dp = !t.overlap_grad_reduce ? ""
                   : t.overlap_param_gather
                       ? "the DP gradient reduction and parameter gather overlapped "
                         "(--overlap-grad-reduce, --overlap-param-gather)"
                       : "the DP gradient reduction overlapped (--overlap-grad-reduce)";
  std::string tp = t.tp_comm_overlap ? "the layers' TP all-gathers and reduce-scatters overlapped "
                                       "with their GEMMs (--tp-comm-overlap, Transformer "
                                       "Engine's userbuffers)"
                                     : "";
  if (t.fsdp)
    dp = "FSDP2's all-gathers and reduce-scatters on their own streams, overlapped with the "
         "other blocks' compute (two gathers in flight forward, one prefetched backward)";
  if (dp.empty() && tp.empty()) return "no communication overlapped with compute";
  return dp.empty() ? tp : tp.empty() ? dp : dp + "; " + tp;
}

StepTime step_time(const Schedule& s, const HardwareModel& hw) {
  const TrainSpec& t = s.setup;
  StepTime r;
  r.hardware = hw.name, r.hardware_origin = hw.origin;
  r.efficiencies = efficiency_basis(hw, t.impl);
  std::map<const BlockGraph*, BlockTime> cache;
  double flops = 0, recompute_flops = 0;  // one rank per stage, one micro-batch
  for (const StageProgram& p : s.stages) {
    StageSeconds st;
    std::vector<BlockTime> compute;  // each block's, its recompute with its backward
    for (const StageBlock& b : p.blocks) {
      const BlockGraph& g = *b.graph;
      auto it = cache.find(&g);
      if (it == cache.end()) it = cache.emplace(&g, block_seconds(g, hw, t)).first;
      const double re = recompute_seconds(g, b.policy.recompute, hw, t);
      compute.push_back({it->second.forward, it->second.backward + re});
      st.forward += it->second.forward;
      st.backward += it->second.backward;
      st.recompute += re;
      flops += g.forward_flops() + g.backward_flops();
      for (size_t o = 0; o < g.ops.size(); ++o)
        if (o < b.policy.recompute.size() && b.policy.recompute[o])
          recompute_flops += g.ops[o].flops;
    }
    stage_tail(p, hw, t, compute, st);
    for (const StageBlock& b : p.blocks)
      if (b.kind == BlockKind::kLayer) {
        st.p2p = pipeline_p2p_seconds(pipeline_p2p_bytes(*b.graph, t), t, hw);
        break;
      }
    r.stages.push_back(st);
  }
  if (r.stages.empty()) return r;

  double m = static_cast<double>(t.microbatches), pp = static_cast<double>(t.pp);
  for (size_t i = 0; i < r.stages.size(); ++i)
    r.stages[i].exposed_comm = exposed_comm(r.stages[i], static_cast<int64_t>(i), t);
  int slow = 0, tail = 0;
  for (int i = 1; i < static_cast<int>(r.stages.size()); ++i) {
    if (r.stages[i].microbatch() > r.stages[slow].microbatch()) slow = i;
    if (r.stages[i].optimizer + r.stages[i].exposed_comm >
        r.stages[tail].optimizer + r.stages[tail].exposed_comm)
      tail = i;
  }
  r.slowest_stage = slow;
  double per_mb = r.stages[slow].microbatch();
  // Both AFAB and 1F1B finish after m + pp - 1 slots of the slowest stage's micro-batch time: the
  // last micro-batch's forward and backward traverse the other pp - 1 stages (bubble). The
  // interleaved schedule's slots are chunks of 1 / v of a stage: the bubble shrinks to
  // (pp - 1) / v slots (Narayanan et al. 2021, section 2.2.2).
  double v = t.pp_schedule == PpSchedule::kInterleaved ? static_cast<double>(t.virtual_stages) : 1;
  r.bubble_seconds = (pp - 1) / v * per_mb;
  r.recompute_seconds = m * r.stages[slow].recompute;
  r.p2p_seconds = (m + (pp - 1) / v) * r.stages[slow].p2p;
  r.optimizer_seconds = r.stages[tail].optimizer;
  r.dp_comm_seconds = r.stages[tail].exposed_comm;
  r.overlap = overlap_text(t);
  r.seconds = m * per_mb + r.bubble_seconds + r.optimizer_seconds + r.dp_comm_seconds;

  // Every TP, CP and DP rank of a stage runs the same op table (TP and CP shards already divided
  // in).
  double replicas = m * static_cast<double>(t.tp * t.cp * t.dp);
  r.model_flops = flops * replicas;
  r.hardware_flops = (flops + recompute_flops) * replicas;
  double gpus = static_cast<double>(t.gpus());
  if (r.seconds > 0) {
    r.mfu = r.model_flops / (r.seconds * hw.peak_flops * gpus);
    r.hfu = r.hardware_flops / (r.seconds * hw.peak_flops * gpus);
    r.tokens_per_second =
        static_cast<double>(t.micro_batch * t.seq_len * t.microbatches * t.dp) / r.seconds;
  }
  return r;
}

}  // namespace np
