// Layer graphs and the op table; the saved bytes per layer against Korthikanti et al. 2022
// ("Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198), Table 2,
// for their GPT-style models with eager attention and 16-bit activations.
#include <gtest/gtest.h>

#include "planner/graph/graph.hpp"
#include "planner/graph/policy.hpp"
#include "test_util.hpp"

namespace np {
namespace {

using testing::catalog;
using testing::model;

TEST(OpTable, RowsAreInKindOrder) {
  for (int k = 0; k < static_cast<int>(OpKind::kCount); ++k)
    EXPECT_EQ(static_cast<int>(op_info(static_cast<OpKind>(k)).kind), k)
        << name_of(static_cast<OpKind>(k));
}

TEST(OpTable, ColumnLinearShapesFlopsWeights) {
  const OpInfo& info = op_info(OpKind::kColumnLinear);
  OpAttrs a{.features = 96, .bias = true};
  std::vector<TensorType> in = {{{71, 229}, Dtype::kBf16}};
  auto out = info.infer(a, in);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0].shape, (std::vector<int64_t>{71, 96}));
  EXPECT_EQ(info.flops(a, in), 2.0 * 71 * 229 * 96);
  auto w = info.weights(a, in);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_EQ(w[0].elements(), 96 * 229);
  EXPECT_EQ(w[1].elements(), 96);
  EXPECT_EQ(info.bwd_reads_inputs, 1u);  // dW = dY^T X needs the input
}

TEST(Graph, EveryCatalogModelAndSetupIsWellFormed) {
  for (const ModelSpec& m : catalog()) {
    for (int64_t tp : {1, 2}) {
      for (bool sp : {false, true}) {
        if (sp && tp == 1) continue;
        for (AttentionImpl att : {AttentionImpl::kFlash, AttentionImpl::kEager})
          for (Impl impl : {Impl::kNanotron, Impl::kMegatron, Impl::kFused, Impl::kHf}) {
            TrainSpec t;
            t.tp = tp, t.sp = sp, t.attention = att, t.seq_len = 64, t.impl = impl;
            for (const BlockGraph& g :
                 {build_embedding(m, t), build_layer(m, t), build_head(m, t)}) {
              auto e = check_graph(g);
              EXPECT_FALSE(e) << m.name << " " << name_of(impl) << " " << name_of(g.kind) << ": "
                              << (e ? e->message : "");
            }
          }
      }
    }
  }
}

// Multi-token prediction in the head (Megatron's MultiTokenPredictionLayer): per depth the shifted
// tokens' embedding on the embedding's weights, the norms, the concatenation through eh_proj (its
// features gathered, then scattered to the SP shard), an MoE layer, a final norm, the LM head's
// weights and a loss of weight 0.1 / depths; the next depth reads the previous one's output.
// Full recompute re-runs what Megatron's _checkpointed_forward does, selective the layer's core.
TEST(Graph, MultiTokenPredictionInTheHead) {
  const ModelSpec m = model("deepseek-v3");
  TrainSpec t;
  t.tp = 2, t.sp = true, t.seq_len = 64, t.mtp_layers = 2;
  t.attention = AttentionImpl::kEager;  // selective recompute keeps less than none
  BlockGraph g = build_head(m, t);
  ASSERT_FALSE(check_graph(g));
  auto op = [&](const std::string& name) -> const GraphOp& {
    for (const GraphOp& o : g.ops)
      if (o.name == name) return o;
    ADD_FAILURE() << "no op " << name;
    return g.ops.front();
  };
  EXPECT_EQ(op("mtp1.embed.tokens").attrs.tie, "embedding");
  EXPECT_EQ(op("mtp2.lm_head").attrs.tie, "lm_head");
  EXPECT_EQ(op("lm_head").attrs.tie, "lm_head");
  EXPECT_EQ(op("mtp1.loss").attrs.loss_weight, 0.05);
  EXPECT_EQ(op("loss").attrs.loss_weight, 1.0);
  EXPECT_EQ(op("mtp2.loss").mtp_depth, 2);
  EXPECT_EQ(op("loss").mtp_depth, 0);
  EXPECT_TRUE(op("mtp1.moe.experts.gate_up").expert_weights);
  EXPECT_EQ(g.tensors[op("mtp1.eh_proj.gather").outputs[0]].type.shape,
            (std::vector<int64_t>{64, 7168}));
  EXPECT_EQ(g.tensors[op("mtp1.eh_proj.scatter").outputs[0]].type.shape,
            (std::vector<int64_t>{32, 7168}));
  EXPECT_EQ(g.tensors[op("mtp1.concat").outputs[0]].type.shape, (std::vector<int64_t>{32, 14336}));
  // Depth 2's hidden-state norm reads depth 1's final norm; depth 1's reads the model's.
  EXPECT_EQ(g.tensors[op("mtp2.hnorm").inputs[0]].producer,
            &op("mtp1.final_norm") - g.ops.data());
  EXPECT_EQ(g.tensors[op("mtp1.hnorm").inputs[0]].producer, &op("final_norm") - g.ops.data());
  // The main model's LM head and loss come last, as process_mtp_loss runs them.
  EXPECT_EQ(g.ops.back().name, "loss");
  auto policy = [&](Recompute r) {
    TrainSpec u = t;
    u.recompute = r;
    return named_policy(g, u);
  };
  BlockPolicy full = policy(Recompute::kFull), selective = policy(Recompute::kSelective),
              none = policy(Recompute::kNone);
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const GraphOp& o = g.ops[i];
    const bool gather = o.kind == OpKind::kAllGather;  // re-gathered under SP in any case
    EXPECT_EQ(full.recompute[i], o.mtp_checkpointed || gather) << o.name;
    EXPECT_EQ(selective.recompute[i], (o.mtp_depth > 0 && o.attention_core) || gather) << o.name;
    EXPECT_EQ(none.recompute[i], gather) << o.name;
  }
  EXPECT_FALSE(full.recompute[&op("mtp1.embed.tokens") - g.ops.data()]);
  EXPECT_TRUE(full.recompute[&op("mtp1.eh_proj") - g.ops.data()]);
  EXPECT_TRUE(full.recompute[&op("mtp2.final_norm") - g.ops.data()]);
  EXPECT_EQ(full.name, "mtp:full+regather");
  EXPECT_EQ(none.name, "none+regather");
  EXPECT_LT(saved_set(g, full).bytes, saved_set(g, selective).bytes);
  EXPECT_LT(saved_set(g, selective).bytes, saved_set(g, none).bytes);
  // Without MTP the head is the norm, the LM head and the loss as before.
  t.mtp_layers = 0, t.recompute = Recompute::kFull;
  BlockGraph plain = build_head(m, t);
  for (const GraphOp& o : plain.ops) EXPECT_EQ(o.mtp_depth, 0) << o.name;
  EXPECT_EQ(named_policy(plain, t).name, "none+regather");
}

TEST(Graph, CheckerCatchesOutOfOrderOps) {
  TrainSpec t;
  t.seq_len = 16;
  BlockGraph g = build_layer(model("llama-2-7b"), t);
  std::swap(g.ops[1], g.ops[2]);  // qkv linear before its norm input exists
  EXPECT_TRUE(check_graph(g));
}

TEST(Graph, ShardedShapes) {
  TrainSpec t;
  t.tp = 8, t.sp = true, t.seq_len = 4096;
  BlockGraph g = build_layer(model("llama-3.1-70b"), t);
  EXPECT_EQ(g.tensors[g.hidden_in].type.shape, (std::vector<int64_t>{4096 / 8, 8192}));
  int found = 0;
  for (const GraphTensor& tensor : g.tensors) {
    if (tensor.name != "attn.qkv") continue;
    EXPECT_EQ(tensor.type.shape,
              (std::vector<int64_t>{4096, 1280}));  // (64 + 2 * 8) heads * 128 / tp 8
    ++found;
  }
  EXPECT_EQ(found, 1);
}

struct Korthikanti {
  int64_t s, b, h, a, t;
  int64_t sbh() const { return s * b * h; }
  int64_t attn() const { return 5 * a * s * s * b; }  // 5as^2b: softmax out, mask, dropout out
};

int64_t saved(const ModelSpec& m, int64_t tp, bool sp, Recompute r, int64_t s = 2048,
              int64_t b = 1) {
  TrainSpec t;
  t.tp = tp, t.sp = sp, t.recompute = r, t.seq_len = s, t.micro_batch = b;
  t.attention = AttentionImpl::kEager;
  // The paper counts what the layer's activations keep and leaves out the LayerNorms' per-row
  // statistics (8 B per token, each): the fused profile's layer.
  t.impl = Impl::kFused;
  t.tp_recompute_allgather = true;  // the paper keeps the sequence shard under SP
  BlockGraph g = build_layer(m, t);
  return saved_set(g, named_policy(g, t)).bytes;
}

// ---- implementation profiles
// The layer the check in tools/torch_check.py builds (docs/estimate.md, "Implementation profiles"): bf16,
// h 1024, 16 query and 4 KV heads of 64, ffn 2816, vocab 32000, 512 tokens x 2 sequences, tp 1.
ModelSpec check_model() {
  ModelSpec m;
  m.name = "torch-check";
  m.hidden = 1024, m.ffn = 2816, m.layers = 2, m.heads = 16, m.kv_heads = 4, m.head_dim = 64;
  m.vocab = 32000, m.max_positions = 4096;
  return m;
}

int64_t profile_saved(const ModelSpec& m, Impl impl, TrainSpec t = {}) {
  t.seq_len = 512, t.micro_batch = 2, t.impl = impl;
  BlockGraph g = build_layer(m, t);
  EXPECT_FALSE(check_graph(g)) << name_of(impl);
  return saved_set(g, named_policy(g, t)).bytes;
}

// What each profile's layer keeps beyond the fused one's: the norms' fp32 statistics (Megatron's
// apex and Transformer Engine norms, flash-attn's in nanotron: 4 B per row each) and, unfused,
// silu(gate) (T x ffn x 2 B). The totals are PyTorch's own count of nanotron's and of the fused
// layer (saved_tensors_hooks, tools/torch_check.py): 36,773,888 and 30,998,528 bytes.
TEST(Profiles, WhatEachLayerKeeps) {
  ModelSpec m = check_model();
  const int64_t T = 1024, stats = 2 * T * 4, silu = T * 2816 * 2;
  int64_t fused = profile_saved(m, Impl::kFused), megatron = profile_saved(m, Impl::kMegatron),
          nanotron = profile_saved(m, Impl::kNanotron);
  EXPECT_EQ(fused, 30'998'528);
  EXPECT_EQ(megatron - fused, stats);
  EXPECT_EQ(nanotron - fused, stats + silu);
  EXPECT_EQ(nanotron, 36'773'888);
  // LayerNorm keeps the mean too; under SP the statistics are of the local rows only.
  m.norm = Norm::kLayer;
  TrainSpec sp;
  sp.tp = 2, sp.sp = true;
  EXPECT_EQ(profile_saved(m, Impl::kMegatron, sp) - profile_saved(m, Impl::kFused, sp),
            2 * (T / 2) * 8);
}

// Hugging Face's layer in PyTorch ops, eager: each norm keeps an fp32 copy of its input, the fp32
// 1/rms, the bf16 normalized tensor and its output (4h + 4 + 2h + 2h bytes per token), but not its
// input; attention keeps q with K and V repeated to all 16 heads (3 x 1024 columns), the fp32
// softmax and its bf16 cast (b x 16 x s^2 x 6 B) and the context; the MLP 4 x ffn. PyTorch's
// count of the same layer (tools/torch_check.py) is 262,144 B more: the rotary tables, which
// every layer's RoPE keeps and which are made once per step. Under flash (sdpa after repeat_kv)
// the probabilities give way to the output's fp32 log-sum-exp.
TEST(Profiles, HuggingFaceLayer) {
  ModelSpec m = check_model();
  const int64_t T = 1024, h = 1024, probs = int64_t{2} * 16 * 512 * 512;
  const int64_t norms = 2 * T * (4 * h + 4 + 2 * h + 2 * h), mlp = T * 2816 * 2 * 4;
  TrainSpec t;
  t.attention = AttentionImpl::kEager;
  EXPECT_EQ(profile_saved(m, Impl::kHf, t), norms + T * 3072 * 2 + probs * 6 + T * h * 2 + mlp);
  EXPECT_EQ(profile_saved(m, Impl::kHf, t), 98'574'336);
  t.attention = AttentionImpl::kFlash;
  EXPECT_EQ(profile_saved(m, Impl::kHf, t),
            norms + T * 3072 * 2 + T * h * 2 + int64_t{2} * 16 * 512 * 4 + mlp);
}

// The loss: nanotron casts the logits to an fp32 copy first (a forward workspace of T x V x 4 B,
// beside the bf16 logits and the fp32 softmax); Megatron and fused work on one fp32 buffer.
TEST(Profiles, TheLossBuffers) {
  ModelSpec m = check_model();
  for (Impl impl : {Impl::kNanotron, Impl::kMegatron, Impl::kFused, Impl::kHf}) {
    TrainSpec t;
    t.seq_len = 512, t.micro_batch = 2, t.impl = impl;
    BlockGraph g = build_head(m, t);
    const GraphOp& loss = g.ops.back();
    ASSERT_EQ(loss.kind, impl == Impl::kHf ? OpKind::kLogSoftmaxLoss : OpKind::kCrossEntropy);
    std::vector<TensorType> in;
    for (int i : loss.inputs) in.push_back(g.tensors[i].type);
    int64_t ws = 0;
    for (const TensorType& w : forward_workspace(op_info(loss.kind), loss.attrs, in))
      ws += w.bytes();
    int64_t rows = 3 * 1024 * 4;  // the vocab-parallel reductions
    const int64_t logits32 = int64_t{1024} * 32000 * 4;
    EXPECT_EQ(ws, (impl == Impl::kNanotron ? logits32 : 0) + rows) << name_of(impl);
    // Hugging Face's (PyTorch's): the cast is an op of its own, whose fp32 output the loss reads
    // while the bf16 logits stay alive (its third input); its backward holds the NLL's fp32
    // gradient per logit beside the fp32 logits' gradient.
    int64_t bws = 0;
    for (const TensorType& w : op_info(loss.kind).bwd_workspace(loss.attrs, in)) bws += w.bytes();
    EXPECT_EQ(bws, impl == Impl::kHf ? logits32 : 0) << name_of(impl);
    if (impl == Impl::kHf) {
      ASSERT_EQ(loss.inputs.size(), 3u);
      EXPECT_EQ(g.tensors[loss.inputs[0]].type.bytes(), logits32);
      EXPECT_EQ(g.tensors[loss.inputs[2]].type.bytes(), logits32 / 2);
      EXPECT_EQ(g.ops[g.tensors[loss.inputs[0]].producer].kind, OpKind::kCastFp32);
    }
  }
}

class Table2 : public ::testing::TestWithParam<const char*> {};

TEST_P(Table2, NoParallelism) {
  ModelSpec m = model(GetParam());
  for (int64_t b : {1, 2}) {
    Korthikanti k{2048, b, m.hidden, m.heads, 1};
    EXPECT_EQ(saved(m, 1, false, Recompute::kNone, 2048, b),
              34 * k.sbh() + k.attn());  // sbh(34 + 5as/h)
  }
}

TEST_P(Table2, TensorParallel) {
  ModelSpec m = model(GetParam());
  Korthikanti k{2048, 1, m.hidden, m.heads, 8};
  // sbh(10 + 24/t + 5as/(ht))
  EXPECT_EQ(saved(m, 8, false, Recompute::kNone), 10 * k.sbh() + 24 * k.sbh() / 8 + k.attn() / 8);
}

TEST_P(Table2, TensorAndSequenceParallel) {
  ModelSpec m = model(GetParam());
  Korthikanti k{2048, 1, m.hidden, m.heads, 8};
  EXPECT_EQ(saved(m, 8, true, Recompute::kNone),
            (34 * k.sbh() + k.attn()) / 8);  // sbh/t (34 + 5as/h)
}

TEST_P(Table2, SelectiveRecompute) {
  ModelSpec m = model(GetParam());
  Korthikanti k{2048, 1, m.hidden, m.heads, 8};
  EXPECT_EQ(saved(m, 8, true, Recompute::kSelective), 34 * k.sbh() / 8);  // 34sbh/t
  EXPECT_EQ(saved(m, 8, false, Recompute::kSelective),
            10 * k.sbh() + 24 * k.sbh() / 8);  // sbh(10 + 24/t)
  EXPECT_EQ(saved(m, 1, false, Recompute::kSelective), 34 * k.sbh());
}

TEST_P(Table2, FullRecompute) {
  ModelSpec m = model(GetParam());
  Korthikanti k{2048, 1, m.hidden, m.heads, 8};
  EXPECT_EQ(saved(m, 1, false, Recompute::kFull), 2 * k.sbh());     // 2sbh
  EXPECT_EQ(saved(m, 8, false, Recompute::kFull), 2 * k.sbh());     // input replicated over TP
  EXPECT_EQ(saved(m, 8, true, Recompute::kFull), 2 * k.sbh() / 8);  // input kept sequence-sharded
}

INSTANTIATE_TEST_SUITE_P(GptModels, Table2,
                         ::testing::Values("gpt-22b", "gpt3-175b", "gpt-530b", "gpt-1t"),
                         testing::ParamName());

}  // namespace
}  // namespace np
