// Training configs in and out: a nanotron YAML config and Megatron-LM's command-line arguments
// read into a model and a setup, and a setup with its recompute plan written back as the closest
// nanotron YAML fragment or Megatron-LM flags.
#pragma once
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "planner/inputs/result.hpp"
#include "planner/inputs/spec.hpp"

namespace np {

struct ConfigSetup {
  std::optional<ModelSpec> model;  // nanotron: model.model_config; Megatron: none (no vocab)
  std::string catalog_model;       // torchtitan: the catalog model its [model] flavor is
  TrainSpec setup;
  std::set<std::string> given;  // the nanoplan flags the config set: "--tp", "--recompute", ...
  // What the reading decided that the user should hear (flags ignored, a key read with the
  // framework's meaning): one line each, for stderr.
  std::vector<std::string> notes;
};

// nanotron's config (the YAML of `nanotron/config`): model.model_config (the Hugging Face keys;
// is_qwen2_config selects Qwen2), parallelism (dp, tp, pp, pp_engine, tp_mode,
// expert_parallel_size, recompute_layer, tp_recompute_allgather), tokens (micro_batch_size,
// sequence_length, batch_accumulation_per_replica), optimizer (zero_stage,
// accumulate_grad_in_fp32, optimizer_factory.name). Other keys do not change a byte and are
// ignored; a key that is read must have the right type. Errors name the file and the key.
Result<ConfigSetup> nanotron_config(const std::string& text, const std::string& path);

// Megatron-LM's arguments ("--tensor-model-parallel-size 8 --sequence-parallel ..."): parallelism
// (tensor, pipeline, context, expert, virtual stages by --num-layers-per-virtual-pipeline-stage),
// batch (--micro-batch-size, --global-batch-size over dp), --seq-length, recompute
// (--recompute-granularity full|selective, --recompute-method, --recompute-num-layers),
// --use-distributed-optimizer (ZeRO-1), the MoE capacity; the model's shape flags (--num-layers,
// --hidden-size, ...) are checked against `m`. `dp` is the data-parallel degree the batch is over.
Result<ConfigSetup> megatron_args(const std::string& args, const ModelSpec& m, int64_t dp);

// torchtitan's job file (TOML, as torchtitan 238fa99 reads it: torchtitan/config/job_config.py),
// planner/inputs/torchtitan_config.cpp: [model] name and flavor (llama3 8B, 70B, 405B;
// deepseek_v3 16B, 671B; qwen3 8B, 32B, 30B-A3B, 235B-A22B), [training] local_batch_size,
// global_batch_size, seq_len and the dtypes, [parallelism] (the replicate and shard degrees, -1
// taking the rest of `gpus`; FSDP2 where the shard or CP degree is above 1, as torchtitan applies
// it; fsdp_reshard_after_forward; TP, PP and its schedule and micro-batch size, CP, EP),
// [activation_checkpoint] mode and selective_ac_option (every Nth layer), [optimizer] name;
// [compile] and float8 are noted as not modelled. Other keys are ignored; a key that is read
// must have the type torchtitan gives it. `gpus`: the job's world size, 0 when not given.
Result<ConfigSetup> torchtitan_config(const std::string& text, const std::string& path,
                                      int64_t gpus);
// torchtitan's [model] name and flavor of a catalog model, where it has one ("llama3", "8B").
std::optional<std::pair<std::string, std::string>> torchtitan_flavor(const std::string& model);
// torchtitan's split of a model's layers over `stages` pipeline stages (torchtitan 238fa99,
// torchtitan/distributed/pipeline_parallel.py, generate_llm_fqn_per_model_part): the layers plus
// the embedding and the output counted as in_w and out_w layers, spread evenly, the first stages
// taking one more each where it does not divide; the first stage holds the embedding and the last
// the norm and output in place of that many layers. Empty, with `why`, where torchtitan refuses,
// or where a stage would hold no decoder layer (not modelled).
std::vector<int64_t> torchtitan_split(int64_t stages, int64_t layers, int64_t in_w, int64_t out_w,
                                      std::string& why);

}  // namespace np
