// The model and GPU catalogs: models/*.toml, a TOML of the same schema or a Hugging Face
// config.json given by path, and models/gpus/gpus.toml. Names resolve case-insensitively through
// aliases; unknown names get the closest catalog names suggested.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/inputs/result.hpp"
#include "planner/inputs/spec.hpp"

namespace np {

// What a GPU's kernels and collectives achieve, measured ([gpu.perf] of gpus.toml; the schema is
// in docs/step-times.md). A field left empty falls back to the cost model's generic figures
// (planner/recompute/cost.cpp), which the reports name.
struct GemmPoint {
  double m = 0, n = 0, k = 0;  // the product's m x n output over a contraction of k
  double efficiency = 0;       // achieved bf16 FLOP/s / bf16_dense_flops
};
struct AttentionPoint {
  double seq = 0, heads = 0;  // sequence length; batch x query heads on the rank
  // Achieved / bf16_dense_flops, the causal kernel's work counted as the full s^2 product
  // (4 b s^2 h d forward, 2.5 times that backward).
  double forward = 0, backward = 0;
};
struct CollectivePerf {
  double bus_bytes_per_s = 0;  // nccl-tests' bus bandwidth
  double step_latency_s = 0;   // per ring step
  double call_latency_s = 0;   // per call
};
struct GpuPerf {
  std::string source;  // where the figures were measured
  std::vector<GemmPoint> gemm;
  std::vector<AttentionPoint> attention;
  // FlashAttention-2 (Dao's flash-attn 2.x, which nanotron's kernels call), where its rates on
  // this GPU are published apart from `attention` (the GPU's own or the generic figures, which
  // stand for the frameworks' newer kernels), and where they come from.
  std::vector<AttentionPoint> attention_fa2;
  std::string attention_fa2_source;
  double memory_bytes_per_s = 0;  // what memory-bound kernels achieve; 0: hbm_bytes_per_s
  // A memory-bound kernel's fixed cost (launch, ramp-up, tail), back to back; 0: the generic.
  double kernel_overhead_s = 0;
  // Inside a node, by kind: all_reduce, all_gather, reduce_scatter, all_to_all, p2p; and where
  // they were measured when not in `source`.
  std::vector<std::pair<std::string, CollectivePerf>> nvlink;
  std::string nvlink_source;
  // Where nothing is published for this GPU, its figures come from a named neighbour, and
  // `assumption` says why (the reports print it):
  // - measured_on: the device the tables were measured on, when not this GPU; their GEMM and
  //   attention efficiencies are then scaled by compute_scale (done at load);
  // - from: another catalog GPU whose GEMM table (times compute_scale over the neighbour's own)
  //   and memory-bound kernels' fraction of the datasheet bandwidth stand for this GPU's.
  std::string measured_on, from, assumption;
  double compute_scale = 1;
  const CollectivePerf* collective(std::string_view kind) const {
    for (const auto& [k, c] : nvlink)
      if (k == kind) return &c;
    return nullptr;
  }
};

struct GpuSpec {
  std::string name, display_name, source;
  std::vector<std::string> aliases;
  int64_t memory_bytes = 0;     // device memory as the driver reports it
  double bf16_dense_flops = 0;  // FLOP/s
  double hbm_bytes_per_s = 0;
  double nvlink_bytes_per_s = 0;  // per direction
  GpuPerf perf;
  // Streaming multiprocessors (0: not given). Transformer Engine's pipelined and bulk TP overlaps
  // take 16 of them from the GEMMs beside them (cost.cpp).
  int64_t sm_count = 0;
  // Peak dense float8 tensor-core FLOP/s (0: none, as on Ampere): float8 linears' GEMMs run at
  // it (cost.cpp).
  double fp8_dense_flops = 0;
};

Result<ModelSpec> load_model_toml(const std::string& path);
Result<ModelSpec> load_hf_config(const std::string& path);
// The same from text already read (`path` names it in errors): what the fuzz targets call.
Result<ModelSpec> model_toml_from_text(const std::string& text, const std::string& path);
Result<ModelSpec> hf_config_from_text(const std::string& text, const std::string& path);
// The same from a parsed object (a nanotron config's model_config; `path` names it in errors).
Result<ModelSpec> hf_config_from_json(const nlohmann::json& j, const std::string& path);
Result<std::vector<ModelSpec>> load_model_catalog(const std::string& dir);  // sorted by name
Result<std::vector<GpuSpec>> load_gpu_catalog(const std::string& path);

// A catalog name or alias, or a path to a .toml or config.json.
Result<ModelSpec> resolve_model(const std::vector<ModelSpec>& catalog, std::string_view name);
Result<GpuSpec> resolve_gpu(const std::vector<GpuSpec>& catalog, std::string_view name);
// --gpu's argument: a GPU of the catalog at `catalog_path` by name or alias, or a GPU file (a
// path ending in .toml, in the catalog's schema, holding one [[gpu]] table).
bool is_gpu_file(std::string_view arg);
Result<GpuSpec> gpu_from_arg(const std::string& catalog_path, std::string_view arg);

// Names closest to `name` by edit distance (for "did you mean").
std::vector<std::string> closest_names(std::string_view name, const std::vector<std::string>& names,
                                       size_t n = 3);

}  // namespace np
