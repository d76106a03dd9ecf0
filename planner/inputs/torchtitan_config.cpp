// torchtitan's job file in (configs.hpp, torchtitan_config). The keys, their types and defaults
// are torchtitan's JobConfig at pytorch/torchtitan 238fa99 (2026-02-23, the last release line
// whose job files are TOML: torchtitan/config/job_config.py; the sections and the parallel sizes
// as torchtitan/distributed/parallel_dims.py resolves them).
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "planner/inputs/configs.hpp"
#include "planner/inputs/toml_model.hpp"

namespace np {
namespace {

// torchtitan's model flavours (torchtitan/models/{llama3,deepseek_v3,qwen3}/__init__.py) that
// are catalog models: the same shapes as the Hugging Face models the catalog holds.
struct Flavor {
  const char* model;   // [model] name
  const char* flavor;  // [model] flavor
  const char* catalog;
  int64_t layers;  // the flavour's n_layers, which torchtitan's pipeline split reads
  bool profile;    // estimated with the torchtitan profile (--impl torchtitan): the dense models
};
constexpr Flavor kFlavors[] = {
    {"llama3", "8B", "llama-3.1-8b", 32, true},
    {"llama3", "70B", "llama-3.1-70b", 80, true},
    {"llama3", "405B", "llama-3.1-405b", 126, true},
    // deepseek_v3's 16B flavour is DeepSeek-V2-Lite's shape (64 routed experts, 2 shared, top 6,
    // kv_lora_rank 512, no q down-projection, 27 layers of which 1 dense, vocabulary 102,400).
    {"deepseek_v3", "16B", "deepseek-v2-lite", 27, false},
    {"deepseek_v3", "671B", "deepseek-v3", 61, false},
    {"qwen3", "8B", "qwen3-8b", 36, true},
    {"qwen3", "32B", "qwen3-32b", 64, true},
    {"qwen3", "30B-A3B", "qwen3-30b-a3b", 48, false},
    {"qwen3", "235B-A22B", "qwen3-235b-a22b", 94, false},
};

std::string valid_list(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// The keys of the sections read, as torchtitan 238fa99's JobConfig dataclasses define them
// (Model, Training, Parallelism, ActivationCheckpoint, Optimizer, Compile), and the older names
// read too (training.batch_size, training.compile).
struct Section {
  const char* name;
  std::vector<std::string_view> keys;
};
const std::vector<Section>& known_keys() {
  static const std::vector<Section> k = {
      {"model",
       {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters",
        "print_after_conversion"}},
      {"training",
       {"dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm",
        "steps", "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce",
        "gc_freq", "gc_debug", "dataloader", "batch_size", "compile"}},
      {"parallelism",
       {"data_parallel_replicate_degree", "data_parallel_shard_degree",
        "fsdp_reshard_after_forward", "tensor_parallel_degree", "disable_loss_parallel",
        "enable_async_tensor_parallel", "pipeline_parallel_degree", "module_fqns_per_model_part",
        "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
        "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
        "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
        "pipeline_parallel_expert_parallel_overlap", "context_parallel_degree",
        "context_parallel_load_balancer", "context_parallel_rotate_method",
        "expert_parallel_degree", "expert_tensor_parallel_degree",
        "expert_parallel_comm_backend"}},
      {"activation_checkpoint",
       {"mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns",
        "early_stop", "memory_budget", "visualize_memory_budget_pareto", "preserve_rng_state",
        "determinism_check", "debug"}},
      {"optimizer",
       {"name", "lr", "beta1", "beta2", "eps", "weight_decay", "implementation",
        "early_step_in_backward"}},
      {"compile", {"enable", "components", "backend"}},
  };
  return k;
}

// The stages' layer counts of an explicit module_fqns_per_model_part: `stages` lists, the first
// holding tok_embeddings, the last norm and output, and layers.0 .. layers.(n - 1) in order over
// them, each list at least one layer. Empty, with `why`, otherwise.
std::vector<int64_t> parts_split(const std::vector<std::vector<std::string>>& parts,
                                 int64_t stages, int64_t layers, std::string& why) {
  if (static_cast<int64_t>(parts.size()) != stages) {
    why = "has " + std::to_string(parts.size()) + " lists for " + std::to_string(stages) +
          " pipeline stages";
    return {};
  }
  std::vector<int64_t> counts;
  int64_t next = 0;
  for (size_t s = 0; s < parts.size(); ++s) {
    int64_t n = 0;
    for (const std::string& m : parts[s]) {
      const bool first = s == 0, last = s + 1 == parts.size();
      if ((m == "tok_embeddings" && first) || ((m == "norm" || m == "output") && last)) continue;
      if (m != "layers." + std::to_string(next)) {
        why = "lists " + quote_input(m, '"') + " in list " + std::to_string(s) +
              " where layers." + std::to_string(next) + " comes next";
        return {};
      }
      ++next, ++n;
    }
    if (n == 0) {
      why = "gives list " + std::to_string(s) + " no decoder layer, which is not modelled";
      return {};
    }
    counts.push_back(n);
  }
  if (next != layers) {
    why = "lists " + std::to_string(next) + " of the model's " + std::to_string(layers) + " layers";
    return {};
  }
  return counts;
}

bool is_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

}  // namespace

std::vector<int64_t> torchtitan_split(int64_t stages, int64_t layers, int64_t in_w, int64_t out_w,
                                      std::string& why) {
  const int64_t effective = layers + in_w + out_w, per = effective / stages;
  if (stages > effective || per == 0) {
    why = "gives an empty stage";
    return {};
  }
  if (in_w > per || out_w > per) {
    why = "exceeds the fewest layers of a stage, " + std::to_string(per);
    return {};
  }
  std::vector<int64_t> counts;
  int64_t left = layers;
  for (int64_t s = 0; s < stages; ++s) {
    int64_t n = per + (s < effective % stages ? 1 : 0);
    if (s == 0) n -= in_w;
    if (s == stages - 1) n -= out_w;
    n = std::clamp<int64_t>(n, 0, left);
    // torchtitan takes a stage of the embedding or the output alone; nanoplan's stages hold
    // decoder layers.
    if (n == 0) {
      why = "gives stage " + std::to_string(s) + " no decoder layer (only the " +
            (s == 0 ? "embedding" : "norm and output") + "), which is not modelled";
      return {};
    }
    counts.push_back(n);
    left -= n;
  }
  return counts;
}

std::optional<std::pair<std::string, std::string>> torchtitan_flavor(const std::string& model) {
  for (const Flavor& f : kFlavors)
    if (model == f.catalog) return std::pair<std::string, std::string>{f.model, f.flavor};
  return std::nullopt;
}

Result<ConfigSetup> torchtitan_config(const std::string& text, const std::string& path,
                                      int64_t gpus) {
  Result<toml::table> doc = parse_toml_text(text, path);
  if (!doc) return doc.error();
  ConfigSetup c;
  TrainSpec& t = c.setup;
  TomlReader root(*doc, path);
  std::optional<Error> failed;
  auto fail = [&](const std::string& message) {
    if (!failed) failed = make_error(message);
  };
  // A section as a reader (an empty table when absent: every key takes its default).
  static const toml::table kEmpty;
  auto section = [&](std::string_view name) {
    const toml::table* s = root.table(name);
    return TomlReader(s ? *s : kEmpty, path, std::string(name) + ".");
  };

  // A key torchtitan does not define, in a section read here, is most likely a typo: said (and
  // ignored, as every key not read is).
  for (const Section& sec : known_keys()) {
    const toml::node* n = doc->get(sec.name);
    if (!n || !n->is_table()) continue;
    for (const auto& [key, value] : *n->as_table())
      if (std::find(sec.keys.begin(), sec.keys.end(), key.str()) == sec.keys.end())
        c.notes.push_back(path + ":" + std::to_string(value.source().begin.line) + ": " +
                          sec.name + "." + printable(key.str()) +
                          " is not a key of torchtitan's [" + sec.name +
                          "] (torchtitan refuses it): ignored");
  }

  // [model]
  TomlReader model = section("model");
  const std::string name = model.string("name", "llama3");
  const std::string flavor = model.string("flavor", "debugmodel");
  const std::vector<std::string> converters = model.strings("converters");
  if (auto e = model.error()) return *e;
  std::vector<std::string> names, flavors;
  int64_t layers = 0;
  bool profile = false;
  for (const Flavor& f : kFlavors) {
    if (std::find(names.begin(), names.end(), f.model) == names.end()) names.push_back(f.model);
    if (name == f.model) flavors.push_back(f.flavor);
    if (name == f.model && flavor == f.flavor)
      c.catalog_model = f.catalog, layers = f.layers, profile = f.profile;
  }
  if (flavors.empty())
    return make_error(model.where("name") + ": model.name " + quote_input(name, '"') +
                      " is not a torchtitan model nanoplan maps (valid: " + valid_list(names) +
                      ")");
  if (c.catalog_model.empty())
    return make_error(model.where("flavor") + ": model.flavor " + quote_input(flavor, '"') +
                      " of " + name + " is not in the catalog (valid: " + valid_list(flavors) +
                      ")");
  c.given.insert("--model");
  t.mtp_layers = 0;  // torchtitan's deepseek_v3 trains no multi-token prediction module
  // The float8 linears' converter (registered as "quantize.linear.float8", "float8" before the
  // quantize section); MX linears are not modelled.
  bool float8 = false;
  for (const std::string& conv : converters) {
    if (conv == "quantize.linear.float8" || conv == "float8")
      float8 = true;
    else if (conv.find("mx") != std::string::npos)
      c.notes.push_back(path + ": model.converters " + quote_input(conv, '"') +
                        ": MX linears are not modelled; estimated as bf16 linears");
  }

  // [training]
  TomlReader training = section("training");
  const bool old_batch = root.table("training") && root.table("training")->contains("batch_size");
  const char* batch_key = old_batch ? "batch_size" : "local_batch_size";
  const int64_t local = training.integer(batch_key, 8);
  const int64_t global = training.integer("global_batch_size", -1);
  t.seq_len = training.integer("seq_len", 2048);
  const std::string param_dtype = training.string("mixed_precision_param", "bfloat16");
  const std::string reduce_dtype = training.string("mixed_precision_reduce", "float32");
  const std::string dtype = training.string("dtype", "float32");
  const bool offload = training.boolean("enable_cpu_offload", false);
  const bool old_compile = training.boolean("compile", false);
  if (auto e = training.error()) return *e;
  if (local < 1)
    fail(training.where(batch_key) + ": training." + batch_key + " " + std::to_string(local) +
         " is invalid (valid: a positive integer)");
  if (t.seq_len < 1)
    fail(training.where("seq_len") + ": training.seq_len " + std::to_string(t.seq_len) +
         " is invalid (valid: a positive integer)");
  if (param_dtype != "bfloat16")
    fail(training.where("mixed_precision_param") + ": training.mixed_precision_param " +
         quote_input(param_dtype, '"') + " is not modelled (valid: \"bfloat16\")");
  if (reduce_dtype != "float32")
    fail(training.where("mixed_precision_reduce") + ": training.mixed_precision_reduce " +
         quote_input(reduce_dtype, '"') + " is invalid (valid: \"float32\", as torchtitan takes)");
  if (dtype != "float32")
    fail(training.where("dtype") + ": training.dtype " + quote_input(dtype, '"') +
         " (bf16 sharded parameters without an fp32 copy) is not modelled (valid: \"float32\")");
  if (offload)
    fail(training.where("enable_cpu_offload") +
         ": training.enable_cpu_offload true is not modelled (valid: false)");

  // [parallelism]
  TomlReader par = section("parallelism");
  const int64_t replicate = par.integer("data_parallel_replicate_degree", 1);
  int64_t shard = par.integer("data_parallel_shard_degree", -1);
  const std::string reshard = par.string("fsdp_reshard_after_forward", "default");
  t.tp = par.integer("tensor_parallel_degree", 1);
  const bool async_tp = par.boolean("enable_async_tensor_parallel", false);
  const bool no_loss_parallel = par.boolean("disable_loss_parallel", false);
  t.pp = par.integer("pipeline_parallel_degree", 1);
  const std::string schedule = par.string("pipeline_parallel_schedule", "1F1B");
  const int64_t pp_micro = par.integer("pipeline_parallel_microbatch_size", 1);
  const int64_t in_weight = par.integer("pipeline_parallel_first_stage_less_layers", 1);
  const int64_t out_weight = par.integer("pipeline_parallel_last_stage_less_layers", 1);
  const std::optional<int64_t> layers_per_stage =
      par.has("pipeline_parallel_layers_per_stage")
          ? std::optional<int64_t>(par.integer("pipeline_parallel_layers_per_stage"))
          : std::nullopt;
  const bool explicit_parts = par.has("module_fqns_per_model_part");
  const std::vector<std::vector<std::string>> parts = par.string_lists("module_fqns_per_model_part");
  t.cp = par.integer("context_parallel_degree", 1);
  t.ep = par.integer("expert_parallel_degree", 1);
  if (auto e = par.error()) return *e;
  if (failed) return *failed;
  const std::pair<const char*, int64_t> degrees[] = {{"data_parallel_replicate_degree", replicate},
                                                     {"tensor_parallel_degree", t.tp},
                                                     {"pipeline_parallel_degree", t.pp},
                                                     {"pipeline_parallel_microbatch_size", pp_micro},
                                                     {"context_parallel_degree", t.cp},
                                                     {"expert_parallel_degree", t.ep}};
  for (auto [key, v] : degrees)
    if (v < 1)
      return make_error(par.where(key) + ": parallelism." + key + " " + std::to_string(v) +
                        " is invalid (valid: a positive integer)");
  // ParallelDims: -1 takes the rest of the world: world / (replicate x cp x tp x pp).
  const int64_t others = replicate * t.cp * t.tp * t.pp;
  if (shard == -1) {
    if (gpus <= 0)
      return make_error(par.where("data_parallel_shard_degree") +
                        ": parallelism.data_parallel_shard_degree -1 takes the GPUs the others "
                        "leave: give --gpus N (the job's world size)");
    if (gpus % others != 0)
      return make_error(par.where("data_parallel_shard_degree") +
                        ": parallelism.data_parallel_shard_degree -1 takes --gpus " +
                        std::to_string(gpus) + " over the other degrees' " +
                        std::to_string(others) +
                        " (replicate x cp x tp x pp), which do not divide it (valid: --gpus a "
                        "multiple of " + std::to_string(others) + ")");
    shard = gpus / others;
  } else if (shard < 1) {
    return make_error(par.where("data_parallel_shard_degree") +
                      ": parallelism.data_parallel_shard_degree must be -1 or a positive "
                      "integer, got " + std::to_string(shard));
  } else if (gpus > 0 && gpus != shard * others) {
    return make_error(par.where("data_parallel_shard_degree") +
                      ": parallelism.data_parallel_shard_degree " + std::to_string(shard) +
                      " gives " + std::to_string(shard * others) +
                      " GPUs (replicate x shard x cp x tp x pp), not --gpus " +
                      std::to_string(gpus) + " (valid: --gpus " +
                      std::to_string(shard * others) + ", or a shard degree of -1)");
  }
  t.dp = replicate * shard;
  t.sp = t.tp > 1;  // torchtitan's TP plans shard the norms' sequence (SequenceParallel)
  // torchtitan applies FSDP when dp_shard > 1 or cp > 1 (ParallelDims.fsdp_enabled).
  t.fsdp = shard > 1 || t.cp > 1;
  if (!t.fsdp)
    return make_error(par.where("data_parallel_shard_degree") +
                      ": parallelism.data_parallel_shard_degree " + std::to_string(shard) +
                      " with context_parallel_degree 1: torchtitan without FSDP trains fp32 "
                      "parameters under DDP, autocast or none, which is not modelled (valid: a "
                      "shard degree above 1, or -1 over more than one GPU)");
  t.dp_replicate = t.fsdp ? replicate : 1;
  if (reshard == "default") t.reshard_after_forward = t.pp == 1;
  else if (reshard == "always" || reshard == "never") t.reshard_after_forward = reshard == "always";
  else
    return make_error(par.where("fsdp_reshard_after_forward") +
                      ": parallelism.fsdp_reshard_after_forward " + quote_input(reshard, '"') +
                      " is invalid (valid: \"default\", \"always\", \"never\")");
  if (!t.fsdp) t.reshard_after_forward = true;
  if (reshard == "always")
    c.notes.push_back(path + ": fsdp_reshard_after_forward \"always\": the final norm and output "
                             "layer are estimated as kept to their backward, as under \"default\"");
  // Schedules (torch.distributed.pipelining's names, case-insensitive as torchtitan reads them).
  std::string sched = schedule;
  std::transform(sched.begin(), sched.end(), sched.begin(),
                 [](unsigned char ch) { return std::tolower(ch); });
  if (sched == "1f1b") t.pp_schedule = PpSchedule::k1F1B;
  else if (sched == "gpipe") t.pp_schedule = PpSchedule::kAfab;
  else if (sched == "interleaved1f1b") t.pp_schedule = PpSchedule::kInterleaved, t.virtual_stages = 2;
  else
    return make_error(par.where("pipeline_parallel_schedule") +
                      ": parallelism.pipeline_parallel_schedule " + quote_input(schedule, '"') +
                      " is not modelled (valid: \"1F1B\", \"GPipe\", \"Interleaved1F1B\")");
  if (t.pp == 1) t.pp_schedule = PpSchedule::k1F1B, t.virtual_stages = 1;
  if (async_tp)
    c.notes.push_back(path + ": enable_async_tensor_parallel: the step time does not model its "
                             "overlap; no byte depends on it here");
  if (no_loss_parallel && t.tp > 1)
    c.notes.push_back(path + ": disable_loss_parallel true: the logits are estimated sharded over "
                             "TP as under loss parallelism");

  // The batch: each step takes local_batch_size sequences per data-parallel rank, in
  // global / (local x dp) accumulation steps; under PP each splits into micro-batches of
  // pipeline_parallel_microbatch_size (torchtitan's train.py and pipeline_parallel.py).
  int64_t accumulation = 1;
  if (global >= 0) {  // torchtitan reads any negative value as "no accumulation" (train.py)
    if (global < 1 || global % (local * t.dp) != 0)
      return make_error(training.where("global_batch_size") + ": training.global_batch_size " +
                        std::to_string(global) + " is not a multiple of local_batch_size " +
                        std::to_string(local) + " x data-parallel degree " +
                        std::to_string(t.dp) + " (valid: -1 or such a multiple)");
    accumulation = global / (local * t.dp);
  }
  if (t.pp > 1 && accumulation > 1)
    return make_error(training.where("global_batch_size") + ": training.global_batch_size " +
                      std::to_string(global) + " accumulates " + std::to_string(accumulation) +
                      " pipeline runs per step under PP (each reducing the gradients), which is "
                      "not modelled yet (valid: -1, or local_batch_size x data-parallel degree " +
                      std::to_string(local * t.dp) + ")");
  // The stages' layers, as torchtitan splits them for its single-stage schedules (the
  // interleaved one is refused with FSDP, below).
  if (t.pp > 1 && t.pp_schedule != PpSchedule::kInterleaved) {
    if (explicit_parts) {
      std::string why;
      t.stage_layers = parts_split(parts, t.pp, layers, why);
      if (t.stage_layers.empty())
        return make_error(par.where("module_fqns_per_model_part") +
                          ": parallelism.module_fqns_per_model_part " + why +
                          " (valid: pipeline_parallel_degree lists, tok_embeddings first, then "
                          "layers.0 onwards in order, each list at least one layer, norm and "
                          "output last)");
    } else {
      const char* key = in_weight < 0 ? "pipeline_parallel_first_stage_less_layers"
                        : out_weight < 0 ? "pipeline_parallel_last_stage_less_layers"
                                         : nullptr;
      if (key)
        return make_error(par.where(key) + ": parallelism." + key + " " +
                          std::to_string(in_weight < 0 ? in_weight : out_weight) +
                          " is invalid (valid: 0 or more)");
      if (layers_per_stage) {
        const int64_t lps = *layers_per_stage, total = layers + in_weight + out_weight;
        if (lps < 1 || (total + lps - 1) / lps != t.pp)
          return make_error(par.where("pipeline_parallel_layers_per_stage") +
                            ": parallelism.pipeline_parallel_layers_per_stage " +
                            std::to_string(lps) + " makes " +
                            std::to_string(lps < 1 ? 0 : (total + lps - 1) / lps) +
                            " stages of the " + std::to_string(total) +
                            " layers with the embedding and output weights, and a single-stage "
                            "schedule needs exactly pipeline_parallel_degree " +
                            std::to_string(t.pp) + " (valid: a value with ceil(" +
                            std::to_string(total) + " / value) = " + std::to_string(t.pp) + ")");
      }
      std::string why;
      t.stage_layers = torchtitan_split(t.pp, layers, in_weight, out_weight, why);
      const char* at = out_weight > in_weight ? "pipeline_parallel_last_stage_less_layers"
                                              : "pipeline_parallel_first_stage_less_layers";
      if (t.stage_layers.empty())
        return make_error(par.where(at) + ": " +
                          std::to_string(t.pp) + " stages of " + std::to_string(layers) +
                          " layers with first and last stage weights " +
                          std::to_string(in_weight) + " and " + std::to_string(out_weight) + " " +
                          why + ", which torchtitan refuses (valid: smaller weights, or fewer "
                          "stages)");
    }
  }
  if (t.pp > 1) {
    if (local % pp_micro != 0)
      return make_error(par.where("pipeline_parallel_microbatch_size") +
                        ": parallelism.pipeline_parallel_microbatch_size " +
                        std::to_string(pp_micro) + " does not divide local_batch_size " +
                        std::to_string(local) + " (valid: a divisor of it)");
    t.micro_batch = pp_micro, t.microbatches = local / pp_micro * accumulation;
  } else {
    t.micro_batch = local, t.microbatches = accumulation;
  }

  // The dense models' code at cp 1 is the torchtitan profile (spec.hpp, Impl::kTorchtitan);
  // --impl overrides it.
  if (profile && t.cp == 1)
    t.impl = Impl::kTorchtitan;
  else
    c.notes.push_back(path + ": torchtitan's " + name + " " + flavor + " code is estimated with "
                             "the --impl kernels (nanotron's unless given); the torchtitan profile "
                             "holds its dense models at context_parallel_degree 1 (MoE, MLA and "
                             "its context parallelism not yet)");

  // [activation_checkpoint]
  TomlReader ac = section("activation_checkpoint");
  const std::string mode = ac.string("mode", "selective");
  const std::string option = ac.string("selective_ac_option", "2");
  const bool early_stop = ac.boolean("early_stop", false);
  const std::vector<std::string> force_recompute = ac.strings(
      "per_op_sac_force_recompute_mm_shapes_by_fqns");
  const bool force_given = ac.has("per_op_sac_force_recompute_mm_shapes_by_fqns");
  if (auto e = ac.error()) return *e;
  if (early_stop)
    c.notes.push_back(ac.where("early_stop") + ": activation_checkpoint.early_stop true: the "
                      "recompute is estimated running the whole layer, as under false");
  if (force_given && !(force_recompute.size() == 1 && force_recompute[0] == "moe.router.gate"))
    c.notes.push_back(ac.where("per_op_sac_force_recompute_mm_shapes_by_fqns") +
                      ": activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns: "
                      "per-op checkpointing is estimated with its default, moe.router.gate");
  if (mode == "none") {
    t.recompute = Recompute::kNone;
  } else if (mode == "full") {
    t.recompute = Recompute::kFull;
  } else if (mode == "selective" && option == "op") {
    t.recompute = Recompute::kSelectiveOp;
    if (t.impl != Impl::kTorchtitan)
      c.notes.push_back(ac.where("selective_ac_option") + ": selective_ac_option \"op\" counts "
                        "the --impl profile's matmuls (its fused [q | k | v] and [gate | up] "
                        "once each), so it keeps other tensors than torchtitan's code does");
  } else if (mode == "selective" && is_digits(option) && option.size() < 8) {
    // Every Nth block (0 and 1: every block).
    t.recompute = Recompute::kFull;
    t.recompute_every = std::max<int64_t>(1, std::stoll(option));
  } else if (mode == "selective") {
    return make_error(ac.where("selective_ac_option") + ": activation_checkpoint."
                      "selective_ac_option " + quote_input(option, '"') + " is invalid" +
                      " (valid: \"op\", or a layer interval such as \"2\"; or mode \"full\" or "
                      "\"none\")");
  } else {
    return make_error(ac.where("mode") + ": activation_checkpoint.mode " +
                      quote_input(mode, '"') +
                      (mode == "memory_budget" ? " is not modelled (it needs torch.compile's partitioner)"
                                               : " is invalid") +
                      " (valid: \"none\", \"full\", \"selective\")");
  }
  c.given.insert("--recompute");

  // [optimizer]
  TomlReader opt = section("optimizer");
  const std::string optimizer = opt.string("name", "AdamW");
  if (auto e = opt.error()) return *e;
  if (optimizer != "AdamW" && optimizer != "Adam")
    return make_error(opt.where("name") + ": optimizer.name " + quote_input(optimizer, '"') +
                      " is invalid (valid: \"Adam\", \"AdamW\")");
  t.optimizer = Optimizer::kAdamW;  // Adam keeps the same two moments

  // [compile]
  TomlReader compile = section("compile");
  if (compile.boolean("enable", false) || old_compile)
    c.notes.push_back(path + ": torch.compile: not modelled; the eager kernels' memory is "
                             "estimated (compiled blocks fuse and may keep less)");
  if (auto e = compile.error()) return *e;
  // [quantize.linear.float8] (and the older [float8]): read for their types only.
  const toml::table* quantize = root.table("quantize");
  const toml::table* linear = quantize && quantize->get("linear") ? quantize->get("linear")->as_table() : nullptr;
  for (const toml::table* f8 : {linear && linear->get("float8") ? linear->get("float8")->as_table() : nullptr,
                                root.table("float8")}) {
    if (!f8) continue;
    TomlReader r(*f8, path, f8 == root.table("float8") ? "float8." : "quantize.linear.float8.");
    // torchtitan 238fa99, torchtitan/config/job_config.py Float8Linear: recipe_name None is
    // Float8LinearConfig's defaults, tensorwise.
    const std::string recipe = r.string("recipe_name", "tensorwise");
    const std::vector<std::string> filter = r.strings("filter_fqns");
    const bool gather = r.boolean("enable_fsdp_float8_all_gather", false);
    const bool precompute = r.boolean("precompute_float8_dynamic_scale_for_fsdp", false);
    const bool emulate = r.boolean("emulate", false);
    if (auto e = r.error()) return *e;
    if (!float8) continue;
    // torchtitan 238fa99, torchtitan/components/quantization/float8.py Float8Converter: the
    // float8 all-gather only with recipe_name unset (torchao's default config, tensorwise), and
    // only when data_parallel_shard_degree is above 1 (parallel_dims.dp_shard_enabled).
    if (gather && r.has("recipe_name"))
      return make_error(r.where("enable_fsdp_float8_all_gather") +
                        ": enable_fsdp_float8_all_gather with recipe_name is refused by "
                        "torchtitan (valid: recipe_name unset, which is tensorwise, or the "
                        "all-gather off)");
    const bool shard = t.dp / t.dp_replicate > 1;
    if (gather && !shard)
      c.notes.push_back(path + ": enable_fsdp_float8_all_gather: off, as torchtitan turns it off "
                               "without a shard degree above 1");
    t.fp8_all_gather = gather && shard;
    if (gather) c.given.insert("--fp8-all-gather");
    if (precompute && t.fp8_all_gather)
      c.notes.push_back(path + ": precompute_float8_dynamic_scale_for_fsdp: estimated as the "
                               "dynamic cast (the precomputed scales' step skips |x| and its max, "
                               "4 bytes per shard element of one weight at a time)");
    // torchao 36027d8, torchao/float8/config.py, Float8LinearRecipeName: its three recipes.
    if (recipe != "tensorwise" && recipe != "rowwise" && recipe != "rowwise_with_gw_hp")
      return make_error(r.where("recipe_name") + ": recipe_name " + quote_input(recipe, '"') +
                        " is not one of torchao's float8 recipes (valid: \"tensorwise\", "
                        "\"rowwise\", \"rowwise_with_gw_hp\")");
    // filter_fqns "auto_filter_small_kn" (torchtitan's Float8LinearConverter._init_filter_fn) is
    // kept as given: float8_linear applies torchao's per-shape filter beside the names.
    t.fp8 = recipe == "rowwise"              ? Fp8Recipe::kRowwise
            : recipe == "rowwise_with_gw_hp" ? Fp8Recipe::kRowwiseGwHp
                                             : Fp8Recipe::kTensorwise;
    t.fp8_filter = filter;
    c.given.insert("--fp8");
    if (!filter.empty()) c.given.insert("--fp8-filter");
    if (emulate)
      c.notes.push_back(path + ": emulate: estimated as the float8 GEMMs (the emulation's fp32 "
                               "copies are not modelled)");
  }
  if (float8 && t.fp8 == Fp8Recipe::kNone) {  // the converter with its defaults
    t.fp8 = Fp8Recipe::kTensorwise;
    c.given.insert("--fp8");
  }
  if (auto e = root.error()) return *e;
  c.given.insert("--tp"), c.given.insert("--pp"), c.given.insert("--dp"), c.given.insert("--cp");
  return c;
}

}  // namespace np
