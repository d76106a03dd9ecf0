// `nanoplan calibrate`: microbenchmarks of this machine's GPU through the CUDA backend, for a GPU
// file in the catalog's schema (models/gpus/gpus.toml, [gpu.perf]; docs/step-times.md). Each
// figure is the median of timed repetitions after warm-up, timed with CUDA events, inputs random.
// Rates are raw (FLOP/s, bytes/s); the CLI divides by the datasheet figures of the GPU named.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/inputs/result.hpp"

namespace np::cuda {

struct CalibrateOptions {
  std::vector<std::array<int64_t, 3>> gemm;       // m, n, k: an m x n output over k
  std::vector<std::array<int64_t, 2>> attention;  // seq, query heads (batch 1)
  int64_t head_dim = 128;
  int64_t copy_bytes = int64_t{1} << 30;
  int warmup = 3, repetitions = 10;
};

struct CalibratedGemm {
  int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;  // 2 m n k / time
};
struct CalibratedAttention {
  int64_t seq = 0, heads = 0;
  // The causal kernels' work counted as the full s^2 product (4 s^2 h d forward, 2.5 times that
  // backward), per second: [gpu.perf] attention's convention.
  double forward_flops_per_s = 0, backward_flops_per_s = 0;
};
struct Calibration {
  std::string device;          // the device's name
  int64_t memory_bytes = 0;    // cudaMemGetInfo's total
  std::vector<CalibratedGemm> gemm;
  std::vector<CalibratedAttention> attention;
  double copy_bytes_per_s = 0;  // a device-to-device copy, bytes read + written per second
  // A one-element elementwise kernel's time back to back (launch, ramp-up, tail): what every
  // memory-bound kernel costs besides its bytes.
  double kernel_overhead_s = 0;
  std::vector<std::string> notes;  // what was not measured, and why
};

// Runs on the current device; a CUDA error becomes the Error's one line.
Result<Calibration> calibrate(const CalibrateOptions& o);

// NCCL's all-reduce, all-gather, reduce-scatter, all-to-all and point-to-point over `ranks` GPUs
// of this machine (rank r on device r; one thread per rank, one communicator), as nccl-tests
// measures them: bf16, in place for the all-reduce, each size the full tensor (the all-gather's
// output, the reduce-scatter's input, what each rank sends in the all-to-all, a send and
// receive per peer in one group, and the message each rank sends to the next and receives from
// the previous in one group). Built with NCCL (executor/cuda/calibrate_nccl.cu) and over the NCCL emulation, where
// the ranks are threads on the one emulated device.
struct CollectiveOptions {
  int ranks = 2;
  std::vector<int64_t> bytes;  // full-tensor sizes, each a multiple of 2 x ranks
  int warmup = 3, repetitions = 10;
};
struct CalibratedCollective {
  std::string kind;  // all_reduce, all_gather, reduce_scatter, all_to_all, p2p
  int ranks = 0;
  std::vector<std::pair<int64_t, double>> seconds;  // (bytes, rank 0's median seconds) per size
  // The cost model's form fitted to them (planner/recompute/cost.cpp, collective_seconds):
  // t = twice x ((g - 1) / g x bytes / bus_bytes_per_s + (g - 1) x step_latency_s), twice 2 for
  // the all-reduce; a point-to-point message (pipeline_p2p_seconds) t = bytes / bus_bytes_per_s
  // + step_latency_s; by least squares relative to each time.
  double bus_bytes_per_s = 0, step_latency_s = 0;
};
Result<std::vector<CalibratedCollective>> calibrate_collectives(const CollectiveOptions& o);
// Sets c's bus_bytes_per_s and step_latency_s from its kind, ranks and seconds: the fit above.
// Times that do not grow with the size (one size; the emulation) give a bandwidth from the
// slowest size's rate and no latency.
void fit_collective(CalibratedCollective& c);

}  // namespace np::cuda
