// The per-GPU estimate: static bytes derived by hand, the simulated peak, overhead lines, the
// fit verdict and suggestions found by estimating them.
#include <gtest/gtest.h>

#include "planner/schedule/estimate.hpp"
#include "planner/graph/graph.hpp"
#include "planner/schedule/simulate.hpp"
#include "test_util.hpp"

namespace np {
namespace {

using testing::model;

TrainSpec main_example() {  // nanoplan estimate --model llama-70b --tp 8
  TrainSpec t;
  t.tp = 8, t.sp = true;
  return t;
}

int64_t cat(const StageEstimate& s, Category c) {
  return s.bytes[static_cast<int>(c)];
}

// Llama-3.1-70B weights on one of 8 TP ranks: vocab-parallel embedding and LM head
// (128256 / 8 rows of 8192), per layer 2 norms (8192 each, replicated), qkv (8192 x 1280),
// o (1024 x 8192), gate_up (8192 x 7168), down (3584 x 8192); the final norm (8192).
TEST(Estimate, MainExampleStaticBytes) {
  Estimate e = estimate(model("llama-70b"), main_example(), {}, {.budget = 80'000'000'000});
  const int64_t table = 16032LL * 8192;
  const int64_t layer = 2 * 8192 + 8192LL * 1280 + 1024LL * 8192 + 8192LL * 7168 + 3584LL * 8192;
  const int64_t n = 2 * table + 80 * layer + 8192;
  ASSERT_EQ(e.stages.size(), 1u);
  EXPECT_EQ(cat(e.stages[0], Category::kWeight), 2 * n);
  EXPECT_EQ(cat(e.stages[0], Category::kGradient), 4 * n);
  EXPECT_EQ(cat(e.stages[0], Category::kOptimizer), 12 * n);
  EXPECT_FALSE(e.fits);  // 18 B/param x 8.8 B params alone exceed 80 GB
  EXPECT_EQ(e.parameters, 70'553'706'496);
}

TEST(Estimate, PeakIsTheSumOfItsLines) {
  Estimate e = estimate(model("llama-70b"), main_example(), {}, {});
  const StageEstimate& s = e.stages[0];
  int64_t sum = 0;
  for (int64_t b : s.bytes) sum += b;
  EXPECT_EQ(sum, s.allocator_peak);
  int64_t overhead = 0;
  for (const OverheadLine& o : s.overheads) overhead += o.bytes;
  // The runtime's lines, nanotron's MemoryBuffer and rotary tables (80 layers x 2 s head_dim),
  // the caching allocator's last: what it reserves beyond the live bytes at the peak.
  ASSERT_EQ(s.overheads.size(), 6u);
  EXPECT_EQ(s.overheads[0].name, "CUDA context");
  EXPECT_EQ(s.overheads[2].bytes, 64LL << 20);  // one communicator (tp) x 64 MiB
  EXPECT_EQ(s.overheads[3].name, "TP all-gather buffer");
  EXPECT_EQ(s.overheads[3].bytes, 2 * 4096LL * 8192);
  EXPECT_EQ(s.overheads[4].name, "RoPE cos/sin caches");
  EXPECT_EQ(s.overheads[4].bytes, 80 * 2 * 4096LL * 128);
  EXPECT_EQ(s.overheads.back().name, "allocator cache");
  EXPECT_EQ(s.peak_bytes, s.allocator_peak + overhead);
  int64_t held = 0;  // the lines inside the allocator
  for (const OverheadLine& o : s.overheads) held += o.allocator ? o.bytes : 0;
  EXPECT_EQ(s.reserved_peak, s.allocator_peak + held + s.overheads.back().bytes);
  EXPECT_EQ(s.peak_bytes, s.reserved_peak + s.overheads[0].bytes + s.overheads[2].bytes);
  EXPECT_GE(s.allocated_peak, s.allocator_peak + held);  // blocks rounded up
  EXPECT_GE(s.reserved_peak, s.allocated_peak);
  EXPECT_TRUE(s.allocator_steady);
  EXPECT_EQ(e.peak_bytes, s.peak_bytes);
  EXPECT_TRUE(e.fits);  // no budget: nothing to exceed
  EXPECT_TRUE(e.suggestions.empty());
}

// Megatron-core with Transformer Engine (--impl megatron) on Llama-3.1-8B, tp 2 with SP, two
// pipeline stages: the vocabulary padded to 128 x tp, and the framework's lines derived by hand
// from the model's sizes. TE's dummy weight gradients: one bf16 tensor per distinct weight shape,
// qkv [(4096 + 2 x 8 x 128) / 2, 4096], proj [4096, 2048], fc1 [2 x 14336 / 2, 4096],
// fc2 [4096, 7168], and on the last stage the output layer's [128256 / 2, 4096] (padded: 128256
// is already a multiple of 256). The SP all-gather buffer only where the output layer is.
TEST(Estimate, MegatronFrameworkLines) {
  TrainSpec t;
  t.tp = 2, t.sp = true, t.pp = 2, t.microbatches = 2, t.pp_schedule = PpSchedule::k1F1B;
  t.impl = Impl::kMegatron;
  const ModelSpec m = model("llama-3.1-8b");
  Estimate e = estimate(m, t, {}, {});
  ASSERT_EQ(e.stages.size(), 2u);
  auto line = [](const StageEstimate& s, const std::string& name) -> const OverheadLine* {
    for (const OverheadLine& o : s.overheads)
      if (o.name == name) return &o;
    return nullptr;
  };
  const int64_t layer = 2 * (3072LL * 4096 + 4096LL * 2048 + 14336LL * 4096 + 4096LL * 7168);
  ASSERT_NE(line(e.stages[0], "TE dummy weight gradients"), nullptr);
  EXPECT_EQ(line(e.stages[0], "TE dummy weight gradients")->bytes, layer);
  EXPECT_EQ(line(e.stages[1], "TE dummy weight gradients")->bytes, layer + 2 * 64128LL * 4096);
  EXPECT_EQ(line(e.stages[0], "SP all-gather buffer"), nullptr);
  ASSERT_NE(line(e.stages[1], "SP all-gather buffer"), nullptr);
  EXPECT_EQ(line(e.stages[1], "SP all-gather buffer")->bytes, 2 * 4096LL * 4096);
  EXPECT_EQ(line(e.stages[0], "TE cuBLAS workspace")->bytes, (32LL << 20) + 1024);
  EXPECT_EQ(line(e.stages[0], "RoPE frequency cache")->bytes, 4 * 4096LL * 128);
  RuntimeAssumptions exact;
  exact.allocator.model = AllocatorModel::kExact;
  const Estimate x = estimate(m, t, exact, {});
  for (const StageEstimate& s : e.stages) {  // allocated: the tensors and the allocator's lines
    int64_t allocator = 0, all = 0;
    for (const OverheadLine& o : s.overheads) (o.allocator ? allocator : all) += o.bytes;
    // The caching allocator's blocks: rounded, and a block's rest of at most 1 MiB kept with it.
    EXPECT_GE(s.allocated_peak, s.allocator_peak + allocator);
    EXPECT_LE(s.allocated_peak, s.reserved_peak);
    ASSERT_NE(line(s, "allocator cache"), nullptr);
    EXPECT_EQ(s.peak_bytes, s.allocator_peak + allocator + all);
    EXPECT_EQ(s.reserved_peak, s.allocator_peak + allocator + line(s, "allocator cache")->bytes);
    // Exact: one allocation per tensor, of its size.
    const StageEstimate& xs = x.stages[static_cast<size_t>(s.stage)];
    EXPECT_EQ(xs.allocated_peak, s.allocator_peak + allocator);
    EXPECT_EQ(xs.reserved_peak, xs.allocated_peak);
    EXPECT_EQ(xs.peak_bytes, s.peak_bytes - line(s, "allocator cache")->bytes);
    EXPECT_FALSE(line(s, "CUDA context")->allocator);
    EXPECT_TRUE(line(s, "cuBLAS workspaces")->allocator);
    // PyTorch's: the forward's thread and the autograd engine's device thread, 32 MiB each.
    EXPECT_EQ(line(s, "cuBLAS workspaces")->bytes, 2 * (32LL << 20));
  }
  EXPECT_EQ(e.allocated_peak_bytes,
            std::max(e.stages[0].allocated_peak, e.stages[1].allocated_peak));
  // The dataloader's bool [b, 1, s, s] mask where a batch is loaded (first and last stages).
  ASSERT_NE(line(e.stages[0], "dataloader attention mask"), nullptr);
  EXPECT_EQ(line(e.stages[0], "dataloader attention mask")->bytes, 4096LL * 4096);
  EXPECT_TRUE(line(e.stages[1], "dataloader attention mask")->allocator);
  t.pp = 3, t.microbatches = 3;  // a middle stage loads none
  Estimate three = estimate(m, t, {}, {});
  EXPECT_EQ(line(three.stages[1], "dataloader attention mask"), nullptr);
  EXPECT_NE(line(three.stages[2], "dataloader attention mask"), nullptr);
  t.pp = 2, t.microbatches = 2;
  t.dataloader_mask = false;
  EXPECT_EQ(line(estimate(m, t, {}, {}).stages[0], "dataloader attention mask"), nullptr);
  t.dataloader_mask = true;
  // Each profile its own lines: nanotron's MemoryBuffer, none under the fused profile.
  t.impl = Impl::kNanotron;
  Estimate n = estimate(m, t, {}, {});
  EXPECT_EQ(line(n.stages[1], "TE dummy weight gradients"), nullptr);
  EXPECT_NE(line(n.stages[1], "TP all-gather buffer"), nullptr);
  t.impl = Impl::kFused;
  EXPECT_EQ(estimate(m, t, {}, {}).stages[1].overheads.size(), 4u);
  // --tp-comm-overlap: Transformer Engine's userbuffers on every rank, outside PyTorch's
  // allocator: 12 bf16 [s*b/cp, h] buffers (4096 x 4096 x 2 B = 32 MiB, whole granules), the
  // communicator's region 0 (3,223,808 B, two 2 MiB granules), send_id and recv_id over the 4
  // ranks (4 + 32 x 4 ints) and 128 KiB of flags; and 3 cuBLAS workspaces in the allocator.
  t.impl = Impl::kMegatron, t.tp_comm_overlap = true;
  ASSERT_FALSE(validate_setup(m, t));
  Estimate ub = estimate(m, t, {}, {});
  for (const StageEstimate& s : ub.stages) {
    ASSERT_NE(line(s, "TE userbuffers"), nullptr);
    EXPECT_EQ(line(s, "TE userbuffers")->bytes,
              12 * (32LL << 20) + (4LL << 20) + 4 * 4 + 32 * 4 * 4 + 131072);
    EXPECT_FALSE(line(s, "TE userbuffers")->allocator);
    ASSERT_NE(line(s, "TE userbuffers cuBLAS workspace"), nullptr);
    EXPECT_EQ(line(s, "TE userbuffers cuBLAS workspace")->bytes, 3 * ((32LL << 20) + 1024));
    EXPECT_TRUE(line(s, "TE userbuffers cuBLAS workspace")->allocator);
  }
  // Device-level: the buffers add to the peak; allocated: only the workspace.
  t.tp_comm_overlap = false;
  Estimate plain = estimate(m, t, {}, {});
  EXPECT_EQ(ub.stages[0].allocated_peak - plain.stages[0].allocated_peak,
            3 * ((32LL << 20) + 1024));
  EXPECT_GE(ub.stages[0].peak_bytes - plain.stages[0].peak_bytes,
            line(ub.stages[0], "TE userbuffers")->bytes);
}

// Megatron pads the vocabulary to a multiple of 128 x tp (_vocab_size_with_padding); the other
// profiles hold it as it is.
// Without gradient-accumulation fusion (Megatron's --no-gradient-accumulation-fusion) each
// linear's backward holds its weight gradient whole in bf16 (a workspace of the weight's shape),
// the LM head's included, and Transformer Engine makes no dummy gradients. The native fused loss
// forms the logits' gradient in an fp32 buffer; Transformer Engine's loss and the unfused one do
// not.
TEST(Estimate, MegatronWithoutGradientAccumulationFusion) {
  TrainSpec t;
  t.tp = 2, t.sp = true, t.pp = 2, t.microbatches = 2, t.pp_schedule = PpSchedule::k1F1B;
  t.impl = Impl::kMegatron, t.grad_accum_fusion = false, t.loss_fusion = LossFusion::kNative;
  const ModelSpec m = model("llama-3.1-8b");
  EXPECT_FALSE(validate_setup(m, t));
  BlockGraphs g(m, t);
  int linears = 0;
  for (const BlockGraph* b : {g.layer.get(), g.head.get()})
    for (const GraphOp& op : b->ops) {
      std::vector<TensorType> in;
      for (int i : op.inputs) in.push_back(b->tensors[i].type);
      std::vector<TensorType> ws = op_info(op.kind).bwd_workspace(op.attrs, in);
      if (op.kind == OpKind::kColumnLinear || op.kind == OpKind::kRowLinear) {
        ++linears;
        ASSERT_EQ(ws.size(), 1u) << op.name;
        EXPECT_EQ(ws[0].dtype, Dtype::kBf16);
        EXPECT_EQ(ws[0].shape, op.weights[0].shape) << op.name;
      }
      if (op.kind == OpKind::kCrossEntropy) {
        ASSERT_EQ(ws.size(), 1u);
        EXPECT_EQ(ws[0].shape, (std::vector<int64_t>{4096, 128256 / 2}));
        EXPECT_EQ(ws[0].dtype, Dtype::kFp32);
      }
    }
  EXPECT_EQ(linears, 5);  // qkv, proj, fc1, fc2, the LM head
  Estimate off = estimate(m, t, {}, {});
  for (const StageEstimate& s : off.stages)
    for (const OverheadLine& o : s.overheads) EXPECT_NE(o.name, "TE dummy weight gradients");
  // The fused path's dummies and no workspaces; Transformer Engine's loss without the buffer.
  t.grad_accum_fusion = true, t.loss_fusion = LossFusion::kTe;
  BlockGraphs on(m, t);
  for (const GraphOp& op : on.layer->ops) EXPECT_FALSE(op.attrs.dense_wgrad) << op.name;
  for (const GraphOp& op : on.head->ops) EXPECT_FALSE(op.attrs.dense_wgrad || op.attrs.fp32_grad);
  // Megatron's only: another profile is told so.
  t.impl = Impl::kNanotron, t.loss_fusion = LossFusion::kNone, t.grad_accum_fusion = false;
  auto e = validate_setup(m, t);
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("--gradient-accumulation-fusion off is Megatron's"), std::string::npos);
  t.grad_accum_fusion = true, t.dataloader_mask = false;
  ASSERT_TRUE(validate_setup(m, t));
}

TEST(Estimate, MegatronPadsTheVocabulary) {
  ModelSpec m = model("llama-3.1-8b");
  TrainSpec t;
  t.tp = 8, t.impl = Impl::kMegatron;
  EXPECT_EQ(padded_vocab(m, t), 129024);  // 128256 = 125.25 x 1024
  t.tp = 2;
  EXPECT_EQ(padded_vocab(m, t), 128256);  // = 501 x 256
  m.vocab = 128257;                       // NullTokenizer's + 1 (EOD)
  EXPECT_EQ(padded_vocab(m, t), 128512);
  t.impl = Impl::kNanotron;
  EXPECT_EQ(padded_vocab(m, t), 128257);
  // The LM head holds the padded rows.
  t.impl = Impl::kMegatron, t.tp = 8;
  m.vocab = 128256;
  BlockGraph head = build_head(m, t);
  int64_t rows = 0;
  for (const GraphOp& op : head.ops)
    if (op.name == "lm_head") rows = op.weights[0].shape[0];
  EXPECT_EQ(rows, 129024 / 8);
}

TEST(Estimate, OverheadAssumptionsAreOverridable) {
  RuntimeAssumptions rt;
  rt.cuda_context_bytes = 1LL << 30;
  rt.allocator.model = AllocatorModel::kExact;
  Estimate e = estimate(model("llama-70b"), main_example(), rt, {});
  EXPECT_EQ(e.stages[0].overheads[0].bytes, 1LL << 30);
  // Exact: one allocation per tensor, nothing cached, no allocator line.
  for (const OverheadLine& o : e.stages[0].overheads) EXPECT_NE(o.name, "allocator cache");
  EXPECT_EQ(e.stages[0].reserved_peak, e.stages[0].allocated_peak);
  EXPECT_EQ(e.stages[0].allocator_steps, 0);
}

TEST(Estimate, ExplainPeakListsExactlyTheLiveBytes) {
  TrainSpec t = main_example();
  t.seq_len = 1024;
  Estimate e = estimate(model("llama-3.1-8b"), t, {}, {.explain_peak = true});
  int64_t sum = 0;
  for (const LiveTensor& l : e.stages[0].live_at_peak) sum += l.bytes;
  EXPECT_EQ(sum, e.stages[0].allocator_peak);
  EXPECT_FALSE(e.stages[0].peak_at.empty());
}

// The plain fix first: Llama-3.1-8B at tp 2, dp 4 under 60 GB fits with ZeRO-1 over the same
// replicas, which keeps the GPUs and the global batch; the ones that take more GPUs come after.
TEST(Estimate, SuggestionsTryTheSingleChangesFirst) {
  TrainSpec t;
  t.tp = 2, t.sp = true, t.dp = 4, t.microbatches = 1;
  Estimate e = estimate(model("llama-3.1-8b"), t, {}, {.budget = 60'000'000'000});
  ASSERT_FALSE(e.fits);
  ASSERT_FALSE(e.suggestions.empty());
  EXPECT_EQ(e.suggestions[0].change, "--zero 1");
  EXPECT_EQ(e.suggestions[0].setup.gpus(), t.gpus());
  bool more_gpus_after = true, seen_more = false;
  for (const Suggestion& s : e.suggestions) {
    bool more = s.setup.gpus() > t.gpus() ||
                s.setup.micro_batch * s.setup.microbatches * s.setup.dp >
                    t.micro_batch * t.microbatches * t.dp;
    if (seen_more && !more) more_gpus_after = false;
    seen_more |= more;
  }
  EXPECT_TRUE(more_gpus_after);
}

// More TP in place of DP keeps the GPUs for any dp, 6 included (tp x 2, dp 3; not tp x 4, dp 1).
TEST(Estimate, MoreTpInPlaceOfDpKeepsTheGpus) {
  TrainSpec t;
  t.dp = 6, t.zero = 0, t.microbatches = 2;
  const ModelSpec m = model("llama-3.1-8b");
  std::vector<Suggestion> s = nearest_setups(m, t, [](const TrainSpec&) {
    return std::optional<int64_t>(1);
  });
  bool seen = false;
  for (const Suggestion& x : s)
    if (x.change.rfind("--tp ", 0) == 0) {
      seen = true;
      EXPECT_EQ(x.setup.gpus(), t.gpus()) << x.change;
      EXPECT_EQ(x.setup.micro_batch * x.setup.microbatches * x.setup.dp,
                t.micro_batch * t.microbatches * t.dp)
          << x.change;
    }
  EXPECT_TRUE(seen);
}

TEST(Estimate, SuggestionsFitWhenEstimated) {
  Estimate e = estimate(model("llama-70b"), main_example(), {}, {.budget = 80'000'000'000});
  ASSERT_FALSE(e.suggestions.empty());
  for (const Suggestion& s : e.suggestions) {
    EXPECT_FALSE(validate_setup(e.model, s.setup)) << s.change;
    Estimate again =
        estimate(e.model, s.setup, {}, {.budget = 80'000'000'000, .suggestions = false});
    EXPECT_TRUE(again.fits) << s.change;
    EXPECT_EQ(again.peak_bytes, s.peak_bytes) << s.change;
    EXPECT_LE(s.peak_bytes, 80'000'000'000) << s.change;
  }
}

TEST(Estimate, VerdictFollowsTheBudget) {
  Estimate e = estimate(model("llama-3.1-8b"), main_example(), {}, {});
  Estimate at = estimate(model("llama-3.1-8b"), main_example(), {}, {.budget = e.peak_bytes});
  Estimate below =
      estimate(model("llama-3.1-8b"), main_example(), {}, {.budget = e.peak_bytes - 1});
  EXPECT_TRUE(at.fits);
  EXPECT_FALSE(below.fits);
}

TEST(Estimate, FullRecomputeShrinksActivations) {
  TrainSpec t = main_example();
  Estimate none = estimate(model("llama-70b"), t, {}, {});
  t.recompute = Recompute::kFull;
  Estimate full = estimate(model("llama-70b"), t, {}, {});
  EXPECT_LT(cat(full.stages[0], Category::kActivation),
            cat(none.stages[0], Category::kActivation) / 10);
  ASSERT_EQ(full.stages[0].layers.size(), 80u);
  EXPECT_EQ(full.stages[0].layers[0].saved_bytes, 4096LL / 8 * 8192 * 2);  // 2sbh/t
  EXPECT_EQ(full.stages[0].layers[0].policy, "full");
}

// 1F1B: stage s holds min(m, pp - s) micro-batches, so stage 0 carries the most activations.
TEST(Estimate, OneFOneBStageZeroHoldsTheMost) {
  TrainSpec t = main_example();
  t.pp = 4, t.microbatches = 8, t.pp_schedule = PpSchedule::k1F1B;
  Estimate e = estimate(model("llama-70b"), t, {}, {});
  ASSERT_EQ(e.stages.size(), 4u);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(e.stages[s].in_flight, 4 - s);
  EXPECT_GT(cat(e.stages[0], Category::kActivation), cat(e.stages[1], Category::kActivation));
  EXPECT_EQ(e.stages[2].first_rank, 2 * 8);  // rank order (pp, dp, tp)
  int covered = 0;
  for (const StageEstimate& s : e.stages) covered += s.num_layers;
  EXPECT_EQ(covered, 80);
}

}  // namespace
}  // namespace np
