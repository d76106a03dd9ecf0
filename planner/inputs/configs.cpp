// nanotron YAML and Megatron-LM arguments in, the closest of each out (configs.hpp).
#include "planner/inputs/configs.hpp"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "planner/inputs/catalog.hpp"
#include "planner/inputs/units.hpp"

namespace np {
namespace {

// yaml-cpp's messages may quote a byte of the input: one printable line, bounded.
std::string printable(const std::string& s) {
  std::string out;
  for (char c : s.substr(0, 200))
    out += static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f ? c : '?';
  return out;
}

struct ConfigError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// yaml-cpp parses nesting recursively: deeper input than any config has is refused before it
// parses (flow brackets, and block indentation with its "- " and "? " markers).
constexpr int kMaxNesting = 64;
bool too_deep(const std::string& text) {
  int flow = 0;
  bool line_start = true;
  int column = 0;
  for (char ch : text) {
    if (ch == '\n') {
      line_start = true, column = 0;
      continue;
    }
    if (line_start && (ch == ' ' || ch == '-' || ch == '?' || ch == '\t')) {
      if (++column > 2 * kMaxNesting) return true;
      continue;
    }
    line_start = false;
    if (ch == '[' || ch == '{') {
      if (++flow > kMaxNesting) return true;
    } else if ((ch == ']' || ch == '}') && flow > 0) {
      --flow;
    }
  }
  return false;
}

// A YAML scalar or tree as JSON (numbers, booleans and null by their YAML spelling); `budget`
// bounds the nodes visited (aliases could repeat a subtree exponentially).
nlohmann::json to_json(const YAML::Node& n, int& budget) {
  if (--budget < 0) throw ConfigError("too many nodes (aliases repeat a subtree?)");
  if (n.IsMap()) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& kv : n) {
      if (!kv.first.IsScalar()) throw ConfigError("a mapping key that is not a string");
      j[kv.first.Scalar()] = to_json(kv.second, budget);
    }
    return j;
  }
  if (n.IsSequence()) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& v : n) j.push_back(to_json(v, budget));
    return j;
  }
  if (!n.IsScalar()) return nullptr;
  if (n.Tag() == "!") return n.Scalar();  // quoted: a string whatever it spells
  const std::string& s = n.Scalar();
  if (s == "null" || s == "~" || s.empty()) return nullptr;
  if (s == "true" || s == "True") return true;
  if (s == "false" || s == "False") return false;
  try {
    size_t used = 0;
    long long i = std::stoll(s, &used);
    if (used == s.size()) return i;
    double d = std::stod(s, &used);
    if (used == s.size()) return d;
  } catch (const std::exception&) {
  }
  return s;
}

// Reads typed values of one YAML map, naming the key in errors ("parallelism.tp").
class YamlSection {
 public:
  YamlSection(const YAML::Node& root, std::string name) : name_(std::move(name)) {
    n_ = root[name_];
    if (n_ && !n_.IsNull() && !n_.IsMap()) throw ConfigError(name_ + ": expected a mapping");
  }
  bool has(const char* key) const { return n_ && n_.IsMap() && n_[key] && !n_[key].IsNull(); }
  int64_t integer(const char* key, int64_t lo, int64_t hi) const {
    if (!n_[key].IsScalar())
      throw ConfigError(name_ + "." + key + ": expected a whole number, got a " +
                        (n_[key].IsMap() ? "mapping" : "sequence"));
    int budget = 1;
    nlohmann::json v = to_json(n_[key], budget);
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      throw ConfigError(name_ + "." + key + ": expected a whole number from " + format_int(lo) +
                        " to " + format_int(hi) + ", got " + quote_input(n_[key].Scalar()));
    return v.get<int64_t>();
  }
  bool boolean(const char* key) const {
    if (!n_[key].IsScalar())
      throw ConfigError(name_ + "." + key + ": expected true or false, got a " +
                        (n_[key].IsMap() ? "mapping" : "sequence"));
    int budget = 1;
    nlohmann::json v = to_json(n_[key], budget);
    if (!v.is_boolean())
      throw ConfigError(name_ + "." + key + ": expected true or false, got " +
                        quote_input(n_[key].Scalar()));
    return v.get<bool>();
  }
  std::string text(const char* key) const {
    if (!n_[key].IsScalar()) throw ConfigError(name_ + "." + key + ": expected a string");
    return n_[key].Scalar();
  }

 private:
  std::string name_;
  YAML::Node n_;
};

}  // namespace

Result<ConfigSetup> nanotron_config(const std::string& text, const std::string& path) {
  if (too_deep(text))
    return make_error(path + ": nested deeper than " + std::to_string(kMaxNesting) +
                      " levels (a nanotron config nests 4)");
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    return make_error(path + ":" + std::to_string(e.mark.line + 1) + ": not valid YAML: " +
                      printable(e.msg));
  }
  if (!root.IsMap()) return make_error(path + ": a nanotron config must be a YAML mapping");
  ConfigSetup c;
  TrainSpec& t = c.setup;
  t.mtp_layers = 0;  // nanotron trains no multi-token prediction module
  try {
    // The model: model.model_config holds the Hugging Face keys.
    YAML::Node mc = root["model"] && root["model"].IsMap() ? root["model"]["model_config"] : YAML::Node();
    if (!mc || !mc.IsMap())
      throw ConfigError("model.model_config: missing (the model's sizes: hidden_size, "
                        "num_hidden_layers, ...)");
    int budget = 100000;
    nlohmann::json hf = to_json(mc, budget);
    if (hf.contains("is_qwen2_config") && hf["is_qwen2_config"] == true)
      hf["model_type"] = hf.contains("moe_config") && !hf["moe_config"].is_null() ? "qwen2_moe" : "qwen2";
    // nanotron's Qwen2Config defaults attention_bias to false (transformers' Qwen2 has the bias).
    if (hf.contains("is_qwen2_config") && hf["is_qwen2_config"] == true &&
        !hf.contains("attention_bias"))
      hf["attention_bias"] = false;
    hf.erase("is_llama_config"), hf.erase("is_qwen2_config");
    // nanotron's MoEConfig (src/nanotron/config/models_config.py at huggingface/nanotron
    // 2411b02), as nanotron.nn.moe.Qwen2MoELayer builds it: num_experts experts of
    // moe_intermediate_size, top_k of them per token, a shared expert of
    // shared_expert_intermediate_size with a sigmoid gate Linear(hidden, 1) when
    // enable_shared_expert, in the layers listed (layers [-1]: all); the others keep the dense
    // MLP of intermediate_size (Qwen2DecoderLayer). Its defaults stand where a key is absent.
    if (hf.contains("moe_config") && !hf["moe_config"].is_null()) {
      const nlohmann::json mc = hf["moe_config"];
      const std::string at = "model.model_config.moe_config";
      if (!mc.is_object()) throw ConfigError(at + ": expected a mapping");
      if (hf.value("model_type", std::string()) != "qwen2_moe")
        throw ConfigError(at + ": nanotron's MoE layers are Qwen2's (valid: with is_qwen2_config: "
                          "true)");
      auto integer = [&](const char* key, int64_t fallback) -> int64_t {
        if (!mc.contains(key) || mc[key].is_null()) return fallback;
        if (!mc[key].is_number_integer() || mc[key].get<int64_t>() < 0)
          throw ConfigError(at + "." + key + ": expected a whole number, got " + mc[key].dump());
        return mc[key].get<int64_t>();
      };
      std::string dispatcher = "alltoall";
      if (mc.contains("token_dispatcher_type") && !mc["token_dispatcher_type"].is_null()) {
        if (!mc["token_dispatcher_type"].is_string())
          throw ConfigError(at + ".token_dispatcher_type: expected a string, got " +
                            mc["token_dispatcher_type"].dump());
        dispatcher = mc["token_dispatcher_type"].get<std::string>();
      }
      if (dispatcher != "alltoall")
        throw ConfigError(at + ".token_dispatcher_type: " + quote_input(dispatcher) +
                          " changes the memory in a way nanoplan does not model yet (valid: "
                          "alltoall)");
      bool shared = false;
      if (mc.contains("enable_shared_expert") && !mc["enable_shared_expert"].is_null()) {
        if (!mc["enable_shared_expert"].is_boolean())
          throw ConfigError(at + ".enable_shared_expert: expected true or false, got " +
                            mc["enable_shared_expert"].dump());
        shared = mc["enable_shared_expert"].get<bool>();
      }
      hf["num_experts"] = integer("num_experts", 8);
      hf["num_experts_per_tok"] = integer("top_k", 2);
      hf["moe_intermediate_size"] = integer("moe_intermediate_size", 1408);
      hf["shared_expert_intermediate_size"] =
          shared ? integer("shared_expert_intermediate_size", 5632) : 0;
      std::vector<int64_t> layers{-1};
      if (mc.contains("layers") && !mc["layers"].is_null()) {
        if (!mc["layers"].is_array()) throw ConfigError(at + ".layers: expected a list of layers");
        layers.clear();
        for (const nlohmann::json& l : mc["layers"]) {
          if (!l.is_number_integer()) throw ConfigError(at + ".layers: expected layer numbers");
          layers.push_back(l.get<int64_t>());
        }
      }
      if (!(layers.size() == 1 && layers[0] == -1)) {
        const nlohmann::json& nl = hf.contains("num_hidden_layers") ? hf["num_hidden_layers"]
                                                                     : nlohmann::json();
        if (!nl.is_number_integer() || nl.get<int64_t>() < 1 || nl.get<int64_t>() > 10000)
          throw ConfigError("model.model_config.num_hidden_layers: expected a whole number from "
                            "1 to 10000 with moe_config.layers, got " + nl.dump());
        const int64_t n = nl.get<int64_t>();
        nlohmann::json dense = nlohmann::json::array();
        for (int64_t l = 0; l < n; ++l)
          if (std::find(layers.begin(), layers.end(), l) == layers.end()) dense.push_back(l);
        hf["mlp_only_layers"] = dense;
      }
      hf.erase("moe_config");
    }
    Result<ModelSpec> m = hf_config_from_json(hf, path + ": model.model_config");
    if (!m) return m.error();
    c.model = *m;
    if (root["model"]["dtype"] && root["model"]["dtype"].IsScalar() &&
        root["model"]["dtype"].Scalar() != "bfloat16")
      throw ConfigError("model.dtype: " + quote_input(root["model"]["dtype"].Scalar()) +
                        " (valid: bfloat16; nanoplan counts bf16 weights and activations)");

    YamlSection p(root, "parallelism");
    auto set = [&](const char* flag) { c.given.insert(flag); };
    if (p.has("dp")) t.dp = p.integer("dp", 1, 1 << 20), set("--dp");
    if (p.has("tp")) t.tp = p.integer("tp", 1, 4096), set("--tp");
    if (p.has("pp")) t.pp = p.integer("pp", 1, 4096), set("--pp");
    if (p.has("expert_parallel_size")) t.ep = p.integer("expert_parallel_size", 1, 4096), set("--ep");
    if (p.has("pp_engine")) {
      std::string e = p.text("pp_engine");
      if (e == "1f1b" || e == "OneForwardOneBackward")
        t.pp_schedule = PpSchedule::k1F1B;
      else if (e == "afab" || e == "AllForwardAllBackward")
        t.pp_schedule = PpSchedule::kAfab;
      else
        throw ConfigError("parallelism.pp_engine: " + quote_input(e) + " (valid: 1f1b, afab)");
      set("--pp-schedule");
    }
    t.sp = t.tp > 1;  // nanotron's default tp_mode is REDUCE_SCATTER
    if (p.has("tp_mode")) {
      std::string mode = p.text("tp_mode");
      if (mode != "REDUCE_SCATTER" && mode != "ALL_REDUCE")
        throw ConfigError("parallelism.tp_mode: " + quote_input(mode) +
                          " (valid: REDUCE_SCATTER, ALL_REDUCE)");
      t.sp = mode == "REDUCE_SCATTER" && t.tp > 1;
    }
    set("--sp");
    if (p.has("recompute_layer"))
      t.recompute = p.boolean("recompute_layer") ? Recompute::kFull : Recompute::kNone,
      set("--recompute");
    if (p.has("tp_recompute_allgather"))
      t.tp_recompute_allgather = p.boolean("tp_recompute_allgather"), set("--tp-recompute-allgather");

    YamlSection k(root, "tokens");
    if (k.has("micro_batch_size"))
      t.micro_batch = k.integer("micro_batch_size", 1, 1 << 24), set("--micro-batch");
    if (k.has("sequence_length"))
      t.seq_len = k.integer("sequence_length", 1, 1 << 24), set("--seq-len");
    if (k.has("batch_accumulation_per_replica"))
      t.microbatches = k.integer("batch_accumulation_per_replica", 1, 65536), set("--microbatches");

    YamlSection o(root, "optimizer");
    // Any zero_stage above 0 builds nanotron's ZeroDistributedOptimizer, which shards the
    // optimizer states only (src/nanotron/helpers.py L409, nanotron 2411b022): ZeRO-1.
    if (o.has("zero_stage")) {
      int64_t stage = o.integer("zero_stage", 0, 3);
      t.zero = stage > 0 ? 1 : 0, set("--zero");
      if (stage > 1)
        c.notes.push_back(path + ": optimizer.zero_stage " + std::to_string(stage) +
                          " is ZeRO-1 in nanotron (its ZeroDistributedOptimizer shards the "
                          "optimizer states only)");
    }
    if (o.has("accumulate_grad_in_fp32"))
      t.grad_dtype = o.boolean("accumulate_grad_in_fp32") ? Dtype::kFp32 : Dtype::kBf16,
      set("--grad-accum-dtype");
    if (o.has("optimizer_factory")) {
      YAML::Node name = root["optimizer"]["optimizer_factory"]["name"];
      if (name && name.IsScalar()) {
        std::string n = name.Scalar();
        if (n == "adamW" || n == "adamw" || n == "adam")
          t.optimizer = Optimizer::kAdamW;
        else if (n == "sgd" || n == "SGD")
          t.optimizer = Optimizer::kSgd;
        else
          throw ConfigError("optimizer.optimizer_factory.name: " + quote_input(n) +
                            " (valid: adamW, sgd)");
        set("--optimizer");
      }
    }
  } catch (const ConfigError& e) {
    return make_error(path + ": " + e.what());
  } catch (const YAML::Exception& e) {
    return make_error(path + ": " + printable(e.msg));
  }
  return c;
}

// Megatron-LM arguments with a value that no byte depends on here: training hyperparameters,
// logging, checkpointing and data paths.
const std::set<std::string> kNoBytes = {
    "--lr-decay-iters", "--lr-decay-style", "--min-lr", "--weight-decay", "--clip-grad",
    "--lr-warmup-fraction", "--lr-warmup-iters", "--adam-beta1", "--adam-beta2", "--adam-eps",
    "--init-method-std", "--log-interval", "--save-interval", "--eval-interval", "--eval-iters",
    "--exit-interval", "--timing-log-level", "--tensorboard-dir", "--save", "--load",
    "--vocab-file", "--merge-file", "--split", "--data-cache-path",
    "--distributed-backend", "--ckpt-format", "--dist-ckpt-strictness", "--decoupled-lr",
    "--decoupled-min-lr", "--train-samples", "--lr-decay-samples", "--lr-warmup-samples",
    "--exit-duration-in-mins", "--distributed-timeout-minutes", "--rotary-base", "--rotary-percent",
    "--profile-step-start", "--profile-step-end", "--empty-unused-memory-level", "--seed",
    "--tokenizer-model", "--num-workers", "--log-throughput-interval",
    "--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--moe-z-loss-coeff",
    "--moe-router-bias-update-rate",
    // YaRN's scaling factor changes the cos/sin values, not their sizes.
    "--rotary-scaling-factor",
    // Delayed scaling's settings: the recipe's amax history is [history, 3] fp32 per linear
    // (not counted; runtime_terms.cpp).
    "--fp8-margin", "--fp8-interval", "--fp8-amax-history-len", "--fp8-amax-compute-algo",
    "--tiktoken-pattern"};

// The value flags megatron_args reads itself (the model's shape flags and kNoBytes aside).
const std::set<std::string> kValueFlags = {
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--micro-batch-size", "--seq-length", "--global-batch-size",
    "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--recompute-num-layers", "--recompute-granularity", "--recompute-method",
    "--recompute-modules", "--moe-expert-capacity-factor", "--cross-entropy-fusion-impl",
    "--transformer-impl", "--make-vocab-size-divisible-by", "--hidden-dropout",
    "--attention-dropout", "--attention-backend", "--moe-token-drop-policy",
    "--moe-token-dispatcher-type", "--cp-comm-type", "--normalization", "--moe-layer-freq",
    "--moe-router-score-function", "--moe-router-topk-scaling-factor", "--mtp-num-layers",
    "--mtp-loss-scaling-factor", "--fp8-format", "--fp8-recipe",
    "--position-embedding-type", "--max-position-embeddings", "--tokenizer-type", "--train-iters",
    "--lr", "--norm-epsilon", "--vocab-size", "--data-path"};
const char* const kRead =
    "read: parallel sizes, --micro-batch-size, --global-batch-size, --seq-length, "
    "--sequence-parallel, --use-distributed-optimizer, --recompute-granularity/-method/-num-layers, "
    "virtual stages, the loss and gradient fusions, the MoE capacity, the model's shape and "
    "architecture flags, and flags no byte depends on";

// Megatron-LM arguments that change the memory in ways nanoplan does not model yet: refused by
// name, with what they do.
const std::map<std::string, std::string> kNotModelled = {
    {"--no-fp8-wgrad", "the weight gradients' GEMMs in higher precision under fp8"},
    {"--first-last-layers-bf16", "bf16 first and last layers under fp8"},
    {"--fp4-format", "fp4 training (nanoplan models bf16)"},
    {"--use-megatron-fsdp", "Megatron-FSDP (for fully sharded states use --zero 3)"},
    {"--use-torch-fsdp2", "PyTorch FSDP2 (for fully sharded states use --zero 3)"},
    {"--defer-embedding-wgrad-compute", "the output layer's deferred weight gradients"},
    {"--cpu-offloading", "activation offloading to the host"},
    {"--pipeline-model-parallel-layout", "a per-stage layer layout"},
    {"--account-for-embedding-in-pipeline-split", "a pipeline split that counts the embedding"},
    {"--account-for-loss-in-pipeline-split", "a pipeline split that counts the loss"},
    {"--use-precision-aware-optimizer", "the precision-aware optimizer's reduced-precision states"}};

namespace {

// "[0/1, ...]*n + ..." (each count optional) as its entries; nullopt when malformed or past
// `most` entries.
std::optional<std::vector<int>> pattern_terms(const std::string& text, int64_t most) {
  std::vector<int> out;
  size_t at = 0;
  while (at < text.size()) {
    if (text[at] != '[') return std::nullopt;
    size_t close = text.find(']', at);
    if (close == std::string::npos) return std::nullopt;
    std::vector<int> term;
    for (size_t i = at + 1; i < close; ++i) {
      if (text[i] == ',') continue;
      if (text[i] != '0' && text[i] != '1') return std::nullopt;
      term.push_back(text[i] - '0');
    }
    at = close + 1;
    int64_t times = 1;
    if (at < text.size() && text[at] == '*') {
      size_t end = at + 1;
      while (end < text.size() && std::isdigit(static_cast<unsigned char>(text[end]))) ++end;
      if (end == at + 1 || end - at > 7) return std::nullopt;
      times = std::stoll(text.substr(at + 1, end - at - 1));
      at = end;
    }
    for (int64_t k = 0; k < times && static_cast<int64_t>(out.size()) <= most; ++k)
      out.insert(out.end(), term.begin(), term.end());
    if (at < text.size() && text[at++] != '+') return std::nullopt;
  }
  if (static_cast<int64_t>(out.size()) > most) return std::nullopt;
  return out;
}

// Megatron's --moe-layer-freq as one 0/1 entry per layer (1: MoE), or nullopt when it is neither a
// whole number nor a list expression of `layers` entries: [0/1, ...] terms, each optionally times
// a count, joined by +, the whole optionally parenthesised and then optionally times a count
// ("([0]*1+[1]*3)*1"; megatron/training/arguments.py moe_freq_type evaluates it at 23e00ed).
std::optional<std::vector<int>> moe_layer_pattern(std::string text, int64_t layers) {
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  text.erase(std::remove_if(text.begin(), text.end(), space), text.end());
  std::vector<int> out;
  if (!text.empty() && std::all_of(text.begin(), text.end(), digit)) {
    if (text.size() > 6) return std::nullopt;
    int every = std::stoi(text);
    if (every < 1) return std::nullopt;
    for (int64_t l = 0; l < layers; ++l) out.push_back(l % every == 0 ? 1 : 0);
    return out;
  }
  int64_t times = 1;
  if (!text.empty() && text.front() == '(') {
    const size_t close = text.find(')');
    if (close == std::string::npos) return std::nullopt;
    const std::string after = text.substr(close + 1);
    if (!after.empty()) {
      if (after.size() < 2 || after.size() > 7 || after[0] != '*' ||
          !std::all_of(after.begin() + 1, after.end(), digit))
        return std::nullopt;
      times = std::stoll(after.substr(1));
    }
    text = text.substr(1, close - 1);
  }
  std::optional<std::vector<int>> one = pattern_terms(text, layers);
  if (!one) return std::nullopt;
  for (int64_t k = 0; k < times && static_cast<int64_t>(out.size()) < layers; ++k)
    out.insert(out.end(), one->begin(), one->end());
  if (static_cast<int64_t>(out.size()) != layers) return std::nullopt;
  return out;
}

}  // namespace

Result<ConfigSetup> megatron_args(const std::string& args, const ModelSpec& m, int64_t dp) {
  // Words as a launch line has them; --flag=value is --flag value.
  std::vector<std::string> words;
  std::istringstream in(args);
  for (std::string w; in >> w;) {
    size_t eq = w.find('=');
    if (w.rfind("--", 0) == 0 && eq != std::string::npos) {
      words.push_back(w.substr(0, eq));
      words.push_back(w.substr(eq + 1));
    } else {
      words.push_back(w);
    }
  }
  ConfigSetup c;
  TrainSpec& t = c.setup;
  t.dp = dp;
  t.impl = Impl::kMegatron;  // Megatron's fused kernels (--impl overrides)
  c.given.insert("--impl");
  t.mtp_layers = 0;  // no multi-token prediction without --mtp-num-layers (its default None)
  int64_t global_batch = 0, vpp_layers = 0, vpp_chunks = 0, recompute_layers = -1, first_layers = 0,
          last_layers = 0;
  std::string granularity, method, ce_impl = "native";
  // Megatron-LM d98e8a6, megatron/training/arguments.py (_add_transformer_engine_args):
  // --fp8-format turns fp8 on; --fp8-recipe (default delayed) alone does nothing.
  std::string fp8_format, fp8_recipe = "delayed";
  bool distributed_optimizer = false;
  bool ce_fusion = false, recompute_activations = false, disable_bias = false, add_qkv_bias = false;
  auto fail = [](const std::string& what) { return make_error("--megatron-args: " + what); };
  // The model's shape flags, checked against m.
  // Multi-head latent attention's (Megatron-LM d98e8a6, megatron/training/arguments.py:
  // --q-lora-rank, --kv-lora-rank, --qk-head-dim the content part, --qk-pos-emb-head-dim the RoPE
  // part, --v-head-dim; --kv-channels there is the v head dim, as its DeepSeek recipes set it).
  const MlaSpec mla = m.mla.value_or(MlaSpec{});
  const std::map<std::string, int64_t> shape = {{"--num-layers", m.layers},
                                                {"--q-lora-rank", mla.q_lora_rank},
                                                {"--kv-lora-rank", mla.kv_lora_rank},
                                                {"--qk-head-dim", mla.qk_nope_head_dim},
                                                {"--qk-pos-emb-head-dim", mla.qk_rope_head_dim},
                                                {"--v-head-dim", mla.v_head_dim},
                                                {"--hidden-size", m.hidden},
                                                {"--ffn-hidden-size", m.ffn},
                                                {"--num-attention-heads", m.heads},
                                                {"--num-query-groups", m.kv_heads},
                                                {"--kv-channels",
                                                 m.mla ? m.mla->v_head_dim : m.head_dim},
                                                {"--num-experts", m.moe ? m.moe->num_experts : 0},
                                                {"--moe-router-topk", m.moe ? m.moe->top_k : 0},
                                                {"--moe-ffn-hidden-size",
                                                 m.moe ? m.moe->expert_ffn : 0},
                                                {"--moe-shared-expert-intermediate-size",
                                                 m.moe ? m.moe->shared_ffn : 0},
                                                {"--moe-router-num-groups",
                                                 m.moe ? m.moe->router.groups : 0},
                                                {"--moe-router-group-topk",
                                                 m.moe ? m.moe->router.topk_groups : 0}};
  const std::set<std::string> switches = {"--sequence-parallel", "--use-distributed-optimizer",
                                          "--moe-pad-expert-input-to-capacity",
                                          "--group-query-attention", "--use-flash-attn",
                                          "--swiglu", "--untie-embeddings-and-output-weights",
                                          "--disable-bias-linear", "--bf16",
                                          "--cross-entropy-loss-fusion", "--grad-reduce-in-bf16",
                                          "--no-position-embedding",
                                          "--no-gradient-accumulation-fusion",
                                          "--no-create-attention-mask-in-dataloader",
                                          "--add-qkv-bias", "--recompute-activations",
                                          "--overlap-grad-reduce", "--overlap-param-gather",
                                          "--tp-comm-overlap", "--qk-layernorm",
                                          "--multi-latent-attention", "--moe-router-pre-softmax",
                                          "--moe-router-enable-expert-bias",
                                          "--fp8-param-gather"};
  // Known, and no byte depends on them here: ignored, and listed once.
  const std::set<std::string> quiet = {"--use-mcore-models", "--no-bias-dropout-fusion",
                                       "--attention-softmax-in-fp32", "--no-masked-softmax-fusion",
                                       "--accumulate-allreduce-grads-in-fp32", "--mock-data",
                                       "--deterministic-mode", "--log-memory-to-tensorboard",
                                       "--log-throughput", "--log-params-norm",
                                       "--log-num-zeros-in-grad",
                                       "--log-validation-ppl-to-tensorboard",
                                       "--log-timers-to-tensorboard", "--async-save",
                                       "--use-persistent-ckpt-worker", "--verify-integrity",
                                       "--use-checkpoint-opt_param-scheduler",
                                       "--no-ckpt-fully-parallel-save", "--fp16",
                                       "--calculate-per-token-loss", "--manual-gc", "--profile",
                                       "--apply-layernorm-1p", "--use-pytorch-profiler",
                                       "--no-load-optim", "--no-load-rng", "--exit-on-missing-checkpoint",
                                       "--moe-grouped-gemm", "--moe-permute-fusion",
                                       "--no-mmap-bin-files",
                                       // Megatron's experimental kernels: with MLA its fused RoPE
                                       // (fused_apply_mla_rope_for_q / _for_kv, multi_latent_
                                       // attention.py at 23e00ed, which refuse to run without
                                       // it), the one op the MLA graph has; the others pad fp8
                                       // routing maps or serve DeepEP, refused elsewhere.
                                       "--enable-experimental"};
  std::vector<std::string> ignored;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (quiet.count(w)) {
      ignored.push_back(w);
      continue;
    }
    if (auto it = kNotModelled.find(w); it != kNotModelled.end())
      return fail(w + " changes the memory in a way nanoplan does not model yet: " + it->second);
    if (w == "--rampup-batch-size") {  // start, increment, samples: the peak is at the full batch
      for (int k = 0; k < 3 && i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0; ++k) ++i;
      ignored.push_back(w);
      continue;
    }
    if (switches.count(w)) {
      if (w == "--sequence-parallel") t.sp = true, c.given.insert("--sp");
      if (w == "--use-distributed-optimizer") t.zero = std::max(t.zero, 1), c.given.insert("--zero");
      if (w == "--use-flash-attn") t.attention = AttentionImpl::kFlash, c.given.insert("--attention");
      if (w == "--cross-entropy-loss-fusion") ce_fusion = true;
      // Megatron: --recompute-activations is --recompute-granularity selective, whatever the
      // order (applied after the loop).
      if (w == "--recompute-activations") recompute_activations = true;
      if (w == "--disable-bias-linear") disable_bias = true;
      if (w == "--add-qkv-bias") add_qkv_bias = true;
      if (w == "--grad-reduce-in-bf16") t.grad_dtype = Dtype::kBf16, c.given.insert("--grad-accum-dtype");
      if (w == "--no-gradient-accumulation-fusion")
        t.grad_accum_fusion = false, c.given.insert("--gradient-accumulation-fusion");
      if (w == "--no-create-attention-mask-in-dataloader")
        t.dataloader_mask = false, c.given.insert("--dataloader-attention-mask");
      // The overlapped reductions work in place in the gradient and parameter buffers: the step
      // time's, not the memory's.
      if (w == "--overlap-grad-reduce")
        t.overlap_grad_reduce = true, c.given.insert("--overlap-grad-reduce");
      if (w == "--overlap-param-gather")
        t.overlap_param_gather = true, c.given.insert("--overlap-param-gather");
      // TE's userbuffers: the step time's overlap and their own buffers (runtime_terms.cpp).
      if (w == "--tp-comm-overlap") t.tp_comm_overlap = true, c.given.insert("--tp-comm-overlap");
      // Float8 parameters: checked against --fp8-format and the optimizer after the loop.
      if (w == "--fp8-param-gather") t.fp8_param_gather = true, c.given.insert("--fp8-param-gather");
      if (w == "--use-distributed-optimizer") distributed_optimizer = true;
      // The architecture switches, checked against the model (absent: the model decides).
      auto arch = [&](bool agrees, const std::string& model_has) -> std::optional<Error> {
        if (agrees) return std::nullopt;
        return fail(w + " differs from the model " + m.name + ", which has " + model_has);
      };
      std::optional<Error> bad;
      if (w == "--swiglu")
        bad = arch(m.activation == Activation::kSwiGlu, std::string(name_of(m.activation)));
      if (w == "--disable-bias-linear") bad = arch(!m.linear_bias, "biases on its linears");
      if (w == "--untie-embeddings-and-output-weights")
        bad = arch(!m.tie_embeddings, "tied embeddings");
      if (w == "--no-position-embedding")
        bad = arch(m.position != PosEmb::kLearned, "learned position embeddings");
      if (w == "--group-query-attention")
        bad = arch(m.kv_heads < m.heads, "as many key/value heads as query heads");
      // With MLA, Megatron's qk_layernorm norms the q and kv latents (their up-projections are
      // TELayerNormColumnParallelLinear, gpt_layer_specs.py at 23e00ed), as the MLA graph does.
      if (w == "--qk-layernorm") bad = arch(m.qk_norm || m.mla.has_value(), "no q/k norms");
      if (w == "--multi-latent-attention")
        bad = arch(m.mla.has_value(), "q/k/v projections, not multi-head latent attention");
      // Megatron's routing (moe_utils.py, topk_routing_with_score_function): softmax before the
      // top-k is the top-k of the softmax over all experts, not renormalised.
      const RouterSpec rt = m.moe ? m.moe->router : RouterSpec{};
      if (w == "--moe-router-pre-softmax")
        bad = arch(m.moe && !rt.sigmoid && !rt.normalize,
                   "the softmax over the chosen experts' logits (norm_topk_prob)");
      if (w == "--moe-router-enable-expert-bias")
        bad = arch(m.moe && m.moe->expert_bias, "no expert score-correction bias");
      if (bad) return *bad;
      continue;
    }
    if (w.rfind("--", 0) != 0) return fail("unexpected " + quote_input(w) + " (flags start with --)");
    if (i + 1 >= words.size() || words[i + 1].rfind("--", 0) == 0) {
      if (!shape.count(w) && !kNoBytes.count(w) && !kValueFlags.count(w))
        return fail("unknown Megatron-LM argument " + quote_input(w) + " (" + kRead + ")");
      return fail(quote_input(w) + " needs a value");
    }
    if (w == "--data-path") {  // weights and prefixes of a blend: the words up to the next flag
      while (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0) ++i;
      ignored.push_back(w);
      continue;
    }
    if (w == "--recompute-modules") {  // a list: the words up to the next flag
      std::set<std::string> modules;
      while (i + 1 < words.size() && words[i + 1].rfind("--", 0) != 0) modules.insert(words[++i]);
      if (modules != std::set<std::string>{"core_attn"})
        return fail("--recompute-modules: nanoplan reads core_attn (selective recompute); other "
                    "modules are per-module plans, which --recompute auto chooses itself");
      continue;
    }
    const std::string& v = words[++i];
    auto number = [&](int64_t lo, int64_t hi) -> std::optional<int64_t> {
      Result<int64_t> r = parse_integer(v);
      if (!r || *r < lo || *r > hi) return std::nullopt;
      return *r;
    };
    auto count_of = [&](const char* flag, int64_t& into, const char* nanoplan_flag) -> bool {
      if (w != flag) return false;
      std::optional<int64_t> n = number(1, 1 << 24);
      if (!n) throw std::invalid_argument(w + " " + quote_input(v) + ": expected a positive whole number");
      into = *n;
      if (nanoplan_flag[0]) c.given.insert(nanoplan_flag);
      return true;
    };
    try {
      if (auto it = shape.find(w); it != shape.end()) {
        std::optional<int64_t> n = number(1, int64_t{1} << 40);
        if (!n || *n != it->second)
          return fail(w + " " + quote_input(v) + " differs from the model " + m.name + " (" +
                      std::to_string(it->second) + ")");
        continue;
      }
      if (count_of("--tensor-model-parallel-size", t.tp, "--tp") ||
          count_of("--pipeline-model-parallel-size", t.pp, "--pp") ||
          count_of("--context-parallel-size", t.cp, "--cp") ||
          count_of("--expert-model-parallel-size", t.ep, "--ep") ||
          count_of("--micro-batch-size", t.micro_batch, "--micro-batch") ||
          count_of("--seq-length", t.seq_len, "--seq-len") ||
          count_of("--global-batch-size", global_batch, "") ||
          count_of("--num-layers-per-virtual-pipeline-stage", vpp_layers, "") ||
          count_of("--num-virtual-stages-per-pipeline-rank", vpp_chunks, "") ||
          count_of("--decoder-first-pipeline-num-layers", first_layers, "--partition") ||
          count_of("--decoder-last-pipeline-num-layers", last_layers, "--partition"))
        continue;
      if (w == "--mtp-num-layers") {
        std::optional<int64_t> n = number(0, 16);
        if (!n) return fail(w + " " + quote_input(v) + ": expected a whole number from 0 to 16");
        t.mtp_layers = *n, c.given.insert("--mtp-layers");
        continue;
      }
      if (w == "--recompute-num-layers") {  // 0: no layer recomputed
        std::optional<int64_t> n = number(0, 1 << 24);
        if (!n) return fail(w + " " + quote_input(v) + ": expected a whole number >= 0");
        recompute_layers = *n;
        continue;
      }
    } catch (const std::invalid_argument& e) {
      return fail(e.what());
    }
    if (w == "--recompute-granularity") {
      if (v != "full" && v != "selective")
        return fail("--recompute-granularity " + quote_input(v) + " (valid: full, selective)");
      granularity = v;
    } else if (w == "--recompute-method") {
      if (v != "uniform" && v != "block")
        return fail("--recompute-method " + quote_input(v) + " (valid: uniform, block)");
      method = v;
    } else if (w == "--moe-layer-freq") {
      // Megatron's pattern of MoE layers (megatron/training/arguments.py, moe_freq_type): an
      // integer N (every N-th layer from layer 0 is MoE) or a list expression such as
      // "([0]*3+[1]*58)", 1 for an MoE layer. The model decides the layers; the flag must agree.
      std::optional<std::vector<int>> pattern = moe_layer_pattern(v, m.layers);
      if (!pattern)
        return fail("--moe-layer-freq " + quote_input(v) + " (valid: a whole number, or a list " +
                    "of " + std::to_string(m.layers) + " 0/1 entries such as ([0]*3+[1]*58))");
      std::vector<int> model(static_cast<size_t>(m.layers), m.moe ? 1 : 0);
      for (int64_t l : m.dense_layers) model[static_cast<size_t>(l)] = 0;
      if (*pattern != model)
        return fail("--moe-layer-freq " + quote_input(v) + " differs from the model " + m.name +
                    (m.moe ? ", whose dense layers are " +
                                 format_ranges(std::vector<int>(m.dense_layers.begin(),
                                                                m.dense_layers.end()))
                           : std::string(", which has no MoE layers")));
    } else if (w == "--moe-router-score-function") {
      const bool sigmoid = m.moe && m.moe->router.sigmoid;
      if (v != "softmax" && v != "sigmoid")
        return fail(w + " " + quote_input(v) + " (valid: softmax, sigmoid)");
      if ((v == "sigmoid") != sigmoid || !m.moe)
        return fail(w + " " + quote_input(v) + " differs from the model " + m.name + " (" +
                    (!m.moe ? "no MoE" : sigmoid ? "sigmoid" : "softmax") + ")");
    } else if (w == "--moe-router-topk-scaling-factor") {
      char* end = nullptr;
      double f = std::strtod(v.c_str(), &end);
      const double model = m.moe ? m.moe->router.scaling : 0.0;
      char shown[32];
      std::snprintf(shown, sizeof shown, "%g", model);
      if (*end != '\0' || !m.moe || std::abs(f - model) > 1e-9 * model)
        return fail(w + " " + quote_input(v) + " differs from the model " + m.name + " (" +
                    (m.moe ? shown : "no MoE") + ")");
    } else if (w == "--mtp-loss-scaling-factor") {
      char* end = nullptr;
      double f = std::strtod(v.c_str(), &end);
      if (*end != '\0' || !(f >= 0 && f <= 1000))
        return fail(w + " " + quote_input(v) + " (valid: a number from 0 to 1000)");
      t.mtp_loss_scale = f;
    } else if (w == "--moe-expert-capacity-factor") {
      char* end = nullptr;
      double f = std::strtod(v.c_str(), &end);
      if (*end != '\0' || !(f > 0 && f <= 64))
        return fail("--moe-expert-capacity-factor " + quote_input(v) + " (valid: (0, 64])");
      t.moe_capacity_factor = f, c.given.insert("--moe-capacity-factor");
    } else if (w == "--fp8-format") {  // Megatron: fp8 on, the recipe's formats
      if (v != "e4m3" && v != "hybrid")
        return fail("--fp8-format " + quote_input(v) + " (valid: e4m3, hybrid)");
      fp8_format = v;
    } else if (w == "--fp8-recipe") {  // Megatron's default: delayed
      if (v == "mxfp8" || v == "blockwise")
        return fail("--fp8-recipe " + v + " (Transformer Engine's block-scaled float8) changes "
                    "the memory in a way nanoplan does not model yet (valid: delayed, tensorwise)");
      if (v != "delayed" && v != "tensorwise")
        return fail("--fp8-recipe " + quote_input(v) +
                    " (valid: delayed, tensorwise; mxfp8 and blockwise are not modelled)");
      fp8_recipe = v;
    } else if (w == "--cross-entropy-fusion-impl") {
      if (v != "native" && v != "te")
        return fail("--cross-entropy-fusion-impl " + quote_input(v) + " (valid: native, te)");
      ce_impl = v;
    } else if (w == "--transformer-impl") {
      if (v != "transformer_engine")
        return fail("--transformer-impl " + quote_input(v) +
                    ": the megatron profile follows Transformer Engine's layers (valid: "
                    "transformer_engine)");
    } else if (w == "--make-vocab-size-divisible-by") {
      std::optional<int64_t> n = number(1, 1 << 20);
      if (!n)
        return fail("--make-vocab-size-divisible-by " + quote_input(v) +
                    ": expected a whole number from 1 to 1,048,576");
      t.vocab_multiple = *n;
      c.given.insert("--make-vocab-size-divisible-by");
    } else if (w == "--hidden-dropout" || w == "--attention-dropout") {
      char* end = nullptr;
      double p = std::strtod(v.c_str(), &end);
      if (*end != '\0' || p != m.dropout)
        return fail(w + " " + quote_input(v) + " differs from the model " + m.name +
                    "'s dropout (" + std::to_string(m.dropout) + ")");
    } else if (w == "--attention-backend") {  // TE's choice; the fused ones keep flash's set
      if (v == "flash" || v == "fused" || v == "auto")
        t.attention = AttentionImpl::kFlash;
      else if (v == "unfused" || v == "local")
        t.attention = AttentionImpl::kEager;
      else
        return fail("--attention-backend " + quote_input(v) +
                    " (valid: flash, fused, auto, unfused, local)");
      c.given.insert("--attention");
    } else if (w == "--moe-token-dispatcher-type") {  // nanoplan's dispatch: an all-to-all
      if (v != "alltoall")
        return fail("--moe-token-dispatcher-type " + quote_input(v) +
                    " changes the memory in a way nanoplan does not model yet (valid: alltoall)");
    } else if (w == "--moe-token-drop-policy") {  // nanoplan drops by position
      if (v != "position")
        return fail("--moe-token-drop-policy " + quote_input(v) +
                    " is not modelled yet (valid: position)");
    } else if (w == "--cp-comm-type") {  // nanoplan's CP: the all-gather / ring forms
      if (v != "p2p" && v != "all_gather")
        return fail("--cp-comm-type " + quote_input(v) +
                    " changes the memory in a way nanoplan does not model yet (valid: p2p, "
                    "all_gather; a2a is Ulysses-style)");
    } else if (w == "--normalization") {
      if (v != "LayerNorm" && v != "RMSNorm")
        return fail("--normalization " + quote_input(v) + " (valid: LayerNorm, RMSNorm)");
      if ((v == "RMSNorm") != (m.norm == Norm::kRms))
        return fail("--normalization " + v + " differs from the model " + m.name + ", which has " +
                    name_of(m.norm));
    } else if (w == "--position-embedding-type") {
      if (v != "learned_absolute" && v != "rope")
        return fail("--position-embedding-type " + quote_input(v) +
                    " (valid: learned_absolute, rope)");
      if ((v == "rope") != (m.position == PosEmb::kRope))
        return fail("--position-embedding-type " + v + " differs from the model " + m.name +
                    ", which has " + name_of(m.position) + " positions");
    } else if (w == "--max-position-embeddings" ||
               w == "--tokenizer-type" || w == "--seed" ||
               w == "--train-iters" || w == "--lr" || w == "--norm-epsilon" ||
               kNoBytes.count(w)) {
      ignored.push_back(w);  // known; no byte depends on them here
    } else if (w == "--vocab-size") {
      // The model's vocab_size is the tokenizer's: --vocab-size itself, or one more where
      // Megatron's NullTokenizer appends its EOD token (core_r0.14.0).
      std::optional<int64_t> n = number(1, int64_t{1} << 40);
      if (!n || (*n != m.vocab && *n + 1 != m.vocab))
        return fail("--vocab-size " + quote_input(v) + " differs from the model " + m.name +
                    "'s vocab_size " + std::to_string(m.vocab) +
                    " (or that less NullTokenizer's EOD token)");
    } else {
      return fail("unknown Megatron-LM argument " + quote_input(w) + " (" + kRead + ")");
    }
  }
  t.sp = t.sp && t.tp > 1;
  // The distributed optimizer over one data-parallel rank shards nothing: the same bytes as
  // ZeRO-0 (bf16 weights, fp32 gradients, fp32 master weights and moments).
  if (dp * t.cp == 1) t.zero = 0;
  if (global_batch > 0) {
    if (global_batch % (t.micro_batch * dp) != 0)
      return fail("--global-batch-size " + std::to_string(global_batch) +
                  " is not a multiple of --micro-batch-size x dp = " +
                  std::to_string(t.micro_batch * dp));
    t.microbatches = global_batch / (t.micro_batch * dp);
    c.given.insert("--microbatches");
  } else {
    t.microbatches = std::max<int64_t>(1, t.pp);
  }
  // Megatron runs 1F1B; without pipelining (forward_backward_no_pipelining) each micro-batch's
  // forward is followed by its backward, one in flight: 1F1B at pp 1.
  t.pp_schedule = PpSchedule::k1F1B;
  c.given.insert("--pp-schedule");
  if (ce_fusion) t.loss_fusion = ce_impl == "te" ? LossFusion::kTe : LossFusion::kNative;
  if (!fp8_format.empty())
    t.fp8 = fp8_recipe == "tensorwise" ? Fp8Recipe::kTensorwise : Fp8Recipe::kDelayed,
    c.given.insert("--fp8");
  if (t.fp8_param_gather && fp8_format.empty())
    return fail("--fp8-param-gather keeps the parameters in fp8 and needs --fp8-format");
  if (t.fp8_param_gather && !distributed_optimizer)  // Megatron's arguments.py asserts it
    return fail("--fp8-param-gather needs --use-distributed-optimizer");
  c.given.insert("--cross-entropy-fusion");
  if (vpp_chunks > 0) {  // the chunk count; nanoplan reads the even split only
    if (vpp_layers > 0)
      return fail("--num-virtual-stages-per-pipeline-rank and "
                  "--num-layers-per-virtual-pipeline-stage exclude each other (as in Megatron)");
    if (first_layers > 0 || last_layers > 0)
      return fail("--num-virtual-stages-per-pipeline-rank with --decoder-first/last-pipeline-num-"
                  "layers (Megatron's uneven interleaved split) is not modelled yet");
    if (m.layers % (vpp_chunks * t.pp) != 0)
      return fail("--num-virtual-stages-per-pipeline-rank " + std::to_string(vpp_chunks) + ": " +
                  std::to_string(m.layers) + " layers do not split into pp x " +
                  std::to_string(vpp_chunks) + " equal chunks (valid: a count that does)");
    vpp_layers = m.layers / (vpp_chunks * t.pp);
  }
  if (vpp_layers > 0) {
    if (m.layers % (vpp_layers * t.pp) != 0)
      return fail("--num-layers-per-virtual-pipeline-stage " + std::to_string(vpp_layers) +
                  " does not split " + std::to_string(m.layers) + " layers over pp " +
                  std::to_string(t.pp));
    t.virtual_stages = m.layers / (vpp_layers * t.pp);
    if (t.virtual_stages > 1) t.pp_schedule = PpSchedule::kInterleaved;
    c.given.insert("--virtual-stages");
  }
  if ((first_layers > 0 || last_layers > 0) && (t.pp == 1 || vpp_layers > 0))
    return fail("--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size > 1 "
                "without --num-layers-per-virtual-pipeline-stage");
  if (vpp_layers == 0 && t.pp > 1) {
    // Megatron splits the layers evenly over the stages, the first and the last stage's counts
    // given apart (--decoder-first/last-pipeline-num-layers).
    int64_t rest = m.layers - first_layers - last_layers;
    int64_t middle = t.pp - (first_layers > 0) - (last_layers > 0);
    if (rest < 0 || (middle == 0 ? rest != 0 : rest % middle != 0 || rest / middle == 0))
      return fail(std::to_string(m.layers) + " layers do not split evenly over pp " +
                  std::to_string(t.pp) +
                  (first_layers || last_layers
                       ? " with the first and last stages' counts given"
                       : "; give --decoder-first-pipeline-num-layers and/or "
                         "--decoder-last-pipeline-num-layers"));
    t.stage_layers.assign(t.pp, middle ? rest / middle : 0);
    if (first_layers > 0) t.stage_layers.front() = first_layers;
    if (last_layers > 0) t.stage_layers.back() = last_layers;
    c.given.insert("--partition");
  }
  if (recompute_activations) granularity = "selective";  // Megatron's validate_args, any order
  // Megatron's q, k, v bias: add_bias_linear or add_qkv_bias.
  if ((disable_bias || add_qkv_bias) && m.qkv_bias != (!disable_bias || add_qkv_bias))
    return fail(std::string(add_qkv_bias ? "--add-qkv-bias" : "--disable-bias-linear") +
                " differs from the model " + m.name + ", which has " +
                (m.qkv_bias ? "a qkv bias" : "no qkv bias"));
  if (granularity == "full" && recompute_layers == 0) granularity.clear();  // no layer
  if (granularity == "selective") t.recompute = Recompute::kSelective;
  if (granularity == "full") {
    // uniform with 1 layer per group, or block over every layer of a stage: every layer; fewer
    // blocks are per-layer choices the auto planner makes (--recompute auto).
    int64_t per_stage = t.stage_layers.empty()
                            ? m.layers / t.pp
                            : *std::max_element(t.stage_layers.begin(), t.stage_layers.end());
    if (method == "block" && recompute_layers > 0 && recompute_layers < per_stage)
      return fail("--recompute-method block --recompute-num-layers " +
                  std::to_string(recompute_layers) + " recomputes some layers of each stage; "
                  "nanoplan reads full recompute of every layer (use --recompute auto for "
                  "per-layer plans)");
    t.recompute = Recompute::kFull;
  }
  c.given.insert("--recompute");
  // Megatron's sequence-parallel layers gather again in backward, always.
  t.tp_recompute_allgather = true;
  c.given.insert("--tp-recompute-allgather");
  if (!ignored.empty()) {
    std::string list;
    for (const std::string& w : ignored)
      if (list.find(w + ",") == std::string::npos && !list.ends_with(w))
        list += (list.empty() ? "" : ", ") + w;
    c.notes.push_back("--megatron-args: ignored, as no byte depends on them here: " + list);
  }
  return c;
}

}  // namespace np
