// Named recompute policies and the saved sets they imply, on llama-style layers with flash
// attention (the default) and on MoE layers.
#include <gtest/gtest.h>

#include <stdexcept>
#include <tuple>

#include "planner/graph/policy.hpp"
#include "test_util.hpp"

namespace np {
namespace {

using testing::model;

struct Case {
  BlockGraph graph;
  SavedSet saved;
  BlockPolicy policy;
};

Case layer(const ModelSpec& m, TrainSpec t) {
  BlockGraph g = build_layer(m, t);
  BlockPolicy p = named_policy(g, t);
  return {g, saved_set(g, p), p};
}

bool kept(const Case& c, const std::string& name) {
  for (size_t i = 0; i < c.graph.tensors.size(); ++i)
    if (c.graph.tensors[i].name == name) return c.saved.saved[i];
  ADD_FAILURE() << "no tensor " << name;
  return false;
}

// The fused profile's layer (norm statistics recomputed, fused SwiGLU); the other profiles' extra
// tensors are test_graph.cpp's.
TrainSpec sp8() {
  TrainSpec t;
  t.tp = 8, t.sp = true, t.seq_len = 4096, t.impl = Impl::kFused;
  return t;
}

// Llama-3.1-70B, tp 8, s = 4096, b = 1. Per token, per rank: x, x1 (8192 / 8 * 2 B = 2 KiB each),
// the two norm outputs kept as shards (2 KiB each), qkv after RoPE (1280 * 2 B), attention output
// (1024 * 2 B), logsumexp (8 heads * 4 B), gate_up (7168 * 2 B), swiglu output (3584 * 2 B).
TEST(Policy, LlamaFlashNoneWithRegather) {
  Case c = layer(model("llama-3.1-70b"), sp8());
  int64_t per_token = 4 * 2048 + 2560 + 2048 + 32 + 14336 + 7168;
  EXPECT_EQ(c.saved.bytes, 4096 * per_token);
  EXPECT_TRUE(kept(c, "attn.norm"));  // the shard, not the gathered copy
  EXPECT_FALSE(kept(c, "attn.all_gather"));
  EXPECT_EQ(c.policy.name, "none+regather");
}

// Without regather each column-parallel linear keeps the gathered input: + 2 * (8192 - 1024) * 2 B
// per token, minus the two norm shards that are then not needed.
TEST(Policy, RegatherOffKeepsGatheredInputs) {
  TrainSpec t = sp8();
  t.tp_recompute_allgather = false;
  Case off = layer(model("llama-3.1-70b"), t);
  Case on = layer(model("llama-3.1-70b"), sp8());
  EXPECT_EQ(off.saved.bytes - on.saved.bytes, 4096 * 2 * (8192 - 1024) * 2);
  EXPECT_TRUE(kept(off, "attn.all_gather"));
  EXPECT_FALSE(kept(off, "attn.norm"));
}

// Flash attention already recomputes the scores, so Megatron's selective recompute (the attention
// core) has nothing left to drop: the same saved set as none.
TEST(Policy, SelectiveIsANoOpUnderFlash) {
  TrainSpec t = sp8();
  Case none = layer(model("llama-3.1-70b"), t);
  t.recompute = Recompute::kSelective;
  Case sel = layer(model("llama-3.1-70b"), t);
  EXPECT_EQ(none.saved.bytes, sel.saved.bytes);
}

// Eager attention keeps the softmax probabilities (b * a/t * s^2 * 2 B); selective drops them and
// keeps only Q, K, V and the context.
TEST(Policy, SelectiveDropsEagerProbabilities) {
  TrainSpec t = sp8();
  t.attention = AttentionImpl::kEager;
  t.seq_len = 1024;
  Case none = layer(model("llama-3.1-8b"), t);
  t.recompute = Recompute::kSelective;
  Case sel = layer(model("llama-3.1-8b"), t);
  EXPECT_TRUE(kept(none, "attn.softmax"));
  EXPECT_FALSE(kept(sel, "attn.softmax"));
  EXPECT_TRUE(kept(sel, "attn.rope"));  // Q, K, V feed the recomputed scores
  int64_t probs = 1 * (32 / 8) * 1024 * 1024 * 2;
  int64_t flash_extra = 0;  // eager keeps no logsumexp
  EXPECT_EQ(none.saved.bytes - sel.saved.bytes, probs + flash_extra);
}

TEST(Policy, FullKeepsOnlyTheLayerInput) {
  TrainSpec t = sp8();
  t.recompute = Recompute::kFull;
  Case c = layer(model("mixtral-8x7b"), t);
  EXPECT_EQ(c.saved.bytes, 4096 / 8 * 4096 * 2);
  EXPECT_TRUE(c.saved.saved[c.graph.hidden_in]);
  EXPECT_EQ(c.policy.name, "full");
}

// MoE: every token is dispatched top_k times (T x k rows on this rank with ep = 1, whatever the
// routing).
TEST(Policy, MoeKeepsRoutedTokens) {
  TrainSpec t;
  t.seq_len = 256;
  Case c = layer(model("mixtral-8x7b"), t);
  EXPECT_TRUE(kept(c, "moe.dispatch"));
  for (size_t i = 0; i < c.graph.tensors.size(); ++i) {
    if (c.graph.tensors[i].name != "moe.dispatch") continue;
    EXPECT_EQ(c.graph.tensors[i].type.bytes(), 256 * 2 * 4096 * 2);  // tokens * top-2 * h * bf16
  }
}

// With a capacity factor every expert gets ceil(T k f / E) slots of every source rank's tokens
// (Megatron's --moe-expert-capacity-factor with --moe-pad-expert-input-to-capacity): mixtral
// (8 experts, top-2), 256 tokens: f 1.25 gives ceil(80) = 80 slots, 8 x 80 rows; f 1 gives 64,
// T x k rows as dropless. Under ep 4 this rank holds 2 experts x 4 source ranks x 80 slots, the
// same rows, and the all-to-all's other side is a buffer of that size in the dispatch's forward
// and backward and in the combine's.
TEST(Policy, MoeCapacityPadsEverySourceRanksSlots) {
  TrainSpec t;
  t.seq_len = 256;
  const int64_t h = 4096;
  auto op_of = [](const BlockGraph& g, const std::string& name) -> const GraphOp& {
    for (const GraphOp& op : g.ops)
      if (op.name == name) return op;
    throw std::runtime_error("no op " + name);
  };
  auto bytes = [](const BlockGraph& g, int tensor) { return g.tensors[tensor].type.bytes(); };
  for (auto [ep, factor, slots] :
       {std::tuple{1, 1.25, 80}, std::tuple{1, 1.0, 64}, std::tuple{4, 1.25, 80},
        std::tuple{4, 0.5, 32}}) {
    t.ep = ep, t.dp = ep, t.moe_capacity_factor = factor;
    BlockGraph g = build_layer(model("mixtral-8x7b"), t);
    const GraphOp& d = op_of(g, "moe.dispatch");
    EXPECT_EQ(d.attrs.capacity, slots);
    EXPECT_EQ(bytes(g, d.outputs[0]), 8 * slots * h * 2) << "ep " << ep << " f " << factor;
    std::vector<TensorType> in;
    for (int i : d.inputs) in.push_back(g.tensors[i].type);
    const OpInfo& info = op_info(OpKind::kMoeDispatch);
    std::vector<TensorType> fwd = forward_workspace(info, d.attrs, in),
                            bwd = info.bwd_workspace(d.attrs, in);
    ASSERT_EQ(fwd.size(), ep > 1 ? 1u : 0u);
    ASSERT_EQ(bwd.size(), fwd.size());
    if (ep > 1) {
      EXPECT_EQ(fwd[0].bytes(), 8 * slots * h * 2);
    }
    const GraphOp& c = op_of(g, "moe.combine");
    EXPECT_EQ(bytes(g, c.outputs[0]), 256 * h * 2);
    std::vector<TensorType> cin;
    for (int i : c.inputs) cin.push_back(g.tensors[i].type);
    const OpInfo& cinfo = op_info(OpKind::kMoeCombine);
    ASSERT_EQ(forward_workspace(cinfo, c.attrs, cin).size(), ep > 1 ? 1u : 0u);
    if (ep > 1) {
      EXPECT_EQ(cinfo.bwd_workspace(c.attrs, cin)[0].bytes(), 8 * slots * h * 2);
    }
  }
}

TEST(Policy, HeadAndEmbeddingNeverRecomputed) {
  TrainSpec t = sp8();
  t.recompute = Recompute::kFull;
  BlockGraph head = build_head(model("llama-3.1-70b"), t);
  BlockPolicy p = named_policy(head, t);
  for (size_t i = 0; i < head.ops.size(); ++i)
    EXPECT_EQ(p.recompute[i], head.ops[i].kind == OpKind::kAllGather) << head.ops[i].name;
  // The fp32 softmax of the vocab shard is kept for the loss backward: s * v/t * 4 B.
  EXPECT_GE(saved_set(head, p).bytes, 4096LL * (128256 / 8) * 4);
}

}  // namespace
}  // namespace np
