// Configs in and out (planner/inputs/configs.hpp): a nanotron YAML config and Megatron-LM arguments read
// into a model and a setup, bad ones refused with the key named, and the emitted nanotron YAML
// and Megatron flags read back into the same setup where they express the plan.
#include <gtest/gtest.h>

#include "planner/inputs/configs.hpp"
#include "planner/schedule/estimate.hpp"
#include "planner/inputs/read_file.hpp"
#include "planner/report/emit_config.hpp"
#include "test_util.hpp"

namespace np {
namespace {

const std::string kConfig = testing::source_dir() + "/tests/data/nanotron_llama3_8b.yaml";

std::string config_text() {
  return *read_text_file(kConfig);
}

TEST(NanotronConfig, ReadsModelParallelismTokensAndOptimizer) {
  Result<ConfigSetup> c = nanotron_config(config_text(), kConfig);
  ASSERT_TRUE(c.ok()) << c.error().message;
  const ModelSpec& m = *c->model;
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.ffn, 14336);
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.vocab, 128256);
  EXPECT_EQ(count_parameters(m), count_parameters(testing::model("llama-3.1-8b")));
  const TrainSpec& t = c->setup;
  EXPECT_EQ(t.dp, 4);
  EXPECT_EQ(t.tp, 2);
  EXPECT_EQ(t.pp, 2);
  EXPECT_TRUE(t.sp);  // tp_mode: REDUCE_SCATTER
  EXPECT_EQ(t.pp_schedule, PpSchedule::k1F1B);
  EXPECT_EQ(t.micro_batch, 2);
  EXPECT_EQ(t.seq_len, 8192);
  EXPECT_EQ(t.microbatches, 8);
  EXPECT_EQ(t.zero, 1);
  EXPECT_EQ(t.grad_dtype, Dtype::kFp32);
  EXPECT_EQ(t.recompute, Recompute::kNone);
  EXPECT_TRUE(t.tp_recompute_allgather);
  EXPECT_TRUE(c->given.count("--recompute"));
  EXPECT_FALSE(validate_setup(m, t));
}

std::string edited(const std::string& from, const std::string& to) {
  std::string s = config_text();
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

// nanotron's zero_stage above 0 builds its ZeroDistributedOptimizer (ZeRO-1): emitted as 1 with
// a comment for a ZeRO-3 plan.
TEST(EmitConfig, NanotronZeroAboveOneSaysWhatDiffers) {
  TrainSpec t;
  t.dp = 4, t.zero = 3;
  std::string yaml = emit_nanotron(build_schedule(testing::model("llama-3.1-8b"), t));
  EXPECT_NE(yaml.find("  zero_stage: 1\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("# not expressible: ZeRO-3"), std::string::npos) << yaml;
}

// nanotron's Qwen2 MoE (moe_config, as nanotron.nn.moe builds it): experts of
// moe_intermediate_size, a gated shared expert when enabled, MoE only in the layers listed, the
// others dense; its defaults where keys are absent; attention_bias nanotron's false by default.
TEST(NanotronConfig, ReadsQwen2MoeConfig) {
  std::string qwen = edited("    is_llama_config: true\n", "    is_qwen2_config: true\n");
  Result<ConfigSetup> dense = nanotron_config(qwen, kConfig);
  ASSERT_TRUE(dense.ok()) << dense.error().message;
  EXPECT_FALSE(dense->model->qkv_bias);
  EXPECT_FALSE(dense->model->moe);
  auto with = [&](const std::string& moe) {
    std::string s = qwen;
    s.insert(s.find("    vocab_size: 128256\n"), "    moe_config:\n" + moe);
    return nanotron_config(s, kConfig);
  };
  Result<ConfigSetup> all = with(
      "      num_experts: 8\n      top_k: 2\n      moe_intermediate_size: 1024\n"
      "      enable_shared_expert: true\n      shared_expert_intermediate_size: 2048\n");
  ASSERT_TRUE(all.ok()) << all.error().message;
  ASSERT_TRUE(all->model->moe);
  EXPECT_EQ(all->model->moe->num_experts, 8);
  EXPECT_EQ(all->model->moe->expert_ffn, 1024);
  EXPECT_EQ(all->model->moe->shared_ffn, 2048);
  EXPECT_TRUE(all->model->moe->shared_gate);
  EXPECT_TRUE(all->model->dense_layers.empty());
  Result<ConfigSetup> some = with("      layers: [1, 3]\n");  // the defaults: 8 x 1408, top 2
  ASSERT_TRUE(some.ok()) << some.error().message;
  EXPECT_EQ(some->model->moe->expert_ffn, 1408);
  EXPECT_EQ(some->model->moe->shared_ffn, 0);
  ASSERT_EQ(some->model->dense_layers.size(), 30u);
  EXPECT_EQ(some->model->dense_layers[1], 2);
  Result<ConfigSetup> bad = with("      token_dispatcher_type: allgather\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("valid: alltoall"), std::string::npos);
  for (const char* wrong : {"      token_dispatcher_type: [1]\n", "      enable_shared_expert: 3\n",
                            "      num_experts: -2\n", "      layers: 7\n"}) {
    Result<ConfigSetup> w = with(wrong);
    ASSERT_FALSE(w.ok()) << wrong;
    EXPECT_NE(w.error().message.find("model.model_config.moe_config."), std::string::npos)
        << w.error().message;
  }
  std::string llama = config_text();
  llama.insert(llama.find("    vocab_size: 128256\n"), "    moe_config:\n      num_experts: 8\n");
  EXPECT_FALSE(nanotron_config(llama, kConfig).ok());
}

// nanotron's zero_stage above 0 builds its ZeroDistributedOptimizer (ZeRO-1): read so, and said.
TEST(NanotronConfig, ZeroStageAboveOneIsZeroOne) {
  for (int stage : {2, 3}) {
    Result<ConfigSetup> c = nanotron_config(
        edited("  zero_stage: 1\n", "  zero_stage: " + std::to_string(stage) + "\n"), kConfig);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ(c->setup.zero, 1);
    ASSERT_EQ(c->notes.size(), 1u);
    EXPECT_NE(c->notes[0].find("is ZeRO-1 in nanotron"), std::string::npos) << c->notes[0];
  }
  Result<ConfigSetup> one = nanotron_config(config_text(), kConfig);
  ASSERT_TRUE(one.ok());
  EXPECT_TRUE(one->notes.empty());
}

TEST(NanotronConfig, RefusesBadInputNamingTheKey) {
  struct Bad {
    std::string from, to, says;
  };
  for (const Bad& b : {Bad{"  tp: 2\n", "  tp: two\n", "parallelism.tp"},
                       {"  pp_engine: 1f1b\n", "  pp_engine: interleaved\n", "valid: 1f1b, afab"},
                       {"  tp_mode: REDUCE_SCATTER\n", "  tp_mode: SCATTER\n", "REDUCE_SCATTER, ALL_REDUCE"},
                       {"  dtype: bfloat16\n", "  dtype: float32\n", "model.dtype"},
                       {"  zero_stage: 1\n", "  zero_stage: 4\n", "optimizer.zero_stage"},
                       {"  recompute_layer: false\n", "  recompute_layer: maybe\n", "true or false"},
                       {"    hidden_act: silu\n", "    hidden_act: tanh\n", "hidden_act"},
                       {"  model_config:\n", "  model_cfg:\n", "model.model_config: missing"},
                       {"tokens:\n", "tokens: [\n", "not valid YAML"}}) {
    Result<ConfigSetup> c = nanotron_config(edited(b.from, b.to), kConfig);
    ASSERT_FALSE(c.ok()) << b.to;
    EXPECT_NE(c.error().message.find(b.says), std::string::npos) << c.error().message;
    EXPECT_EQ(c.error().message.rfind(kConfig, 0), 0u) << c.error().message;
  }
}

TEST(MegatronArgs, ReadsParallelismBatchAndRecompute) {
  ModelSpec m = testing::model("llama-3.1-70b");
  Result<ConfigSetup> c = megatron_args(
      "--num-layers 80 --hidden-size 8192 --num-attention-heads 64 --tensor-model-parallel-size 8 "
      "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5 "
      "--sequence-parallel --micro-batch-size 1 --global-batch-size 512 --seq-length 4096 "
      "--recompute-granularity selective --use-distributed-optimizer --bf16",
      m, 8);
  ASSERT_TRUE(c.ok()) << c.error().message;
  const TrainSpec& t = c->setup;
  EXPECT_EQ(t.tp, 8);
  EXPECT_EQ(t.pp, 4);
  EXPECT_EQ(t.dp, 8);
  EXPECT_TRUE(t.sp);
  EXPECT_EQ(t.pp_schedule, PpSchedule::kInterleaved);
  EXPECT_EQ(t.virtual_stages, 4);  // 80 layers / (4 stages x 5 layers per chunk)
  EXPECT_EQ(t.microbatches, 64);   // 512 / (1 x 8)
  EXPECT_EQ(t.zero, 1);
  EXPECT_EQ(t.recompute, Recompute::kSelective);
  EXPECT_FALSE(validate_setup(m, t));
  for (auto [args, says] :
       {std::pair{"--num-layers 81", "differs from the model"},
        {"--tensor-model-parallel-size", "needs a value"},
        {"--frobnicate 3", "unknown Megatron-LM argument"},
        {"--micro-batch-size 3 --global-batch-size 512", "not a multiple"},
        {"--recompute-granularity partial", "valid: full, selective"},
        {"--recompute-granularity full --recompute-method block --recompute-num-layers 2 "
         "--pipeline-model-parallel-size 4",
         "recomputes some layers"}}) {
    Result<ConfigSetup> bad = megatron_args(args, m, 8);
    ASSERT_FALSE(bad.ok()) << args;
    EXPECT_NE(bad.error().message.find(says), std::string::npos) << bad.error().message;
  }
}

// What Megatron-LM does with its own arguments: no pipelining holds one micro-batch (1F1B at
// pp 1), layers split evenly over the stages (the first and last counts given apart), the
// cross-entropy fusion and its implementation, --recompute-num-layers 0 recomputing nothing, the
// distributed optimizer over one rank sharding nothing, bf16 gradient reduction.
// Megatron's --moe-layer-freq (an integer, or a list expression of 0/1 per layer) checked
// against the model's dense and MoE layers.
TEST(MegatronArgs, MoeLayerFreqAgreesWithTheModel) {
  ModelSpec m = testing::model("qwen3-30b-a3b");
  EXPECT_TRUE(megatron_args("--moe-layer-freq 1", m, 1).ok());
  m.dense_layers = {0, 1, 2};
  Result<ConfigSetup> ok = megatron_args("--moe-layer-freq ([0]*3+[1]*45)", m, 1);
  EXPECT_TRUE(ok.ok()) << ok.error().message;
  EXPECT_TRUE(megatron_args("--moe-layer-freq [0,0,0]+[1]*45", m, 1).ok());
  // The whole list repeated: 3 dense then 13 MoE, three times, is not this model's; once is.
  EXPECT_TRUE(megatron_args("--moe-layer-freq ([0]*3+[1]*45)*1", m, 1).ok());
  m.dense_layers = {0, 1, 2, 16, 17, 18, 32, 33, 34};
  ok = megatron_args("--moe-layer-freq ([0]*3+[1]*13)*3", m, 1);
  EXPECT_TRUE(ok.ok()) << ok.error().message;
  m.dense_layers = {0, 1, 2};
  for (auto [args, says] :
       {std::pair{"--moe-layer-freq 1", "whose dense layers are 0-2"},
        {"--moe-layer-freq ([0]*2+[1]*46)", "whose dense layers are 0-2"},
        {"--moe-layer-freq ([0]*3+[1]*44)", "valid: a whole number, or a list of 48"},
        {"--moe-layer-freq [2]*48", "valid: a whole number"},
        {"--moe-layer-freq ([0]*3+[1]*13)*3", "whose dense layers are 0-2"},
        {"--moe-layer-freq ([0]*3+[1]*45)*", "valid: a whole number"},
        {"--moe-layer-freq ([0]*3+[1]*45)+1", "valid: a whole number"},
        {"--moe-layer-freq 0", "valid: a whole number"}}) {
    Result<ConfigSetup> c = megatron_args(args, m, 1);
    ASSERT_FALSE(c.ok()) << args;
    EXPECT_NE(c.error().message.find(says), std::string::npos) << c.error().message;
  }
}

// Megatron's multi-head latent attention flags (its DeepSeek-V3 recipe's) checked against the
// model: the latent ranks and head dims, --kv-channels as the v head dim.
TEST(MegatronArgs, MlaFlagsAgreeWithTheModel) {
  const ModelSpec v3 = testing::model("deepseek-v3"), llama = testing::model("llama-3.1-8b");
  const std::string mla =
      "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
      "--qk-pos-emb-head-dim 64 --v-head-dim 128 --kv-channels 128 --num-attention-heads 128 "
      "--moe-layer-freq ([0]*3+[1]*58)";
  Result<ConfigSetup> ok = megatron_args(mla, v3, 1);
  EXPECT_TRUE(ok.ok()) << ok.error().message;
  for (auto [args, model, says] :
       {std::tuple{"--q-lora-rank 1024", &v3, "differs from the model deepseek-v3 (1536)"},
        {"--qk-pos-emb-head-dim 32", &v3, "differs from the model deepseek-v3 (64)"},
        {"--kv-channels 192", &v3, "differs from the model deepseek-v3 (128)"},
        {"--multi-latent-attention", &llama, "not multi-head latent attention"},
        {"--kv-lora-rank 512", &llama, "differs from the model llama-3.1-8b (0)"}}) {
    Result<ConfigSetup> c = megatron_args(args, *model, 1);
    ASSERT_FALSE(c.ok()) << args;
    EXPECT_NE(c.error().message.find(says), std::string::npos) << c.error().message;
  }
}

// Megatron's routing flags (moe_utils.py, topk_routing_with_score_function) against the model's.
TEST(MegatronArgs, RouterFlagsAgreeWithTheModel) {
  const ModelSpec v3 = testing::model("deepseek-v3"), qwen = testing::model("qwen1.5-moe-a2.7b"),
                  mixtral = testing::model("mixtral-8x7b");
  const std::string mla =
      "--multi-latent-attention --moe-router-score-function sigmoid --moe-router-num-groups 8 "
      "--moe-router-group-topk 4 --moe-router-topk-scaling-factor 2.5 "
      "--moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-3";
  Result<ConfigSetup> ok = megatron_args(mla, v3, 1);
  EXPECT_TRUE(ok.ok()) << ok.error().message;
  ok = megatron_args("--moe-router-pre-softmax", qwen, 1);
  EXPECT_TRUE(ok.ok()) << ok.error().message;
  for (auto [args, model, says] :
       {std::tuple{"--moe-router-score-function softmax", &v3, "differs from the model "
                                                              "deepseek-v3 (sigmoid)"},
        {"--moe-router-num-groups 4", &v3, "differs from the model deepseek-v3 (8)"},
        {"--moe-router-group-topk 2", &v3, "differs from the model deepseek-v3 (4)"},
        {"--moe-router-topk-scaling-factor 1", &v3, "differs from the model deepseek-v3 (2.5)"},
        {"--moe-router-score-function tanh", &v3, "(valid: softmax, sigmoid)"},
        {"--moe-router-pre-softmax", &mixtral, "the softmax over the chosen experts' logits"},
        {"--moe-router-enable-expert-bias", &qwen, "no expert score-correction bias"}}) {
    Result<ConfigSetup> c = megatron_args(args, *model, 1);
    ASSERT_FALSE(c.ok()) << args;
    EXPECT_NE(c.error().message.find(says), std::string::npos) << c.error().message;
  }
}

// Multi-token prediction: none unless --mtp-num-layers gives the depths (Megatron's default None),
// whatever the model's config trained with; the loss scale read; bad values named.
TEST(MegatronArgs, MtpLayers) {
  const ModelSpec v3 = testing::model("deepseek-v3");
  Result<ConfigSetup> c = megatron_args("--micro-batch-size 1", v3, 1);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(mtp_depths(v3, c->setup), 0);
  c = megatron_args("--mtp-num-layers 2 --mtp-loss-scaling-factor 0.3", v3, 1);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(mtp_depths(v3, c->setup), 2);
  EXPECT_EQ(c->setup.mtp_loss_scale, 0.3);
  EXPECT_TRUE(c->given.count("--mtp-layers"));
  for (auto [args, says] : {std::pair{"--mtp-num-layers 17", "expected a whole number from 0 to 16"},
                            {"--mtp-num-layers x", "expected a whole number from 0 to 16"},
                            {"--mtp-loss-scaling-factor -1", "(valid: a number from 0 to 1000)"}}) {
    Result<ConfigSetup> bad = megatron_args(args, v3, 1);
    ASSERT_FALSE(bad.ok()) << args;
    EXPECT_NE(bad.error().message.find(says), std::string::npos) << bad.error().message;
  }
}

TEST(MegatronArgs, ReadsWhatMegatronDoes) {
  ModelSpec m = testing::model("llama-3.1-8b");  // 32 layers
  auto read = [&](const std::string& args, int64_t dp) {
    Result<ConfigSetup> c = megatron_args(args, m, dp);
    EXPECT_TRUE(c.ok()) << args << ": " << c.error().message;
    return c.ok() ? c->setup : TrainSpec{};
  };
  TrainSpec t = read("--micro-batch-size 1 --global-batch-size 64 --use-distributed-optimizer", 8);
  EXPECT_EQ(t.pp_schedule, PpSchedule::k1F1B);
  EXPECT_EQ(t.microbatches, 8);
  EXPECT_EQ(in_flight(t.pp_schedule, 0, t.pp, t.microbatches, t.virtual_stages), 1);
  EXPECT_EQ(t.zero, 1);
  EXPECT_EQ(read("--pipeline-model-parallel-size 4", 2).stage_layers,
            (std::vector<int64_t>{8, 8, 8, 8}));
  EXPECT_EQ(read("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 5 "
                 "--decoder-last-pipeline-num-layers 9",
                 2)
                .stage_layers,
            (std::vector<int64_t>{5, 9, 9, 9}));
  EXPECT_EQ(read("--cross-entropy-loss-fusion --cross-entropy-fusion-impl te", 2).loss_fusion,
            LossFusion::kTe);
  EXPECT_EQ(read("--cross-entropy-loss-fusion", 2).loss_fusion, LossFusion::kNative);
  EXPECT_EQ(read("--cross-entropy-fusion-impl te", 2).loss_fusion, LossFusion::kNone);
  EXPECT_EQ(read("--recompute-granularity full --recompute-method block --recompute-num-layers 0",
                 2)
                .recompute,
            Recompute::kNone);
  EXPECT_EQ(read("--use-distributed-optimizer", 1).zero, 0);
  // The tokenizer's size, or one less where NullTokenizer appends EOD (the model's 128256).
  EXPECT_EQ(read("--vocab-size 128256", 2).impl, Impl::kMegatron);
  EXPECT_EQ(read("--vocab-size 128255", 2).impl, Impl::kMegatron);
  EXPECT_EQ(read("--grad-reduce-in-bf16", 2).grad_dtype, Dtype::kBf16);
  // Gradient-accumulation fusion and the dataloader's mask: on unless switched off, as Megatron.
  EXPECT_TRUE(read("--use-distributed-optimizer", 2).grad_accum_fusion);
  EXPECT_FALSE(read("--no-gradient-accumulation-fusion", 2).grad_accum_fusion);
  EXPECT_TRUE(read("--mock-data", 2).dataloader_mask);
  EXPECT_FALSE(read("--no-create-attention-mask-in-dataloader", 2).dataloader_mask);
  // Flags no byte depends on here.
  TrainSpec quiet = read("--deterministic-mode --lr-decay-iters 320000 --ckpt-format torch_dist "
                         "--log-memory-to-tensorboard --eval-iters 10",
                         2);
  EXPECT_EQ(quiet.zero, 0);
  EXPECT_FALSE(quiet.overlap_grad_reduce || quiet.overlap_param_gather);
  // The overlapped reductions: the step time's (they work in the buffers in place).
  TrainSpec overlap =
      read("--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather", 2);
  EXPECT_TRUE(overlap.overlap_grad_reduce && overlap.overlap_param_gather);
  EXPECT_EQ(overlap.zero, 1);
  // Without the distributed optimizer, the setup's validation refuses it, as Megatron's does.
  std::optional<Error> no_dist =
      validate_setup(m, read("--overlap-grad-reduce --overlap-param-gather", 2));
  ASSERT_TRUE(no_dist.has_value());
  EXPECT_NE(no_dist->message.find("needs --zero 1 or more"), std::string::npos)
      << no_dist->message;
  // A blended --data-path takes its words up to the next flag; --recompute-activations wins over
  // a granularity given after it, as in Megatron.
  EXPECT_EQ(read("--data-path 0.3 /a 0.7 /b --micro-batch-size 2", 2).micro_batch, 2);
  EXPECT_EQ(read("--recompute-activations --recompute-granularity full", 2).recompute,
            Recompute::kSelective);
  // Qwen2's biases as Megatron spells them: no linear bias, a qkv bias.
  {
    ModelSpec qwen = testing::model("qwen2.5-7b");
    Result<ConfigSetup> ok = megatron_args("--disable-bias-linear --add-qkv-bias", qwen, 2);
    EXPECT_TRUE(ok.ok()) << ok.error().message;
    Result<ConfigSetup> no_qkv = megatron_args("--disable-bias-linear", qwen, 2);
    ASSERT_FALSE(no_qkv.ok());
    EXPECT_NE(no_qkv.error().message.find("which has a qkv bias"), std::string::npos)
        << no_qkv.error().message;
  }
  EXPECT_EQ(read("--swiglu --normalization RMSNorm --position-embedding-type rope "
                 "--disable-bias-linear --untie-embeddings-and-output-weights "
                 "--group-query-attention --no-position-embedding",
                 2)
                .impl,
            Impl::kMegatron);
  EXPECT_TRUE(quiet.grad_accum_fusion);
  EXPECT_EQ(read("--hidden-dropout 0.0 --transformer-impl transformer_engine "
                 "--make-vocab-size-divisible-by 128 --mock-data --use-mcore-models",
                 2)
                .impl,
            Impl::kMegatron);
  for (auto [args, says] :
       {std::pair{"--pipeline-model-parallel-size 3", "do not split evenly over pp 3"},
        {"--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 31",
         "do not split evenly"},
        {"--cross-entropy-fusion-impl triton", "valid: native, te"},
        {"--transformer-impl local", "valid: transformer_engine"},
        {"--make-vocab-size-divisible-by 0", "expected a whole number from 1"},
        {"--hidden-dropout 0.1", "differs from the model"},
        {"--recompute-num-layers -1", "expected a whole number >= 0"},
        {"--decoder-first-pipeline-num-layers 4", "need --pipeline-model-parallel-size > 1"},
        {"--vocab-size 128000", "differs from the model"},
        // A switch nanoplan does not know, followed by a flag: unknown, not "needs a value".
        {"--use-te-rng-tracker --bf16", "unknown Megatron-LM argument '--use-te-rng-tracker'"},
        {"--moe-token-dispatcher-type allgather", "valid: alltoall"},
        // Architecture flags given must be the model's (absent ones: the model decides).
        {"--normalization LayerNorm", "differs from the model"},
        {"--position-embedding-type learned_absolute", "differs from the model"},
        {"--position-embedding-type alibi", "valid: learned_absolute, rope"},
        {"--add-qkv-bias", "differs from the model"},
        {"--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 5 "
         "--decoder-last-pipeline-num-layers 9 --recompute-granularity full --recompute-method "
         "block --recompute-num-layers 8",
         "recomputes some layers"}}) {
    Result<ConfigSetup> bad = megatron_args(args, m, 2);
    ASSERT_FALSE(bad.ok()) << args;
    EXPECT_NE(bad.error().message.find(says), std::string::npos) << bad.error().message;
  }
}

// What a named policy emits reads back into the same setup: nanotron's YAML (with the config's
// model section) and Megatron's flags.
TEST(EmitConfig, NamedPoliciesRoundTrip) {
  Result<ConfigSetup> c = nanotron_config(config_text(), kConfig);
  ASSERT_TRUE(c.ok());
  const std::string model = config_text().substr(0, config_text().find("optimizer:"));
  for (Recompute r : {Recompute::kNone, Recompute::kFull}) {
    TrainSpec t = c->setup;
    t.recompute = r;
    Schedule s = build_schedule(*c->model, t);
    std::string yaml = emit_nanotron(s);
    Result<ConfigSetup> back = nanotron_config(model + yaml, "emitted");
    ASSERT_TRUE(back.ok()) << back.error().message << "\n" << yaml;
    const TrainSpec& b = back->setup;
    EXPECT_EQ(b.tp, t.tp);
    EXPECT_EQ(b.pp, t.pp);
    EXPECT_EQ(b.dp, t.dp);
    EXPECT_EQ(b.sp, t.sp);
    EXPECT_EQ(b.micro_batch, t.micro_batch);
    EXPECT_EQ(b.microbatches, t.microbatches);
    EXPECT_EQ(b.seq_len, t.seq_len);
    EXPECT_EQ(b.zero, t.zero);
    EXPECT_EQ(b.recompute, r);
    EXPECT_EQ(b.pp_schedule, t.pp_schedule);
    EXPECT_EQ(yaml.find("not expressible"), std::string::npos) << yaml;
  }
  ModelSpec m = testing::model("llama-3.1-70b");
  for (Recompute r : {Recompute::kFull, Recompute::kSelective}) {
    TrainSpec t;
    t.tp = 8, t.sp = true, t.pp = 4, t.dp = 2, t.zero = 1, t.microbatches = 8;
    t.pp_schedule = PpSchedule::k1F1B, t.recompute = r;
    t.stage_layers = {20, 20, 20, 20};  // Megatron's even split (nanoplan's balanced one is not)
    t.attention = AttentionImpl::kEager;  // with flash attention, selective keeps the same as none
    t.impl = Impl::kMegatron;
    t.grad_accum_fusion = r == Recompute::kFull;  // off is emitted, and read back
    t.dataloader_mask = r == Recompute::kSelective;
    t.overlap_grad_reduce = true, t.overlap_param_gather = r == Recompute::kFull;
    std::string flags = emit_megatron(build_schedule(m, t));
    std::string line = flags.substr(0, flags.find('\n'));
    Result<ConfigSetup> back = megatron_args(line, m, 2);
    ASSERT_TRUE(back.ok()) << back.error().message << "\n" << flags;
    EXPECT_EQ(back->setup.recompute, r) << flags;
    EXPECT_EQ(back->setup.microbatches, 8);
    EXPECT_EQ(back->setup.zero, 1);
    EXPECT_EQ(back->setup.stage_layers, (std::vector<int64_t>{20, 20, 20, 20}));
    EXPECT_EQ(back->setup.grad_accum_fusion, t.grad_accum_fusion) << flags;
    EXPECT_EQ(back->setup.dataloader_mask, t.dataloader_mask) << flags;
    EXPECT_TRUE(back->setup.overlap_grad_reduce) << flags;
    EXPECT_EQ(back->setup.overlap_param_gather, t.overlap_param_gather) << flags;
    if (r == Recompute::kSelective) {
      EXPECT_NE(flags.find("--recompute-granularity selective --recompute-modules core_attn\n"),
                std::string::npos)
          << flags;
      EXPECT_EQ(flags.find("recomputes more"), std::string::npos) << flags;
    }
  }
}

// Every emitted Megatron config reads back into the same setup and the same peak, or says in a
// comment what differs: across pp, virtual stages, ZeRO, recompute and splits.
TEST(EmitConfig, MegatronRoundTripsOrSaysWhatDiffers) {
  ModelSpec m = testing::model("llama-3.1-8b");  // 32 layers
  struct Case {
    int64_t pp, chunks;
    int zero;
    Recompute rc;
    std::vector<int64_t> split;
    const char* differs;  // the comment expected, "" when it must read back exactly
  };
  for (const Case& k : {Case{2, 1, 1, Recompute::kNone, {}, ""},
                        Case{4, 2, 1, Recompute::kFull, {}, ""},
                        Case{4, 4, 0, Recompute::kNone, {}, ""},
                        Case{4, 3, 1, Recompute::kNone, {}, "are not all equal"},
                        Case{4, 1, 1, Recompute::kNone, {7, 9, 9, 7}, ""},
                        Case{4, 1, 1, Recompute::kNone, {8, 7, 9, 8}, "middle stages"},
                        Case{1, 1, 3, Recompute::kNone, {}, "ZeRO-3"},
                        Case{1, 1, 2, Recompute::kFull, {}, "ZeRO-2"}}) {
    TrainSpec t;
    t.tp = 2, t.sp = true, t.pp = k.pp, t.dp = 2, t.zero = k.zero, t.microbatches = 2 * k.pp;
    if (k.pp == 1) t.pp_schedule = PpSchedule::k1F1B;
    t.impl = Impl::kMegatron, t.recompute = k.rc, t.stage_layers = k.split;
    t.pp_schedule = k.chunks > 1 ? PpSchedule::kInterleaved : PpSchedule::k1F1B;
    t.virtual_stages = k.chunks;
    if (auto e = validate_setup(m, t)) FAIL() << e->message;
    Schedule s = build_schedule(m, t);
    std::string flags = emit_megatron(s);
    std::string line = flags.substr(0, flags.find('\n'));
    std::string what = "pp " + std::to_string(k.pp) + " v " + std::to_string(k.chunks) + ": " + flags;
    if (*k.differs) {
      EXPECT_NE(flags.find("# not expressible"), std::string::npos) << what;
      EXPECT_NE(flags.find(k.differs), std::string::npos) << what;
      continue;
    }
    EXPECT_EQ(flags.find("# "), std::string::npos) << what;
    Result<ConfigSetup> back = megatron_args(line, m, t.dp);
    ASSERT_TRUE(back.ok()) << back.error().message << "\n" << what;
    const TrainSpec& b = back->setup;
    EXPECT_EQ(b.pp, t.pp) << what;
    EXPECT_EQ(b.pp_schedule, t.pp_schedule) << what;
    EXPECT_EQ(b.virtual_stages, t.virtual_stages) << what;
    EXPECT_EQ(b.zero, t.zero) << what;
    EXPECT_EQ(b.recompute, t.recompute) << what;
    EXPECT_EQ(b.microbatches, t.microbatches) << what;
    if (!t.stage_layers.empty()) EXPECT_EQ(b.stage_layers, t.stage_layers) << what;
    TrainSpec again = b;
    again.tp = t.tp, again.sp = t.sp;  // emitted too; the peak must agree
    EXPECT_EQ(estimate(m, again, {}, {}).peak_bytes, estimate(m, t, {}, {}).peak_bytes) << what;
  }
}

}  // namespace
}  // namespace np
