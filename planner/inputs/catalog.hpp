// The model and GPU catalogs: models/*.toml, a TOML of the same schema or a Hugging Face
// config.json given by path, and models/gpus/gpus.toml. Names resolve case-insensitively through
// aliases; unknown names get the closest catalog names suggested.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/inputs/result.hpp"
#include "planner/inputs/spec.hpp"

namespace np {

struct GpuSpec {
  std::string name, display_name, source;
  std::vector<std::string> aliases;
  int64_t memory_bytes = 0;     // device memory as the driver reports it
  double bf16_dense_flops = 0;  // FLOP/s
  double hbm_bytes_per_s = 0;
  double nvlink_bytes_per_s = 0;  // per direction
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
