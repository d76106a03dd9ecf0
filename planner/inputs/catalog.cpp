// Loading and resolving catalog entries; parse errors carry file:line.
#include "planner/inputs/catalog.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "planner/inputs/json_reader.hpp"
#include "planner/inputs/read_file.hpp"
#include "planner/inputs/toml_model.hpp"
#include "planner/inputs/units.hpp"

namespace np {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return out;
}

Result<std::string> read_file(const std::string& path) {
  return read_text_file(path);
}

Result<toml::table> parse_toml(const std::string& path) {
  Result<std::string> text = read_file(path);
  if (!text) return text.error();
  return parse_toml_text(*text, path);
}

// head_dim when the file does not give it: hidden / heads, which must divide exactly.
std::optional<std::string> default_head_dim(ModelSpec& m, const char* heads_key,
                                            const char* hidden_key) {
  if (m.heads <= 0) return std::nullopt;  // validate_model names the bad head count
  if (m.hidden % m.heads != 0)
    return std::string(heads_key) + " " + std::to_string(m.heads) + " does not divide " +
           hidden_key + " " + std::to_string(m.hidden) +
           " (valid: a head count that divides it, or head_dim given explicitly)";
  m.head_dim = m.hidden / m.heads;
  return std::nullopt;
}

}  // namespace

Result<toml::table> parse_toml_text(const std::string& text, const std::string& path) {
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    std::string what(e.description());
    for (char& c : what)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    return make_error(path + ":" + std::to_string(e.source().begin.line) + ":" +
                      std::to_string(e.source().begin.column) + ": malformed TOML: " + what);
  }
}

Result<ModelSpec> load_model_toml(const std::string& path) {
  Result<std::string> text = read_file(path);
  if (!text) return text.error();
  return model_toml_from_text(*text, path);
}

Result<ModelSpec> model_toml_from_text(const std::string& text, const std::string& path) {
  Result<toml::table> parsed = parse_toml_text(text, path);
  if (!parsed) return parsed.error();
  return model_from_table(*parsed, path);
}

Result<ModelSpec> model_from_table(const toml::table& table, const std::string& path) {
  const toml::table* parsed = &table;
  TomlReader r(table, path);
  r.only({"name", "display_name", "source", "aliases", "hidden_size", "intermediate_size",
          "num_layers", "num_heads", "num_kv_heads", "head_dim", "vocab_size",
          "max_position_embeddings", "norm", "activation", "position_embedding", "qkv_bias",
          "qk_norm", "linear_bias", "tie_word_embeddings", "dropout", "expected_parameters",
          "moe", "mla", "mtp_layers"});
  ModelSpec m;
  m.name = r.string("name");
  m.display_name = r.string("display_name", m.name);
  m.source = r.string("source", "");
  m.aliases = r.strings("aliases");
  m.hidden = r.integer("hidden_size");
  m.ffn = r.integer("intermediate_size");
  m.layers = r.integer("num_layers");
  m.heads = r.integer("num_heads");
  m.kv_heads = r.integer("num_kv_heads", m.heads);
  m.head_dim = r.integer("head_dim", 0);
  m.vocab = r.integer("vocab_size");
  m.max_positions = r.integer("max_position_embeddings");
  m.norm = r.choice("norm", Norm::kRms);
  m.activation = r.choice("activation", Activation::kSwiGlu);
  m.position = r.choice("position_embedding", PosEmb::kRope);
  m.qkv_bias = r.boolean("qkv_bias", false);
  m.qk_norm = r.boolean("qk_norm", false);
  m.linear_bias = r.boolean("linear_bias", false);
  m.tie_embeddings = r.boolean("tie_word_embeddings", false);
  m.dropout = r.number("dropout", 0.0);
  m.mtp_layers = r.integer("mtp_layers", 0);
  if (parsed->get("expected_parameters")) m.expected_parameters = r.integer("expected_parameters");
  if (auto e = r.error()) return *e;
  if (!parsed->get("head_dim") && !parsed->get("mla")) {
    if (auto e = default_head_dim(m, "num_heads", "hidden_size")) return make_error(path + ": " + *e);
  }
  for (const char* section : {"moe", "mla"})
    if (const toml::node* n = parsed->get(section); n && !n->is_table())
      return make_error(path + ":" + std::to_string(n->source().begin.line) + ": " + section +
                        ": expected a table ([" + section + "]), got " + shown(*n));
  if (const toml::table* mla = parsed->get_as<toml::table>("mla")) {
    TomlReader ar(*mla, path, "mla.");
    ar.only({"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"});
    m.mla = MlaSpec{ar.integer("q_lora_rank", 0), ar.integer("kv_lora_rank"),
                    ar.integer("qk_nope_head_dim"), ar.integer("qk_rope_head_dim"),
                    ar.integer("v_head_dim")};
    if (auto e = ar.error()) return *e;
    // Each head's q and k are the content and RoPE parts together; every head has its own k, v.
    if (!parsed->get("head_dim")) m.head_dim = m.mla->qk_nope_head_dim + m.mla->qk_rope_head_dim;
  }
  if (const toml::table* moe = parsed->get_as<toml::table>("moe")) {
    TomlReader mr(*moe, path, "moe.");
    mr.only({"num_experts", "top_k", "expert_intermediate_size",
             "shared_expert_intermediate_size", "shared_expert_gate", "dense_layers",
             "expert_bias", "score_function", "norm_topk_prob", "groups", "topk_groups",
             "routed_scaling_factor"});
    m.moe = MoeSpec{
        mr.integer("num_experts"), mr.integer("top_k"), mr.integer("expert_intermediate_size"),
        mr.integer("shared_expert_intermediate_size", 0), mr.boolean("shared_expert_gate", false),
        mr.boolean("expert_bias", false)};
    // The routing (spec.hpp, RouterSpec), HF's scoring_func, norm_topk_prob, n_group, topk_group
    // and routed_scaling_factor; the defaults are the softmax over the top-k logits.
    RouterSpec& rt = m.moe->router;
    std::string score = mr.string("score_function", "softmax");
    if (score != "softmax" && score != "sigmoid" && !mr.error())
      return make_error(path + ": moe.score_function " + quote_input(score, '"') +
                        " is not supported (valid: softmax, sigmoid)");
    rt.sigmoid = score == "sigmoid";
    rt.normalize = mr.boolean("norm_topk_prob", true);
    rt.groups = mr.integer("groups", 1), rt.topk_groups = mr.integer("topk_groups", 1);
    rt.scaling = mr.number("routed_scaling_factor", 1.0);
    // The layers whose MLP is the dense one (intermediate_size), e.g. DeepSeek's first ones.
    if (moe->contains("dense_layers")) m.dense_layers = mr.list<int64_t>("dense_layers", 0);
    if (auto e = mr.error()) return *e;
  }
  if (auto e = validate_model(m)) return make_error(path + ": " + e->message);
  return m;
}

Result<ModelSpec> hf_model(const nlohmann::json& j, const std::string& path);

Result<ModelSpec> load_hf_config(const std::string& path) {
  Result<std::string> text = read_file(path);
  if (!text) return text.error();
  return hf_config_from_text(*text, path);
}

Result<ModelSpec> hf_config_from_text(const std::string& text, const std::string& path) {
  Result<nlohmann::json> j = parse_json(text, path);
  if (!j) return j.error();
  if (!j->is_object())
    return make_error(path + ":1: a Hugging Face config.json must be a JSON object");
  return hf_config_from_json(*j, path);
}

Result<ModelSpec> hf_config_from_json(const nlohmann::json& j, const std::string& path) {
  try {
    return hf_model(j, path);
  } catch (const std::invalid_argument& e) {
    return make_error(path + ": " + e.what());
  }
}

// The keys of a Hugging Face config.json that size the model; every other key (rope scaling,
// dtypes, token ids, ...) does not change a byte count and is ignored. A key that is present must
// have the right type; `null` counts as absent.
Result<ModelSpec> hf_model(const nlohmann::json& j, const std::string& path) {
  JsonReader r{j, ""};
  auto given = [&](const char* key) { return r.has(key) && !j[key].is_null(); };
  auto count = [&](const char* key, std::optional<int64_t> fallback) -> int64_t {
    if (given(key)) return r.at(key).integer(0, int64_t{1} << 40);
    if (!fallback) throw std::invalid_argument(std::string(key) + ": missing");
    return *fallback;
  };
  auto flag = [&](const char* key, bool fallback) {
    return given(key) ? r.at(key).boolean() : fallback;
  };
  auto text = [&](const char* key, const std::string& fallback) {
    return given(key) ? r.at(key).text() : fallback;
  };
  const std::vector<std::string> types = {"llama", "mistral",  "mixtral",     "qwen2",
                                          "qwen2_moe", "qwen3", "qwen3_moe", "deepseek_v2",
                                          "deepseek_v3"};
  std::string type = text("model_type", "llama");
  if (std::find(types.begin(), types.end(), type) == types.end())
    return make_error(path + ": model_type " + quote_input(type, '"') +
                      " is not supported (valid: llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, "
                      "qwen3_moe, deepseek_v2, deepseek_v3; or write the model as a TOML in the "
                      "catalog schema)");
  const bool qwen3 = type == "qwen3" || type == "qwen3_moe";
  const bool deepseek = type == "deepseek_v2" || type == "deepseek_v3";
  ModelSpec m;
  // The name comes from the folder (or the file): characters a name may not hold become '_'.
  m.name = std::filesystem::path(path).parent_path().filename().string();
  if (m.name.empty()) m.name = std::filesystem::path(path).stem().string();
  for (char& c : m.name)
    if (!is_model_name(std::string_view(&c, 1))) c = '_';
  if (m.name.size() > 128) m.name.resize(128);
  if (m.name.empty()) m.name = "config";
  m.display_name = text("_name_or_path", m.name);
  bool printable = m.display_name.size() <= 128 &&
                   std::all_of(m.display_name.begin(), m.display_name.end(), [](char c) {
                     return static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f;
                   });
  if (!printable) m.display_name = m.name;  // a display name only: the folder's name will do
  m.source = path;
  m.hidden = count("hidden_size", std::nullopt);
  m.ffn = count("intermediate_size", std::nullopt);
  m.layers = count("num_hidden_layers", std::nullopt);
  m.heads = count("num_attention_heads", std::nullopt);
  m.kv_heads = count("num_key_value_heads", m.heads);
  m.vocab = count("vocab_size", std::nullopt);
  m.max_positions = count("max_position_embeddings", std::nullopt);
  if (deepseek) {
    // transformers' DeepseekV2Attention / DeepseekV3Attention: q_lora_rank null projects q
    // directly (q_proj), else q_a_proj, q_a_layernorm, q_b_proj; kv_a_proj_with_mqa gives the kv
    // latent and the keys' RoPE part, kv_a_layernorm and kv_b_proj the heads' k content and v.
    // Their head_dim key, where present, is the RoPE part's (for the rotary tables), not a head's.
    m.mla = MlaSpec{count("q_lora_rank", 0), count("kv_lora_rank", std::nullopt),
                    count("qk_nope_head_dim", std::nullopt),
                    count("qk_rope_head_dim", std::nullopt), count("v_head_dim", std::nullopt)};
    m.head_dim = m.mla->qk_nope_head_dim + m.mla->qk_rope_head_dim;
  } else if (given("head_dim")) {
    m.head_dim = count("head_dim", std::nullopt);
  } else if (auto e = default_head_dim(m, "num_attention_heads", "hidden_size")) {
    return make_error(path + ": " + *e);
  }
  m.tie_embeddings = flag("tie_word_embeddings", false);
  // DeepSeek-V3's multi-token prediction modules (num_nextn_predict_layers, as DeepSeek's own
  // configuration_deepseek.py names them; transformers' classes leave them out; absent: none).
  if (deepseek) m.mtp_layers = count("num_nextn_predict_layers", 0);
  m.qkv_bias = flag("attention_bias", type == "qwen2" || type == "qwen2_moe");
  // transformers' Qwen3Attention (and Qwen3MoeAttention) always has q_norm and k_norm.
  m.qk_norm = qwen3;
  m.linear_bias = flag("mlp_bias", false);
  // Every architecture read here has the gated MLP (gate_proj, up_proj, down_proj:
  // transformers' LlamaMLP, MistralMLP, Qwen2MLP and the MoE experts), whatever hidden_act is:
  // the activation does not decide the weights. A GeLU activation makes it GeGLU, whose weights
  // and saved tensors are SwiGLU's (nanoplan's executors compute SiLU there).
  std::string act = text("hidden_act", "silu");
  const std::vector<std::string> acts = {"silu", "swiglu", "gelu", "gelu_new", "gelu_pytorch_tanh",
                                         "gelu_fast", "relu"};
  if (std::find(acts.begin(), acts.end(), act) == acts.end())
    return make_error(path + ": hidden_act " + quote_input(act, '"') +
                      " is not supported (valid: silu, swiglu, gelu, gelu_new, gelu_pytorch_tanh, "
                      "gelu_fast, relu)");
  m.activation = Activation::kSwiGlu;
  int64_t experts = given("num_local_experts") ? count("num_local_experts", 0)
                    : deepseek                 ? count("n_routed_experts", 0)
                                               : count("num_experts", 0);
  // A layer pattern is spelled out below: validate_model's bound on the layers is checked first.
  if (experts > 0 && m.layers > 10000)
    return make_error(path + ": num_hidden_layers " + std::to_string(m.layers) +
                      " is out of range (valid: at most 10000)");
  if (experts > 0 && deepseek) {
    // transformers' DeepseekV2DecoderLayer / DeepseekV3DecoderLayer: layer l has the MoE MLP when
    // l >= first_k_dense_replace and l % moe_layer_freq == 0, else the dense one.
    int64_t first = count("first_k_dense_replace", 0), freq = count("moe_layer_freq", 1);
    if (freq == 0) return make_error(path + ": moe_layer_freq 0 is invalid (valid: 1 or more)");
    for (int64_t l = 0; l < m.layers; ++l)
      if (l < first || l % freq != 0) m.dense_layers.push_back(l);
    if (static_cast<int64_t>(m.dense_layers.size()) == m.layers) experts = 0;  // all dense
  }
  if (experts > 0 && (type == "qwen3_moe" || type == "qwen2_moe")) {
    // The layer pattern of transformers' Qwen2MoeDecoderLayer and Qwen3MoeDecoderLayer: layer l
    // is an MoE layer when it is not in mlp_only_layers and (l + 1) % decoder_sparse_step == 0,
    // else a dense MLP of intermediate_size.
    int64_t step = count("decoder_sparse_step", 1);
    std::vector<int64_t> only;
    if (given("mlp_only_layers"))
      for (size_t i = 0; i < r.at("mlp_only_layers").size(); ++i)
        only.push_back(r.at("mlp_only_layers").at(i).integer(0, m.layers - 1));
    for (int64_t l = 0; l < m.layers; ++l)
      if (std::find(only.begin(), only.end(), l) != only.end() || (l + 1) % step != 0)
        m.dense_layers.push_back(l);
    if (static_cast<int64_t>(m.dense_layers.size()) == m.layers) experts = 0;  // all dense
  }
  if (experts == 0) m.dense_layers.clear();
  if (experts > 0 && deepseek) {
    // DeepSeek's shared experts are one MLP of n_shared_experts x moe_intermediate_size, ungated
    // (DeepseekV3MoE.shared_experts); noaux_tc routing carries the score-correction bias.
    // Absent keys take the defaults of transformers' DeepseekV2Config and DeepseekV3Config.
    const bool v3 = type == "deepseek_v3";
    const std::string method = text("topk_method", v3 ? "noaux_tc" : "greedy");
    int64_t ffn = count("moe_intermediate_size", std::nullopt);
    m.moe = MoeSpec{experts, count("num_experts_per_tok", std::nullopt), ffn,
                    count("n_shared_experts", 0) * ffn, false, method == "noaux_tc"};
    // DeepseekV2MoEGate / DeepseekV3TopkRouter: scoring_func softmax (V2) or sigmoid (V3), the
    // group-limited choice over n_group groups (topk_method group_limited_greedy and noaux_tc; V2
    // scores a group by its largest score where Megatron and V3 sum its top top_k / topk_group,
    // which only changes which experts are chosen), norm_topk_prob, routed_scaling_factor.
    std::string score = text("scoring_func", v3 ? "sigmoid" : "softmax");
    if (score != "softmax" && score != "sigmoid")
      return make_error(path + ": scoring_func " + quote_input(score, '"') +
                        " is not supported (valid: softmax, sigmoid)");
    RouterSpec& rt = m.moe->router;
    rt.sigmoid = score == "sigmoid";
    rt.normalize = flag("norm_topk_prob", v3);
    if (method != "greedy")
      rt.groups = count("n_group", v3 ? 8 : 1), rt.topk_groups = count("topk_group", v3 ? 4 : 1);
    rt.scaling = given("routed_scaling_factor") ? r.at("routed_scaling_factor").number()
                 : v3                           ? 2.5
                                                : 1.0;
  } else if (experts > 0) {
    int64_t shared = count("shared_expert_intermediate_size", 0);
    m.moe = MoeSpec{experts, count("num_experts_per_tok", 2), count("moe_intermediate_size", m.ffn),
                    shared, shared > 0};
    // Mixtral's softmax over the top-k logits; Qwen2-MoE and Qwen3-MoE take the top-k of the
    // softmax over all the experts, renormalised when norm_topk_prob (transformers'
    // Qwen2MoeSparseMoeBlock default false, Qwen3MoeSparseMoeBlock's configs true).
    if (type == "qwen2_moe" || type == "qwen3_moe")
      m.moe->router.normalize = flag("norm_topk_prob", type == "qwen3_moe");
  }
  if (auto e = validate_model(m)) return make_error(path + ": " + e->message);
  return m;
}

Result<std::vector<ModelSpec>> load_model_catalog(const std::string& dir) {
  std::vector<ModelSpec> models;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.path().extension() != ".toml") continue;
    Result<ModelSpec> m = load_model_toml(entry.path().string());
    if (!m) return m.error();
    models.push_back(std::move(*m));
  }
  if (ec) return make_error("cannot read the model catalog " + dir + ": " + ec.message());
  std::sort(models.begin(), models.end(),
            [](const ModelSpec& a, const ModelSpec& b) { return a.name < b.name; });
  return models;
}

namespace {

// [gpu.perf] of a [[gpu]] table (docs/step-times.md, "GPU efficiencies").
Result<GpuPerf> read_gpu_perf(const toml::table& t, const std::string& path,
                              const std::string& gpu) {
  TomlReader r(t, path, "perf.");
  r.only({"source", "gemm", "attention", "attention_fa2", "attention_fa2_source",
          "memory_bytes_per_s", "kernel_overhead_s", "nvlink", "nvlink_source", "measured_on",
          "from", "assumption", "compute_scale"});
  GpuPerf p;
  p.source = r.string("source", "");
  p.measured_on = r.string("measured_on", "");
  p.nvlink_source = r.string("nvlink_source", "");
  p.from = r.string("from", "");
  p.assumption = r.string("assumption", "");
  p.compute_scale = r.number("compute_scale", 1.0);
  p.memory_bytes_per_s = r.number("memory_bytes_per_s", 0.0);
  p.kernel_overhead_s = r.number("kernel_overhead_s", 0.0);
  for (const auto& row : r.rows("gemm", 4)) p.gemm.push_back({row[0], row[1], row[2], row[3]});
  for (const auto& row : r.rows("attention", 4))
    p.attention.push_back({row[0], row[1], row[2], row[3]});
  for (const auto& row : r.rows("attention_fa2", 4))
    p.attention_fa2.push_back({row[0], row[1], row[2], row[3]});
  p.attention_fa2_source = r.string("attention_fa2_source", "");
  const toml::table* nvlink = r.table("nvlink");
  if (auto e = r.error()) return *e;
  auto bad = [&](const std::string& what) {
    return make_error(path + ": GPU " + quote_input(gpu) + ": [gpu.perf] " + what);
  };
  for (const GemmPoint& g : p.gemm)
    if (g.m <= 0 || g.n <= 0 || g.k <= 0 || g.efficiency <= 0 || g.efficiency > 1)
      return bad("gemm rows are [m, n, k, efficiency] with positive sizes and an efficiency in "
                 "(0, 1]");
  for (const auto* rows : {&p.attention, &p.attention_fa2})
    for (const AttentionPoint& a : *rows)
      if (a.seq <= 0 || a.heads <= 0 || a.forward <= 0 || a.backward <= 0 || a.forward > 2 ||
          a.backward > 2)
        return bad(std::string(rows == &p.attention ? "attention" : "attention_fa2") +
                   " rows are [seq, heads, forward, backward] with positive sizes and "
                   "efficiencies in (0, 2] (the causal kernel's work counted as the full s^2 "
                   "product can exceed 1)");
  if (!p.attention_fa2.empty() && p.attention_fa2_source.empty())
    return bad("attention_fa2 needs attention_fa2_source saying where FlashAttention-2's rates "
               "were measured");
  if (p.compute_scale <= 0 || p.compute_scale > 2) return bad("compute_scale must be in (0, 2]");
  if (p.memory_bytes_per_s < 0) return bad("memory_bytes_per_s must be positive");
  if (p.kernel_overhead_s < 0 || p.kernel_overhead_s > 1e-3)
    return bad("kernel_overhead_s must be in [0, 1e-3] seconds");
  if ((!p.from.empty() || !p.measured_on.empty()) && p.assumption.empty())
    return bad("figures measured on another device (from, measured_on) need an assumption "
               "saying why they stand for this GPU");
  if (!p.from.empty() && (!p.gemm.empty() || !p.measured_on.empty()))
    return bad("from = " + quote_input(p.from) + " takes the neighbour's GEMM table: give no "
               "gemm or measured_on of its own");
  if (p.compute_scale != 1 && p.from.empty() && p.measured_on.empty())
    return bad("compute_scale scales figures measured on another device: give measured_on or "
               "from");
  if (p.from.empty())
    for (GemmPoint& g : p.gemm) g.efficiency *= p.compute_scale;
  if (!p.measured_on.empty())
    for (auto* rows : {&p.attention, &p.attention_fa2})
      for (AttentionPoint& a : *rows) a.forward *= p.compute_scale, a.backward *= p.compute_scale;
  if (nvlink) {
    TomlReader c(*nvlink, path, "perf.nvlink.");
    c.only({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"});
    for (const char* kind : {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"}) {
      if (!nvlink->contains(kind)) continue;
      std::vector<double> v = c.numbers(kind, 3);
      if (auto e = c.error()) return *e;
      if (v[0] <= 0)
        return bad(std::string("nvlink.") + kind +
                   " is [bus bytes/s > 0, latency per ring step (s), latency per call (s)]");
      p.nvlink.push_back({kind, {v[0], v[1], v[2]}});
    }
    if (auto e = c.error()) return *e;
  }
  return p;
}

Result<std::vector<GpuSpec>> parse_gpu_catalog(const std::string& path) {
  Result<toml::table> parsed = parse_toml(path);
  if (!parsed) return parsed.error();
  std::vector<GpuSpec> gpus;
  TomlReader top(*parsed, path);
  top.only({"gpu"});
  if (auto e = top.error()) return *e;
  if (const toml::array* arr = parsed->get_as<toml::array>("gpu")) {
    for (const toml::node& n : *arr) {
      const toml::table* t = n.as_table();
      if (!t) return make_error(path + ": [[gpu]] entries must be tables");
      TomlReader r(*t, path);
      r.only({"name", "display_name", "source", "aliases", "memory_bytes", "bf16_dense_flops",
              "hbm_bytes_per_s", "nvlink_bytes_per_s", "perf", "sm_count", "fp8_dense_flops"});
      GpuSpec g{r.string("name"),
                r.string("display_name", ""),
                r.string("source", ""),
                r.strings("aliases"),
                r.integer("memory_bytes"),
                r.number("bf16_dense_flops", 0.0),
                r.number("hbm_bytes_per_s", 0.0),
                r.number("nvlink_bytes_per_s", 0.0),
                {},
                r.integer("sm_count", 0)};
      g.fp8_dense_flops = r.number("fp8_dense_flops", 0.0);
      const toml::table* perf = r.table("perf");
      if (auto e = r.error()) return *e;
      if (g.sm_count < 0)
        return make_error(
            path + ": gpu " + g.name + ": sm_count " + std::to_string(g.sm_count) +
            " is negative (valid: the GPU's streaming multiprocessors, or leave it out)");
      if (g.fp8_dense_flops < 0)
        return make_error(path + ": gpu " + g.name + ": fp8_dense_flops is negative (valid: the "
                          "GPU's dense float8 FLOP/s, or leave it out where it has none)");
      if (perf) {
        Result<GpuPerf> p = read_gpu_perf(*perf, path, g.name);
        if (!p) return p.error();
        g.perf = std::move(*p);
      }
      gpus.push_back(std::move(g));
    }
  }
  return gpus;
}

// [gpu.perf] from = NAME: the neighbour's measured figures, scaled (GpuPerf).
std::optional<Error> derive_gpu_perf(std::vector<GpuSpec>& gpus,
                                     const std::vector<GpuSpec>& catalog) {
  for (GpuSpec& g : gpus) {
    if (g.perf.from.empty()) continue;
    const GpuSpec* n = nullptr;
    for (const GpuSpec& c : catalog)
      if (c.name == g.perf.from && c.name != g.name) n = &c;
    if (!n || !n->perf.from.empty() || n->perf.gemm.empty())
      return make_error("GPU " + quote_input(g.name) + ": [gpu.perf] from = " +
                        quote_input(g.perf.from) +
                        " must name another GPU of the catalog with a GEMM table of its own");
    // The neighbour's table holds its own compute_scale already.
    const double s = g.perf.compute_scale / n->perf.compute_scale;
    for (GemmPoint p : n->perf.gemm) {
      p.efficiency *= s;
      g.perf.gemm.push_back(p);
    }
    if (g.perf.memory_bytes_per_s == 0 && n->perf.memory_bytes_per_s > 0 && n->hbm_bytes_per_s > 0)
      g.perf.memory_bytes_per_s =
          n->perf.memory_bytes_per_s / n->hbm_bytes_per_s * g.hbm_bytes_per_s;
    if (g.perf.source.empty()) g.perf.source = n->perf.source;
    if (g.perf.measured_on.empty())
      g.perf.measured_on = n->perf.measured_on.empty() ? n->name : n->perf.measured_on;
  }
  return std::nullopt;
}

}  // namespace

Result<std::vector<GpuSpec>> load_gpu_catalog(const std::string& path) {
  Result<std::vector<GpuSpec>> gpus = parse_gpu_catalog(path);
  if (!gpus) return gpus;
  const std::vector<GpuSpec> measured = *gpus;
  if (auto e = derive_gpu_perf(*gpus, measured)) return *e;
  return gpus;
}

std::vector<std::string> closest_names(std::string_view name, const std::vector<std::string>& names,
                                       size_t n) {
  auto distance = [](std::string_view a, std::string_view b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      size_t diag = row[0];
      row[0] = i;
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t up = row[j];
        row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
        diag = up;
      }
    }
    return row[b.size()];
  };
  std::string key = lower(name);
  std::vector<std::pair<size_t, std::string>> scored;
  for (const std::string& candidate : names)
    scored.push_back({distance(key, lower(candidate)), candidate});
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && out.size() < n; ++i) out.push_back(scored[i].second);
  return out;
}

namespace {
template <typename T>
Result<T> find_named(const std::vector<T>& catalog, std::string_view name, const char* what,
                     const char* hint) {
  std::string key = lower(name);
  std::vector<std::string> names;
  for (const T& entry : catalog) {
    names.push_back(entry.name);
    if (lower(entry.name) == key) return entry;
    for (const std::string& alias : entry.aliases)
      if (lower(alias) == key) return entry;
  }
  std::string close;
  for (const std::string& c : closest_names(name, names)) close += (close.empty() ? "" : ", ") + c;
  return make_error("unknown " + std::string(what) + " " + quote_input(name) + " (closest: " + close +
                    "; " + hint + ")");
}
}  // namespace

Result<ModelSpec> resolve_model(const std::vector<ModelSpec>& catalog, std::string_view name) {
  std::string s(name);
  if (s.ends_with(".toml")) return load_model_toml(s);
  if (s.ends_with(".json")) return load_hf_config(s);
  Result<ModelSpec> found = find_named(catalog, name, "model",
                                       "'nanoplan models' lists them all, or pass a .toml or "
                                       "config.json path");
  if (found) return found;
  // A fine-tuned variant of a catalog model (-Instruct, -Chat, ...) has the base model's shapes:
  // resolved to it, and its display name says so.
  for (const char* suffix : {"-instruct", "-chat", "-it", "-base", "-hf", "-sft", "-dpo"}) {
    std::string key = lower(name);
    if (!key.ends_with(suffix) || key.size() == std::strlen(suffix)) continue;
    Result<ModelSpec> base = find_named(catalog, name.substr(0, name.size() - std::strlen(suffix)),
                                        "model", "");
    if (!base) continue;
    base->display_name += " (the base model of " + std::string(name) + ": the same weights' shapes)";
    return base;
  }
  return found;
}

Result<GpuSpec> resolve_gpu(const std::vector<GpuSpec>& catalog, std::string_view name) {
  std::string valid;
  for (const GpuSpec& g : catalog) valid += (valid.empty() ? "" : ", ") + g.name;
  return find_named(catalog, name, "GPU", ("valid: " + valid).c_str());
}

bool is_gpu_file(std::string_view arg) {
  return arg.size() > 5 && arg.substr(arg.size() - 5) == ".toml";
}

Result<GpuSpec> gpu_from_arg(const std::string& catalog_path, std::string_view arg) {
  const bool file = is_gpu_file(arg);
  Result<std::vector<GpuSpec>> gpus = file ? parse_gpu_catalog(std::string(arg))
                                           : load_gpu_catalog(catalog_path);
  if (!gpus) return gpus.error();
  if (!file) return resolve_gpu(*gpus, arg);
  if (gpus->size() != 1)
    return make_error("--gpu " + quote_input(arg) +
                      ": a GPU file holds one [[gpu]] table, this one " +
                      std::to_string(gpus->size()));
  if (!gpus->front().perf.from.empty()) {  // derived from a catalog GPU
    Result<std::vector<GpuSpec>> catalog = load_gpu_catalog(catalog_path);
    if (!catalog) return catalog.error();
    if (auto e = derive_gpu_perf(*gpus, *catalog)) return *e;
  }
  return gpus->front();
}

}  // namespace np
