// The cost model: a roofline estimate of the time of every op of a block graph on one GPU, of the
// TP / EP / DP collectives (ring alpha-beta), and of one optimizer step of a built schedule
// (pipeline timeline, bubble, optimizer, data-parallel gradient traffic, MFU and HFU).
//
// Assumptions that hold throughout (each constant is stated, with its source, in cost.cpp):
// - Collectives, pipeline bubbles, the optimizer and compute add up, except where a setup overlaps
//   the data-parallel traffic as Megatron does (TrainSpec::overlap_grad_reduce and
//   overlap_param_gather; off by default, as in Megatron). nanotron runs its TP collectives in line
//   with compute.
// - Pipeline sends and receives are blocking, as Megatron's 1F1B issues them: each micro-batch's
//   hidden state goes forward and its gradient back at every stage boundary, v times per
//   micro-batch under the interleaved schedule (pipeline_p2p_seconds).
// - Every rank of a stage runs the same program, so one rank's time is the stage's time.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "planner/inputs/catalog.hpp"
#include "planner/graph/graph.hpp"
#include "planner/schedule/schedule.hpp"
#include "planner/inputs/spec.hpp"

namespace np {

struct HardwareModel {
  std::string name;       // GPU name
  double peak_flops = 0;  // bf16 dense FLOP/s
  double fp8_peak_flops = 0;  // float8 dense FLOP/s (0: no float8 tensor cores)
  double hbm_bytes_per_s = 0;
  double intra_node_bytes_per_s = 0;  // per-direction NVLink bandwidth per GPU
  double inter_node_bytes_per_s = 0;  // per GPU, e.g. 400 Gb/s InfiniBand = 50e9 B/s
  double link_latency_s = 0;          // alpha of the alpha-beta model per ring step, inside a node
  int64_t gpus_per_node = 8;          // GPUs that share one NVLink domain
  double inter_node_latency_s = 0;    // alpha per ring step when the group spans nodes
  // Where the figures come from, as the reports say it: "the default; --gpu picks another", "from
  // FILE" (a GPU file), or empty (the catalog's GPU that --gpu names).
  std::string origin;
  // What the GPU's kernels and collectives achieve (gpus.toml [gpu.perf]); empty tables fall
  // back to the generic figures stated in cost.cpp.
  GpuPerf perf;
  int64_t sm_count = 0;  // GpuSpec::sm_count (0: unknown, no SM margin under TP overlap)
};

// Which efficiencies the times use, as the reports print it: measured (and where), derived from
// a neighbour (with the assumption), or generic.
std::string efficiency_basis(const HardwareModel& hw);
// The same for a setup's kernels: nanotron's attention is FlashAttention-2 (flash-attn 2.x), timed
// by the GPU's attention_fa2 rows where it has them, which the text then names.
std::string efficiency_basis(const HardwareModel& hw, Impl impl);

// The fraction of peak a bf16 GEMM with an m x n output over a contraction of k reaches on this
// GPU: its measured table interpolated (inverse-distance over the four nearest shapes in
// log2(m, n, k)), or the generic curve below when it has none.
double gemm_efficiency(const HardwareModel& hw, double m, double n, double k);
// Flash attention's forward and backward fractions of peak, the causal kernel's work counted as
// the full s^2 product (AttentionPoint), for `seq` queries and batch x heads `heads` on the rank.
struct AttentionEfficiency {
  double forward = 0, backward = 0;
};
AttentionEfficiency attention_efficiency(const HardwareModel& hw, double seq, double heads);
// The kernel `impl` runs: FlashAttention-2's rows for nanotron where the GPU has them, else the
// above.
AttentionEfficiency attention_efficiency(const HardwareModel& hw, double seq, double heads,
                                         Impl impl);

// The GPU's catalog figures plus the interconnect defaults (stated in cost.cpp).
HardwareModel hardware_model(const GpuSpec& gpu);
// H100 SXM 80GB figures (models/gpus/gpus.toml), used when no --gpu is given.
HardwareModel default_hardware();
// Float8 linears (TrainSpec::fp8) on a GPU without float8 tensor cores (fp8_peak_flops 0, compute
// capability below 8.9: A100): the frameworks refuse them, so does nanoplan, in one line.
std::optional<Error> check_fp8_gpu(const TrainSpec& t, const HardwareModel& hw);

// Fraction of peak a bf16 GEMM of an M x K by K x N product reaches:
// cap x s(M) x s(N) x s(K) with s(x) = x / (x + 64).
double gemm_efficiency(double m, double n, double k);

// Time of one collective of `kind` ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")
// over `group` ranks, bytes_full being the full (gathered / unreduced) tensor; intra_node picks
// NVLink or the inter-node network. Ring alpha-beta:
// all_gather / reduce_scatter / all_to_all: (g-1)/g x bytes_full / bw + (g-1) x alpha,
// all_reduce: twice that. 0 for a group of one. Across nodes the bandwidth is the network's and,
// as NCCL's ring counts them, only the steps that cross from one node to the next pay the
// network's alpha, the others the NVLink's: ranks_per_node of the group's ranks share each node
// (1 or less: every step crosses; more than the group: none).
double collective_seconds(std::string_view kind, double bytes_full, int64_t group, bool intra_node,
                          const HardwareModel& hw, int64_t ranks_per_node = 1);

// Time of one op instance on one rank (seconds), forward or backward (backward = input + weight
// gradients), including the collective the op runs in that direction (not overlapped).
double op_seconds(const BlockGraph& g, int op, const HardwareModel& hw, const TrainSpec& t,
                  bool backward);
// A float8 linear's casts, copies and scale products in one direction (its steps' temporaries,
// one memory-bound kernel each; cost.cpp), and the all-reduces of the maxima its casts take
// across TP, included in op_seconds.
double float8_overhead_seconds(const BlockGraph& g, const GraphOp& op, const HardwareModel& hw,
                               bool backward);

struct BlockTime {
  double forward = 0, backward = 0;
};  // one micro-batch, all ops of the block
BlockTime block_seconds(const BlockGraph& g, const HardwareModel& hw, const TrainSpec& t);
// Recompute time of a block under a recompute mask (ops re-run before its backward): the sum of
// their forward times.
double recompute_seconds(const BlockGraph& g, const std::vector<bool>& recompute,
                         const HardwareModel& hw, const TrainSpec& t);

// The pipeline's point-to-point traffic of one micro-batch at one stage boundary: the hidden
// state entering a decoder layer (the layer graph's hidden_in: sequence / cp, and / tp under
// sequence parallelism, x micro-batch x hidden), / tp again under
// TrainSpec::p2p_scatter_gather, that each rank sends forward; its gradient, the same size, goes
// back.
double pipeline_p2p_bytes(const BlockGraph& layer, const TrainSpec& t);
double pipeline_p2p_bytes(const ModelSpec& m, const TrainSpec& t);  // of build_layer(m, t)
// Seconds a stage spends per micro-batch in those blocking transfers: 2 v of them (v chunks per
// stage under the interleaved schedule, else 1), each one message of `bytes` at the link's
// bandwidth plus its latency; NVLink when the whole pipeline of a replica is inside one node,
// else the network. 0 without pipeline parallelism.
double pipeline_p2p_seconds(double bytes, const TrainSpec& t, const HardwareModel& hw);
double pipeline_p2p_seconds(const ModelSpec& m, const TrainSpec& t, const HardwareModel& hw);

// FSDP2's collectives against the compute they overlap (PyTorch 2.10,
// torch/distributed/fsdp/_fully_shard/: _fsdp_param_group.py, _fsdp_state.py,
// _fsdp_collectives.py). All-gathers run on their own streams and reduce-scatters on theirs, so
// the compute stream waits only for the unit it needs. Forward: a unit's pre-forward issues its
// all-gather and the CPU runs ahead of the GPU, so the gathers run ahead of the compute, held back
// only by FSDP's memory limit (wait_for_unshard makes the all-gather streams wait for the copy-out
// of the unit two before: two gathers in flight). Backward: a unit's pre-backward prefetches the
// unit before it (_backward_prefetch), and its post-backward reduce-scatters its gradients once
// they are computed (HSDP's all-reduce follows on its own stream). The collectives share one link,
// taken in the order they are issued; the compute stream runs the units in turn.
struct FsdpUnitTimes {
  double forward = 0, backward = 0;  // compute, one micro-batch (backward with its recompute)
  double gather_forward = 0, gather_backward = 0;  // its all-gather before each; 0: none
  double reduce = 0;  // after its backward: its reduce-scatter (and HSDP all-reduce); 0: none
};
// The seconds a micro-batch's forward and backward take beyond their compute: the collectives
// the compute waits for, and those still running after the last backward. Units in module order.
double fsdp_exposed_seconds(const std::vector<FsdpUnitTimes>& units);

struct StageSeconds {
  double forward = 0, recompute = 0, backward = 0;  // per micro-batch, all blocks of the stage
  double p2p = 0;                                   // per micro-batch: pipeline_p2p_seconds
  double optimizer = 0, grad_comm = 0;              // per step
  // Of grad_comm: the gradient reduction after the last backward (all-reduce, or reduce-scatter
  // under ZeRO-1) and the updated parameters' all-gather (ZeRO-1 and 2), the parts Megatron can
  // overlap; and this rank's gradient elements, which its buckets divide.
  double grad_reduce = 0, param_gather = 0;
  int64_t grad_elements = 0;
  // Of grad_comm under FSDP: its all-gathers, reduce-scatters and HSDP all-reduces, and the part
  // of them the step waits for (fsdp_exposed_seconds).
  double fsdp_comm = 0, fsdp_exposed = 0;
  // grad_comm as the step sees it: grad_reduce and param_gather less what the setup overlaps.
  double exposed_comm = 0;
  double microbatch() const { return forward + recompute + backward + p2p; }
};

struct StepTime {
  double seconds =
      0;  // one optimizer step (all micro-batches), the slowest stage's pipeline timeline
  double recompute_seconds = 0;  // of which re-running forward ops (on the slowest stage)
  double bubble_seconds = 0;  // pipeline bubble: (pp - 1) / v x (slowest stage's forward +
                              // backward per micro-batch, backward including its recompute); v = 1
                              // unless interleaved
  double optimizer_seconds =
      0;  // optimizer step (memory bound over this rank's optimizer + grad + weight bytes)
  double p2p_seconds = 0;  // of which the pipeline's sends and receives (bubble slots included)
  std::string overlap;     // what the times overlap, as the reports say it
  double dp_comm_seconds =
      0;  // gradient all-reduce (or reduce-scatter + all-gather under ZeRO) over dp, less what
          // the setup overlaps (StageSeconds::exposed_comm); also the TP all-reduce of
          // SP-replicated weights' gradients
  double model_flops =
      0;  // per step, all GPUs: forward + backward FLOPs of the model (no recompute)
  double hardware_flops = 0;     // the same plus recompute FLOPs
  double mfu = 0, hfu = 0;       // model_flops / (seconds x peak x gpus), hardware_flops / (...)
  double tokens_per_second = 0;  // global batch tokens / seconds
  // Additions beyond the agreed fields: the per-stage breakdown and which stage sets the pace.
  std::vector<StageSeconds> stages;
  int slowest_stage = 0;
  std::string hardware, hardware_origin;  // the GPU the times are of (HardwareModel name, origin)
  std::string efficiencies;               // efficiency_basis of that GPU
};

// From a built Schedule: each stage's blocks with their own BlockPolicy give its per-micro-batch
// forward, recompute and backward time; the step is (m + pp - 1) x (slowest stage's
// per-micro-batch time) for both 1F1B and AFAB, plus the optimizer and gradient communication of
// the stage where those two take longest.
StepTime step_time(const Schedule& s, const HardwareModel& hw);
// What a setup's times overlap, as the reports say it (StepTime::overlap).
std::string overlap_text(const TrainSpec& t);

}  // namespace np
