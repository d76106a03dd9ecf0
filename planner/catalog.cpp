// Loading and resolving catalog entries; parse errors carry file:line.
#include "planner/catalog.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "planner/toml_model.hpp"

namespace np {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return out;
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error("cannot read " + path + ": no such file or not readable");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Reads typed keys from a TOML table, collecting the first error with file:line.
class TomlReader {
 public:
  TomlReader(const toml::table& t, std::string path) : t_(t), path_(std::move(path)) {}

  int64_t integer(std::string_view key, std::optional<int64_t> fallback = std::nullopt) {
    const toml::node* n = t_.get(key);
    if (!n) return missing(key, fallback);
    if (auto v = n->value<int64_t>()) return *v;
    wrong(*n, key, "an integer");
    return 0;
  }
  double number(std::string_view key, std::optional<double> fallback = std::nullopt) {
    const toml::node* n = t_.get(key);
    if (!n) return fallback ? *fallback : (missing(key, std::optional<int64_t>{}), 0.0);
    if (auto v = n->value<double>()) return *v;
    wrong(*n, key, "a number");
    return 0;
  }
  bool boolean(std::string_view key, bool fallback) {
    const toml::node* n = t_.get(key);
    if (!n) return fallback;
    if (auto v = n->value<bool>()) return *v;
    wrong(*n, key, "true or false");
    return false;
  }
  std::string string(std::string_view key, std::optional<std::string> fallback = std::nullopt) {
    const toml::node* n = t_.get(key);
    if (!n) return fallback ? *fallback : (missing(key, std::optional<int64_t>{}), std::string());
    if (auto v = n->value<std::string>()) return *v;
    wrong(*n, key, "a string");
    return {};
  }
  std::vector<std::string> strings(std::string_view key) {
    std::vector<std::string> out;
    if (const toml::array* a = t_.get_as<toml::array>(key))
      for (const toml::node& n : *a)
        if (auto v = n.value<std::string>()) out.push_back(*v);
    return out;
  }
  template <typename E>
  E choice(std::string_view key, E fallback) {
    if (!t_.get(key)) return fallback;
    std::string text = string(key);
    Result<E> r = parse_enum<E>(key, text);
    if (!r && !error_) error_ = make_error(where(*t_.get(key)) + ": " + r.error().message);
    return r ? *r : fallback;
  }
  std::optional<Error> error() const { return error_; }

 private:
  std::string where(const toml::node& n) const {
    return path_ + ":" + std::to_string(n.source().begin.line);
  }
  int64_t missing(std::string_view key, std::optional<int64_t> fallback) {
    if (fallback) return *fallback;
    if (!error_) error_ = make_error(path_ + ": missing required key '" + std::string(key) + "'");
    return 0;
  }
  void wrong(const toml::node& n, std::string_view key, const char* want) {
    if (!error_) error_ = make_error(where(n) + ": '" + std::string(key) + "' must be " + want);
  }

  const toml::table& t_;
  std::string path_;
  std::optional<Error> error_;
};

Result<toml::table> parse_toml(const std::string& path) {
  Result<std::string> text = read_file(path);
  if (!text) return text.error();
  try {
    return toml::parse(*text, path);
  } catch (const toml::parse_error& e) {
    return make_error(path + ":" + std::to_string(e.source().begin.line) +
                      ": malformed TOML: " + std::string(e.description()));
  }
}

}  // namespace

Result<ModelSpec> load_model_toml(const std::string& path) {
  Result<toml::table> parsed = parse_toml(path);
  if (!parsed) return parsed.error();
  return model_from_table(*parsed, path);
}

Result<ModelSpec> model_from_table(const toml::table& table, const std::string& path) {
  const toml::table* parsed = &table;
  TomlReader r(table, path);
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
  m.head_dim = r.integer("head_dim", m.heads > 0 ? m.hidden / m.heads : 0);
  m.vocab = r.integer("vocab_size");
  m.max_positions = r.integer("max_position_embeddings");
  m.norm = r.choice("norm", Norm::kRms);
  m.activation = r.choice("activation", Activation::kSwiGlu);
  m.position = r.choice("position_embedding", PosEmb::kRope);
  m.qkv_bias = r.boolean("qkv_bias", false);
  m.linear_bias = r.boolean("linear_bias", false);
  m.tie_embeddings = r.boolean("tie_word_embeddings", false);
  m.dropout = r.number("dropout", 0.0);
  if (parsed->get("expected_parameters")) m.expected_parameters = r.integer("expected_parameters");
  if (auto e = r.error()) return *e;
  if (const toml::table* moe = parsed->get_as<toml::table>("moe")) {
    TomlReader mr(*moe, path);
    m.moe = MoeSpec{
        mr.integer("num_experts"), mr.integer("top_k"), mr.integer("expert_intermediate_size"),
        mr.integer("shared_expert_intermediate_size", 0), mr.boolean("shared_expert_gate", false)};
    if (auto e = mr.error()) return *e;
  }
  if (auto e = validate_model(m)) return make_error(path + ": " + e->message);
  return m;
}

Result<ModelSpec> hf_model(const nlohmann::json& j, const std::string& path);

Result<ModelSpec> load_hf_config(const std::string& path) {
  Result<std::string> text = read_file(path);
  if (!text) return text.error();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(*text);
  } catch (const nlohmann::json::parse_error& e) {
    size_t line =
        1 + std::count(text->begin(), text->begin() + std::min(e.byte, text->size()), '\n');
    return make_error(path + ":" + std::to_string(line) + ": malformed JSON: " + e.what());
  }
  if (!j.is_object())
    return make_error(path + ":1: a Hugging Face config.json must be a JSON object");
  const std::string supported = "llama, mistral, mixtral, qwen2, qwen2_moe";
  const std::vector<std::string> types = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe"};
  if (j.contains("model_type") &&
      (!j["model_type"].is_string() ||
       std::find(types.begin(), types.end(), j["model_type"].get<std::string>()) == types.end()))
    return make_error(path + ": model_type " + j["model_type"].dump() +
                      " is not supported (valid: " + supported +
                      "; or write the model as a TOML in the catalog schema)");
  try {
    return hf_model(j, path);
  } catch (const nlohmann::json::exception& e) {
    return make_error(path + ": a field has the wrong type (" + std::string(e.what()) + ")");
  }
}

Result<ModelSpec> hf_model(const nlohmann::json& j, const std::string& path) {
  auto get = [&](const char* key, int64_t fallback) -> int64_t {
    return j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : fallback;
  };
  std::string type = j.value("model_type", std::string("llama"));
  ModelSpec m;
  m.name = std::filesystem::path(path).parent_path().filename().string();
  if (m.name.empty()) m.name = std::filesystem::path(path).stem().string();
  m.display_name = j.value("_name_or_path", m.name);
  m.source = path;
  m.hidden = get("hidden_size", 0);
  m.ffn = get("intermediate_size", 0);
  m.layers = get("num_hidden_layers", 0);
  m.heads = get("num_attention_heads", 0);
  m.kv_heads = get("num_key_value_heads", m.heads);
  m.head_dim = get("head_dim", m.heads > 0 ? m.hidden / m.heads : 0);
  m.vocab = get("vocab_size", 0);
  m.max_positions = get("max_position_embeddings", 0);
  m.tie_embeddings = j.value("tie_word_embeddings", false);
  m.qkv_bias = j.value("attention_bias", type == "qwen2" || type == "qwen2_moe");
  m.linear_bias = j.value("mlp_bias", false);
  std::string act = j.value("hidden_act", std::string("silu"));
  m.activation = act == "silu" || act == "swiglu" ? Activation::kSwiGlu : Activation::kGelu;
  int64_t experts = get("num_local_experts", get("num_experts", 0));
  if (experts > 0) {
    int64_t expert_ffn = get("moe_intermediate_size", m.ffn);
    m.moe = MoeSpec{experts, get("num_experts_per_tok", 2), expert_ffn,
                    get("shared_expert_intermediate_size", 0),
                    get("shared_expert_intermediate_size", 0) > 0};
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

Result<std::vector<GpuSpec>> load_gpu_catalog(const std::string& path) {
  Result<toml::table> parsed = parse_toml(path);
  if (!parsed) return parsed.error();
  std::vector<GpuSpec> gpus;
  if (const toml::array* arr = parsed->get_as<toml::array>("gpu")) {
    for (const toml::node& n : *arr) {
      const toml::table* t = n.as_table();
      if (!t) return make_error(path + ": [[gpu]] entries must be tables");
      TomlReader r(*t, path);
      GpuSpec g{r.string("name"),
                r.string("display_name", ""),
                r.string("source", ""),
                r.strings("aliases"),
                r.integer("memory_bytes"),
                r.number("bf16_dense_flops", 0.0),
                r.number("hbm_bytes_per_s", 0.0),
                r.number("nvlink_bytes_per_s", 0.0)};
      if (auto e = r.error()) return *e;
      gpus.push_back(std::move(g));
    }
  }
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
  return make_error("unknown " + std::string(what) + " '" + std::string(name) +
                    "' (closest: " + close + "; " + hint + ")");
}
}  // namespace

Result<ModelSpec> resolve_model(const std::vector<ModelSpec>& catalog, std::string_view name) {
  std::string s(name);
  if (s.ends_with(".toml")) return load_model_toml(s);
  if (s.ends_with(".json")) return load_hf_config(s);
  return find_named(catalog, name, "model",
                    "'nanoplan models' lists them all, or pass a .toml or config.json path");
}

Result<GpuSpec> resolve_gpu(const std::vector<GpuSpec>& catalog, std::string_view name) {
  std::string valid;
  for (const GpuSpec& g : catalog) valid += (valid.empty() ? "" : ", ") + g.name;
  return find_named(catalog, name, "GPU", ("valid: " + valid).c_str());
}

}  // namespace np
