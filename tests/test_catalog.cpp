// The model and GPU catalogs: exact parameter counts against public figures, aliases, the
// Hugging Face config.json path, and file:line errors for malformed files.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "planner/inputs/catalog.hpp"
#include "planner/graph/graph.hpp"
#include "test_util.hpp"

namespace np {
namespace {

using testing::catalog;
using testing::model;

void write(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(Catalog, HasTheIssueModels) {
  for (const char* name :
       {"llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3.1-8b", "llama-3.1-70b",
        "llama-3.1-405b", "qwen2.5-7b", "qwen2.5-72b", "mixtral-8x7b", "qwen1.5-moe-a2.7b",
        "gpt-22b", "gpt3-175b", "gpt-530b", "gpt-1t", "qwen3-8b", "qwen3-32b", "qwen3-30b-a3b",
        "qwen3-235b-a22b", "deepseek-v3", "deepseek-v2-lite"})
    EXPECT_TRUE(resolve_model(catalog(), name).ok()) << name;
}

// Public exact counts (the models' Hugging Face safetensors totals), as in the issue's table.
TEST(ParameterCount, IssueTable) {
  EXPECT_EQ(count_parameters(model("llama-3.1-70b")), 70'553'706'496);
  EXPECT_EQ(count_parameters(model("llama-2-7b")), 6'738'415'616);
  EXPECT_EQ(count_parameters(model("mixtral-8x7b")), 46'702'792'704);
}

TEST(ParameterCount, EveryModelMatchesItsPublicFigure) {
  int checked = 0;
  for (const ModelSpec& m : catalog()) {
    if (!m.expected_parameters) continue;
    EXPECT_EQ(count_parameters(m), *m.expected_parameters) << m.name;
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// Qwen3: Qwen3-8B's exact count (its safetensors total, the figure issue 31 gives) and the
// model cards' rounded totals and activated counts of the others (huggingface.co/Qwen/Qwen3-32B:
// 32.8B; Qwen3-30B-A3B: 30.5B, 3.3B activated; Qwen3-235B-A22B: 235B, 22B activated). Each
// layer's q/k norms are 2 x head_dim weights: 256 here.
TEST(ParameterCount, Qwen3MatchesItsModelCards) {
  EXPECT_EQ(count_parameters(model("qwen3-8b")), 8'190'735'360);
  auto billions = [](int64_t n, double unit) {
    return std::round(static_cast<double>(n) / 1e9 / unit) * unit;
  };
  // Activated: the experts' weights counted top_k of num_experts.
  auto activated = [](const ModelSpec& m) {
    TrainSpec t;
    t.seq_len = 1;
    int64_t experts = build_layer(m, t).weight_elements(true);
    return count_parameters(m) -
           m.layers * (experts - experts / m.moe->num_experts * m.moe->top_k);
  };
  EXPECT_DOUBLE_EQ(billions(count_parameters(model("qwen3-32b")), 0.1), 32.8);
  EXPECT_DOUBLE_EQ(billions(count_parameters(model("qwen3-30b-a3b")), 0.1), 30.5);
  // 3,353,032,704 activated: the card's 3.3B is this count truncated, not rounded.
  EXPECT_GE(activated(model("qwen3-30b-a3b")), 3'300'000'000);
  EXPECT_LT(activated(model("qwen3-30b-a3b")), 3'400'000'000);
  EXPECT_DOUBLE_EQ(billions(count_parameters(model("qwen3-235b-a22b")), 1), 235);
  EXPECT_DOUBLE_EQ(billions(activated(model("qwen3-235b-a22b")), 1), 22);
  ModelSpec no_norms = model("qwen3-8b");
  no_norms.qk_norm = false;
  EXPECT_EQ(count_parameters(model("qwen3-8b")) - count_parameters(no_norms), 36 * 256);
}

// DeepSeek: V3's 671,026,419,200 without its MTP module (its model card: 671B main model), which
// holds 58 MoE layers x 256 fp32 score-correction biases; V2-Lite's card gives 15.7B. Each MLA
// layer, by hand from the configs: q_a_proj + q_a_layernorm + q_b_proj (or q_proj),
// kv_a_proj_with_mqa + kv_a_layernorm + kv_b_proj, o_proj.
TEST(ParameterCount, DeepSeekMatchesItsModelCards) {
  const ModelSpec v3 = model("deepseek-v3"), lite = model("deepseek-v2-lite");
  EXPECT_EQ(count_parameters(v3), 671'026'419'200);
  EXPECT_EQ(std::round(static_cast<double>(count_parameters(lite)) / 1e8) / 10, 15.7);
  TrainSpec t;
  t.seq_len = 1;
  const int64_t h = 7168, heads = 128;
  const int64_t v3_attn = h * 1536 + 1536 + 1536 * heads * 192 + h * (512 + 64) + 512 +
                          512 * heads * (128 + 128) + heads * 128 * h;
  // The layer: its attention, the two norms, the MLP (dense, or experts + router + shared).
  EXPECT_EQ(build_dense_layer(v3, t).weight_elements(false), v3_attn + 2 * h + 3 * h * 18432);
  BlockGraph moe = build_layer(v3, t);
  EXPECT_EQ(moe.weight_elements(true), 256 * 3 * h * 2048);
  EXPECT_EQ(moe.weight_elements(false), v3_attn + 2 * h + 256 * h + 3 * h * 2048);
  const int64_t lite_attn = 2048 * 16 * 192 + 2048 * (512 + 64) + 512 +
                            512 * 16 * (128 + 128) + 16 * 128 * 2048;
  EXPECT_EQ(build_dense_layer(lite, t).weight_elements(false),
            lite_attn + 2 * 2048 + 3 * 2048 * 10944);
  ModelSpec no_bias = v3;
  no_bias.moe->expert_bias = false;
  EXPECT_EQ(count_parameters(v3) - count_parameters(no_bias), 58 * 256);
}

// GPT-style models have no exact public count; Narayanan et al. 2021 give
// P = 12Lh^2 (1 + 13/(12h) + (V + s)/(12Lh)) = 12Lh^2 + 13Lh + (V + s)h, which omits the final
// LayerNorm (2h). Tied embeddings, learned positions with s = 2048, V = 51200.
TEST(ParameterCount, GptModelsFollowNarayananFormula) {
  for (const char* name : {"gpt-22b", "gpt3-175b", "gpt-530b", "gpt-1t"}) {
    ModelSpec m = model(name);
    int64_t L = m.layers, h = m.hidden, V = m.vocab, s = m.max_positions;
    EXPECT_EQ(count_parameters(m), 12 * L * h * h + 13 * L * h + (V + s) * h + 2 * h) << name;
  }
  EXPECT_EQ(model("gpt3-175b").hidden, 12288);  // Korthikanti et al. Table 3
  EXPECT_EQ(model("gpt-1t").layers, 128);
}

TEST(Resolve, AliasesAreCaseInsensitive) {
  EXPECT_EQ(model("llama-70b").name, "llama-3.1-70b");
  EXPECT_EQ(model("LLAMA-70B").name, "llama-3.1-70b");
  EXPECT_EQ(model("meta-llama/Llama-3.1-70B").name, "llama-3.1-70b");
}

// A fine-tuned variant's name resolves to its base model, and the display name says so.
TEST(Resolve, FineTunedSuffixResolvesToTheBaseModel) {
  for (const char* name : {"meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b-chat"}) {
    auto r = resolve_model(catalog(), name);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->name, "llama-3.1-8b");
    EXPECT_NE(r->display_name.find(std::string("the base model of ") + name), std::string::npos)
        << r->display_name;
  }
  EXPECT_FALSE(resolve_model(catalog(), "-instruct").ok());
  EXPECT_FALSE(resolve_model(catalog(), "no-such-model-instruct").ok());
}

TEST(Resolve, UnknownModelSuggestsClosest) {
  auto r = resolve_model(catalog(), "llama-3.1-7b");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("unknown model 'llama-3.1-7b'"), std::string::npos);
  EXPECT_NE(r.error().message.find("llama-3.1-70b"), std::string::npos);
  EXPECT_NE(r.error().message.find("llama-3.1-8b"), std::string::npos);
}

TEST(LoadToml, MalformedFileNamesLine) {
  std::string path = testing::temp_path("bad.toml");
  write(path, "name = \"x\"\nhidden_size = 64\nnum_layers = = 2\n");
  auto r = load_model_toml(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(path + ":3"), std::string::npos) << r.error().message;
}

TEST(LoadToml, WrongTypeAndMissingKey) {
  std::string path = testing::temp_path("types.toml");
  write(path, "name = \"x\"\nhidden_size = \"big\"\n");
  auto r = load_model_toml(path);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, path + ":2: hidden_size: expected an integer, got \"big\"");
  write(path, "name = \"x\"\n");
  r = load_model_toml(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("missing required key 'hidden_size'"), std::string::npos);
}

// [moe] dense_layers: ascending layer indices of an MoE model, not every layer.
TEST(LoadToml, DenseLayersAreAscendingIndicesOfAnMoeModel) {
  const std::string model =
      "name = \"x\"\nhidden_size = 64\nintermediate_size = 128\nnum_layers = 4\n"
      "num_heads = 4\nvocab_size = 100\nmax_position_embeddings = 64\n";
  const std::string moe = "[moe]\nnum_experts = 4\ntop_k = 2\nexpert_intermediate_size = 32\n";
  auto ok = model_toml_from_text(model + moe + "dense_layers = [0, 3]\n", "m.toml");
  ASSERT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_EQ(ok->dense_layers, (std::vector<int64_t>{0, 3}));
  for (auto [list, says] : {std::pair{"[3, 0]", "ascending layer indices from 0 to 3, got 0"},
                            {"[4]", "ascending layer indices from 0 to 3, got 4"},
                            {"[0, 1, 2, 3]", "lists every layer"}}) {
    auto r = model_toml_from_text(model + moe + "dense_layers = " + list + "\n", "m.toml");
    ASSERT_FALSE(r.ok()) << list;
    EXPECT_NE(r.error().message.find(says), std::string::npos) << r.error().message;
  }
}

// Inputs the fuzz targets found: each gives a one-line error of printable ASCII.
TEST(FuzzFindings, NamesAndNumbers) {
  auto r = model_toml_from_text(
      "name = \"llama-\xc8\x9d\"\nhidden_size = 64\nintermediate_size = 128\nnum_layers = 2\n"
      "num_heads = 4\nvocab_size = 100\nmax_position_embeddings = 64\n",
      "m.toml");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message,
            "m.toml: model name 'llama-\\xc8\\x9d' is invalid (valid: 1 to 128 letters, digits, "
            "'.', '_', '-', '+', '/')");
  auto h = hf_config_from_text("{\"hidden_size\": 4e4444444444}", "config.json");
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.error().message,
            "config.json: malformed JSON: a number is out of range (beyond a 64-bit float)");
  // A table whose quoted name is not ASCII, among the keys the schema refuses.
  auto t = model_toml_from_text("[\"\xdd\xb7\"]", "m.toml");
  ASSERT_FALSE(t.ok());
  const std::string table = "m.toml:1: unknown table [\\xdd\\xb7] (valid: name, ";
  EXPECT_EQ(t.error().message.substr(0, table.size()), table);
}

TEST(LoadToml, InvalidEnumNamesChoices) {
  std::string path = testing::temp_path("enum.toml");
  std::ifstream in(std::string(NANOPLAN_SOURCE_DIR) + "/models/llama-2-7b.toml");
  std::string text((std::istreambuf_iterator<char>(in)), {});
  text.replace(text.find("norm = \"rmsnorm\""), 16, "norm = \"batchnorm\"");
  write(path, text);
  auto r = load_model_toml(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("valid: rmsnorm, layernorm"), std::string::npos)
      << r.error().message;
}

// Llama-2-7B's config.json (https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json).
TEST(LoadHfConfig, Llama2Counts) {
  std::filesystem::create_directories(testing::temp_path("Llama-2-7b-hf"));
  std::string path = testing::temp_path("Llama-2-7b-hf/config.json");
  write(path, R"({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
    "vocab_size": 32000, "max_position_embeddings": 4096, "hidden_act": "silu",
    "tie_word_embeddings": false})");
  auto r = resolve_model(catalog(), path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->name, "Llama-2-7b-hf");
  EXPECT_EQ(count_parameters(*r), 6'738'415'616);
}

// The architecture decides whether the MLP is gated, not the activation: Llama-3.2-1B's shape
// (https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json, 1,235,814,400
// parameters) with a GeLU activation keeps its gate, up and down projections.
TEST(LoadHfConfig, GeluLlamaKeepsItsGatedMlp) {
  for (const char* act : {"silu", "gelu_pytorch_tanh", "gelu"}) {
    std::string path = testing::temp_path(std::string("llama32_1b_") + act + ".json");
    write(path, std::string(R"({"model_type": "llama", "hidden_size": 2048,
      "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
      "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
      "max_position_embeddings": 131072, "tie_word_embeddings": true, "hidden_act": ")") +
                    act + "\"}");
    auto r = load_hf_config(path);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->activation, Activation::kSwiGlu) << act;
    EXPECT_EQ(count_parameters(*r), 1'235'814'400) << act;
  }
  std::string path = testing::temp_path("llama_tanh.json");
  write(path, R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
    "max_position_embeddings": 64, "hidden_act": "tanh"})");
  auto bad = load_hf_config(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("valid: silu"), std::string::npos) << bad.error().message;
}

TEST(LoadHfConfig, MoeAndQwenBias) {
  std::string path = testing::temp_path("qwen_moe.json");
  write(path, R"({"model_type": "qwen2_moe", "hidden_size": 2048, "intermediate_size": 5632,
    "num_hidden_layers": 24, "num_attention_heads": 16, "num_key_value_heads": 16,
    "vocab_size": 151936, "max_position_embeddings": 8192, "hidden_act": "silu",
    "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "tie_word_embeddings": false})");
  auto r = load_hf_config(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->qkv_bias);
  EXPECT_EQ(count_parameters(*r), count_parameters(model("qwen1.5-moe-a2.7b")));
  // Qwen2MoeSparseMoeBlock: norm_topk_prob false unless set, as the catalog's Qwen1.5-MoE.
  EXPECT_FALSE(r->moe->router.normalize);
  EXPECT_FALSE(model("qwen1.5-moe-a2.7b").moe->router.normalize);
  EXPECT_TRUE(model("qwen3-30b-a3b").moe->router.plain());
}

// DeepSeek (transformers' DeepseekV3Config / DeepseekV2Config): MLA's ranks and head dims, the
// dense first layers (first_k_dense_replace, moe_layer_freq), the shared experts as one MLP of
// n_shared_experts x moe_intermediate_size, noaux_tc's bias; head_dim is the RoPE part's there.
TEST(LoadHfConfig, DeepSeekV3AndV2Lite) {
  std::string path = testing::temp_path("deepseek.json");
  const std::string v3 = R"({"model_type": "deepseek_v3", "hidden_size": 7168,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512,
    "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
    "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4, "num_experts_per_tok": 8,
    "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": true,
    "scoring_func": "sigmoid", "num_nextn_predict_layers": 1, "head_dim": 64,
    "max_position_embeddings": 163840, "vocab_size": 129280, "tie_word_embeddings": false,
    "attention_bias": false, "hidden_act": "silu"})";
  write(path, v3);
  auto r = load_hf_config(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_TRUE(r->mla && r->moe);
  EXPECT_EQ(r->head_dim, 192);
  EXPECT_EQ(r->dense_layers, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_TRUE(r->moe->expert_bias);
  EXPECT_EQ(count_parameters(*r), 671'026'419'200);
  // DeepseekV3TopkRouter: sigmoid, the best 4 of 8 groups, renormalised, times 2.5; as the catalog.
  const RouterSpec& rt = r->moe->router;
  EXPECT_TRUE(rt.sigmoid && rt.normalize);
  EXPECT_EQ(rt.groups, 8);
  EXPECT_EQ(rt.topk_groups, 4);
  EXPECT_EQ(rt.scaling, 2.5);
  // One multi-token prediction module, as the catalog's; outside the count. By hand from the
  // config: an MoE layer is MLA (7168 x 1536 + 1536 + 1536 x 128 x 192 + 7168 x 576 + 512 +
  // 512 x 128 x 256 + 128 x 128 x 7168) + 2 x 7168 norms + 256 experts and one shared of
  // 3 x 7168 x 2048 + the 7168 x 256 router + 256 biases; the module adds eh_proj (2 x 7168 x
  // 7168) and enorm, hnorm and its final norm. (The same terms give the 671,026,419,200 above with
  // 3 dense layers of 3 x 7168 x 18432. The model card's 14B for the module is 685B - 671B of the
  // checkpoint, which holds the module's own copies of the embedding and the LM head.)
  EXPECT_EQ(r->mtp_layers, 1);
  EXPECT_EQ(model("deepseek-v3").mtp_layers, 1);
  EXPECT_EQ(mtp_parameters(*r, 1), 11'610'068'224);
  EXPECT_EQ(mtp_parameters(*r, 2), 2 * 11'610'068'224LL);
  const RouterSpec cat = model("deepseek-v3").moe->router;
  EXPECT_TRUE(cat.sigmoid == rt.sigmoid && cat.normalize == rt.normalize &&
              cat.groups == rt.groups && cat.topk_groups == rt.topk_groups &&
              cat.scaling == rt.scaling);
  // moe_layer_freq 2: of the layers from 3 on, the odd ones are dense too.
  std::string every_other = v3;
  every_other.replace(every_other.find("\"moe_layer_freq\": 1"), 19, "\"moe_layer_freq\": 2");
  write(path, every_other);
  r = load_hf_config(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->dense_layers.size(), 3u + 29u);
  EXPECT_EQ(r->dense_layers[3], 3);
  EXPECT_EQ(r->dense_layers[4], 5);
  write(path, R"({"model_type": "deepseek_v2", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_hidden_layers": 27,
    "num_attention_heads": 16, "num_key_value_heads": 16, "n_shared_experts": 2,
    "n_routed_experts": 64, "kv_lora_rank": 512, "q_lora_rank": null, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "greedy",
    "num_experts_per_tok": 6, "moe_layer_freq": 1, "first_k_dense_replace": 1,
    "max_position_embeddings": 163840, "vocab_size": 102400, "tie_word_embeddings": false})");
  r = load_hf_config(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->mla->q_lora_rank, 0);
  EXPECT_FALSE(r->moe->expert_bias);
  // DeepseekV2Config's defaults: softmax over all, not renormalised, one group (greedy), 1.0.
  EXPECT_FALSE(r->moe->router.sigmoid || r->moe->router.normalize);
  EXPECT_EQ(r->moe->router.groups, 1);
  EXPECT_FALSE(model("deepseek-v2-lite").moe->router.normalize);
  EXPECT_EQ(count_parameters(*r), count_parameters(model("deepseek-v2-lite")));
  write(path, R"({"model_type": "deepseek_v3", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
    "max_position_embeddings": 64, "kv_lora_rank": 16, "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8, "v_head_dim": 8, "n_routed_experts": 4, "moe_intermediate_size": 32,
    "num_experts_per_tok": 2, "moe_layer_freq": 0})");
  r = load_hf_config(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("moe_layer_freq 0 is invalid"), std::string::npos)
      << r.error().message;
}

// Qwen3 (transformers' Qwen3Config and Qwen3MoeConfig): q/k norms always, head_dim apart from
// hidden / heads; Qwen3-MoE's layer pattern read (mlp_only_layers and decoder_sparse_step make
// layers dense).
TEST(LoadHfConfig, Qwen3AndQwen3Moe) {
  std::string path = testing::temp_path("qwen3.json");
  write(path, R"({"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
    "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
    "attention_bias": false, "hidden_act": "silu", "tie_word_embeddings": false})");
  auto r = load_hf_config(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->qk_norm);
  EXPECT_FALSE(r->qkv_bias);
  EXPECT_EQ(count_parameters(*r), 8'190'735'360);
  std::string moe = R"({"model_type": "qwen3_moe", "hidden_size": 2048,
    "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
    "max_position_embeddings": 40960, "num_experts": 128, "num_experts_per_tok": 8,
    "moe_intermediate_size": 768, "norm_topk_prob": true, "decoder_sparse_step": 1,
    "tie_word_embeddings": false, "mlp_only_layers": )";
  write(path, moe + "[]}");
  r = load_hf_config(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_TRUE(r->qk_norm);
  EXPECT_EQ(count_parameters(*r), count_parameters(model("qwen3-30b-a3b")));
  const int64_t all_moe = count_parameters(*r);
  write(path, moe + "[0, 5]}");
  r = load_hf_config(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->dense_layers, (std::vector<int64_t>{0, 5}));
  // Two layers' experts and router traded for a dense MLP of intermediate_size 6144.
  const int64_t moe_mlp = 128 * 3 * 2048 * 768 + 128 * 2048, dense_mlp = 3 * 2048 * 6144;
  EXPECT_EQ(count_parameters(*r), all_moe - 2 * moe_mlp + 2 * dense_mlp);
  std::string sparse = moe + "[]}";
  sparse.replace(sparse.find("\"decoder_sparse_step\": 1"), 24, "\"decoder_sparse_step\": 2");
  write(path, sparse);
  r = load_hf_config(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_EQ(r->dense_layers.size(), 24u);  // layers 0, 2, 4, ...: (l + 1) % 2 != 0
  EXPECT_EQ(r->dense_layers[1], 2);
}

TEST(LoadHfConfig, MalformedJsonNamesLine) {
  std::string path = testing::temp_path("bad.json");
  write(path,
        "{\n  \"hidden_size\": 4096,\n  \"num_hidden_layers\": 32,\n  \"vocab_size\": ,\n}\n");
  auto r = load_hf_config(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(path + ":4"), std::string::npos) << r.error().message;
}

TEST(GpuCatalog, ResolvesAliases) {
  auto gpus = load_gpu_catalog(std::string(NANOPLAN_SOURCE_DIR) + "/models/gpus/gpus.toml");
  ASSERT_TRUE(gpus.ok()) << gpus.error().message;
  auto h100 = resolve_gpu(*gpus, "h100-80gb");
  ASSERT_TRUE(h100.ok());
  EXPECT_EQ(h100->memory_bytes, 81559LL << 20);  // nvidia-smi: 81559 MiB
  for (const char* name : {"h200", "a100-80gb", "b200"})
    EXPECT_TRUE(resolve_gpu(*gpus, name).ok()) << name;
  auto bad = resolve_gpu(*gpus, "h1000");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("valid: "), std::string::npos);
}

}  // namespace
}  // namespace np
